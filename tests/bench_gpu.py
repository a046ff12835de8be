"""
The paper's coding setup on one GPU, measured without a download: a random-init model of
Qwen2.5-Coder-3B's config, built on the device in bf16. Not a test; CI runs the --small smoke run
(tests/test_benchmarks.py), which checks that the script works, not how fast.

    python tests/bench_gpu.py                      # a GPU: the 3B config, about 6 minutes
    python tests/bench_gpu.py --small              # anywhere: a tiny config of the same shape, seconds
    python tests/bench_gpu.py --skip-compile       # eager decoding only

It prints each result as it is measured (a timeout keeps what came before), each timing after a
warm-up run of the same call:
- greedy equality of sampler.generate with transformers' model.generate;
- decoding: tokens/s at 4, 16 and 64 rows x 256 new tokens, sampling at T = 1: transformers'
  model.generate, ours eager and --compile, against the memory bandwidth floor it computes from the
  model's bytes and the KV cache (a decode step must read both);
- --compile on 12 generate calls of 4-12 rows and 20-200 prompt tokens: the graphs it compiles;
- the top kernels of a compiled decoding run (torch.profiler; eager with --small or --skip-compile);
- the log-prob pass of Eq. 2 (forward and backward, 8 rows): time and peak memory, each group's
  prompt shared (magrpo.completion_logprobs) against every row run whole, G = 4 and 8;
- one magrpo.train_step of two LoRA agents (r = 16, G = 4) on one shared base, with its peak memory;
- full fine-tuning: resident bytes per parameter between steps and the peak during a step.
Peak memory is the CUDA allocator's; on the CPU it is not measured ("-").
"""
import argparse
import sys
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import envs  # noqa: E402
import magrpo  # noqa: E402
import models  # noqa: E402
import sampler  # noqa: E402
from bench_logprobs import random_rollout  # noqa: E402

# Qwen2.5-Coder-3B's config.json (its shape; the weights here are random).
QWEN_3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
               num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
               rope_theta=1000000.0, tie_word_embeddings=True, rms_norm_eps=1e-6)
SMALL = dict(QWEN_3B, vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
# HBM bandwidth in bytes/s, by the device's name (datasheet figures): the floor's denominator.
BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


def build(config, device, dtype):
    """A random-init Qwen2 of `config` on `device`, made there (no CPU copy of 6 GB first)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**config, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    model.generation_config.eos_token_id = 0
    return model


class Tokens:
    """A stand-in tokenizer over the model's ids: a text is its ids written as words, so any id the
    model draws decodes and encodes back. EOS is id 0, which a random model rarely draws."""
    eos_token_id = pad_token_id = 0
    chat_template = None

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[int(w) for w in text.split()] for text in texts]}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


def timed(fn, device):
    """(fn's result, seconds, peak bytes allocated during it above what was allocated before; None on the CPU)."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - before if cuda else None
    return out, seconds, peak


def prompts(vocab, count, length, seed):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(str(int(i)) for i in torch.randint(1, vocab, (length,), generator=g)) for _ in range(count)]


def greedy_equal(model, tok, vocab, new_tokens):
    """Whether our greedy tokens are transformers' (4 prompts of 16 tokens)."""
    texts = prompts(vocab, 4, 16, seed=1)
    ours = sampler.generate(model, tok, texts, 1, new_tokens, temperature=0)
    ids = torch.tensor(tok(texts)["input_ids"], device=model.device)
    theirs = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=new_tokens, pad_token_id=0, eos_token_id=0)[:, ids.shape[1]:]
    return torch.equal(ours.completion_ids[:, :theirs.shape[1]].cpu(), theirs.cpu())


def floor_tokens_per_second(model, rows, context, device):
    """Tokens/s if a decode step cost only reading the weights and the rows' KV cache at the mean
    context: the memory-bandwidth floor of decoding (None where the bandwidth is not known)."""
    name = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else ""
    bandwidth = next((b for key, b in BANDWIDTH.items() if key in name), None)
    if bandwidth is None:
        return None
    c = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = c.hidden_size // c.num_attention_heads
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 2 * rows * context  # bf16 keys, values
    return rows * bandwidth / (weights + kv)


def decoding(model, tok, vocab, rows_list, new_tokens, compile_too, device):
    """The decoding table, a row printed as it is measured: tokens/s of model.generate, ours eager and
    compiled, and the floor, per number of rows (the best of two runs after a warm-up)."""
    print(f"\n| decoding, {new_tokens} new tokens, T = 1 | model.generate tokens/s | eager tokens/s | "
          "--compile tokens/s | floor tokens/s | eager / generate | compile / floor |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    for rows in rows_list:
        texts = prompts(vocab, rows, 64, seed=rows)
        ids = torch.tensor(tok(texts)["input_ids"], device=device)
        runs = {"model.generate": lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                                         do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                                         max_new_tokens=new_tokens, pad_token_id=0,
                                                         eos_token_id=0),
                "eager": lambda: sampler.generate(model, tok, texts, 1, new_tokens, seed=0)}
        if compile_too:
            runs["compile"] = lambda: sampler.generate(model, tok, texts, 1, new_tokens, seed=0, compile=True)
        row = {"floor": floor_tokens_per_second(model, rows, 64 + new_tokens // 2, device)}
        for name, run in runs.items():
            run()  # the warm-up (and the compile)
            for _ in range(2):
                out, seconds, _ = timed(run, device)
                made = generated_tokens(out, ids.shape[1])
                row[name] = max(row.get(name, 0.0), made / seconds)
        eager_ratio = row["eager"] / row["model.generate"]
        ratio = row["compile"] / row["floor"] if row.get("compile") and row["floor"] else None
        print(f"| {rows} rows | {cell(row['model.generate'])} | {cell(row['eager'])} | "
              f"{cell(row.get('compile'))} | {cell(row['floor'])} | {eager_ratio:.2f} | {cell(ratio)} |",
              flush=True)


def generated_tokens(out, prompt_length):
    """The tokens a generate call made, up to and including each row's first EOS (id 0), either's output."""
    if isinstance(out, sampler.Rollout):
        return int(out.completion_mask.sum())
    eos = (out[:, prompt_length:] == 0).long()
    return int((eos.cumsum(-1) - eos == 0).sum())


def graph_count(model, tok, vocab):
    """The graphs --compile makes over 12 generate calls of 4-12 rows and 20-200 prompt tokens."""
    before = sampler.compiled_graphs()
    g = torch.Generator().manual_seed(3)
    for call in range(12):
        rows = int(torch.randint(4, 13, (1,), generator=g))
        length = int(torch.randint(20, 201, (1,), generator=g))
        texts = prompts(vocab, rows, length, seed=100 + call)
        sampler.generate(model, tok, texts, 1, 8, seed=call, compile=True)
    graphs = sampler.compiled_graphs() - before
    print(f"\n--compile, 12 generate calls of 4-12 rows and 20-200 prompt tokens: {graphs} new graphs",
          flush=True)


def top_kernels(model, tok, vocab, compiled, device):
    """torch.profiler's top operations of a decoding run of 16 rows x 8 new tokens, after a warm-up."""
    from torch.profiler import ProfilerActivity, profile
    texts = prompts(vocab, 16, 64, seed=5)

    def run():
        return sampler.generate(model, tok, texts, 1, 8, seed=0, compile=compiled)
    run()
    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        timed(run, device)
    print(f"\ntop operations of 8 {'compiled' if compiled else 'eager'} decode steps (16 rows), a step's "
          "share is an eighth:", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=12),
          flush=True)


def logprob_pass(model, vocab, completion_tokens, device):
    """The log-prob pass's table, a row printed as it is measured: seconds and peak bytes, shared and
    per-row, G = 4 and 8, 8 rows, each after a warm-up call."""
    print(f"\n| log-prob pass, 8 rows x {completion_tokens} tokens, prompt 256 | G | seconds | peak GiB |",
          flush=True)
    print("|---|---|---|---|", flush=True)
    for G in (4, 8):
        groups = [random_rollout(vocab, 256, G, completion_tokens, device) for _ in range(8 // G)]
        fields = [torch.cat(parts) for parts in zip(*[(r.prompt_ids, r.prompt_mask, r.completion_ids,
                                                       r.completion_mask, r.logprobs) for r in groups])]
        rows = sampler.Rollout(*fields, [], G)
        for name, fn in (("shared", magrpo.completion_logprobs), ("per-row", magrpo.row_logprobs)):
            for _ in range(2):  # the first warms up
                _, seconds, peak = timed(lambda: fn(model, rows, 1.0).sum().backward(), device)
                model.zero_grad(set_to_none=True)
            print(f"| {name} | {G} | {seconds:.3f} | {cell(gib(peak))} |", flush=True)


class VaryingEnv(envs.Env):
    """A stand-in task: each agent continues its prompt, and the reward is a hash of the joint answer,
    so rewards differ within every group and the update runs (a random model scores 0 on real tasks)."""
    name, max_reward = "stand-in", 4.0

    def __init__(self, vocab):
        self.examples = prompts(vocab, 1, 256, seed=7)

    def prompts(self, ex):
        return [ex, ex]

    def reward(self, ex, outputs):
        return float(zlib.crc32(" | ".join(outputs).encode()) % 5)


def lora_train_step(model, tok, vocab, new_tokens, device):
    """One magrpo.train_step of two LoRA agents (r = 16, G = 4) on `model` as their shared base."""
    team = []
    for i in range(2):  # Each agent is a copy of the frozen base that shares its weights.
        adapted = models.add_lora(model, models.LoRAConfig(16), seed=i)
        team.append(models.Agent(adapted, tok, models.make_optimizer(adapted, 1e-5)))
    env = VaryingEnv(vocab)
    cfg = magrpo.Config(num_generations=4, max_new_tokens=new_tokens, micro_batch_size=4)
    magrpo.train_step(team, env, env.examples, cfg, [0])  # warm-up
    (_, metrics), seconds, peak = timed(lambda: magrpo.train_step(team, env, env.examples, cfg, [1]), device)
    return {"seconds": seconds, "peak": peak, "loss_0": metrics["loss_0"]}


def full_finetune_bytes(config, device):
    """Bytes per parameter of a bf16 agent with fp32 master weights: resident between steps, and the
    peak during a backward pass and its optimizer step (CUDA only)."""
    if torch.device(device).type != "cuda":
        return None, None
    model = build(config, device, torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    optimizer = models.make_optimizer(model, 1e-5)
    ids = torch.randint(1, config["vocab_size"], (1, 64), device=device)

    def step():
        model(input_ids=ids).logits.float().mean().backward()
        optimizer.step()
        model.zero_grad(set_to_none=True)
    step()
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated() / n
    _, _, peak = timed(step, device)
    return resident, (torch.cuda.memory_allocated() + peak) / n


def cell(value, unit=""):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}{unit}"
    return f"{value}{unit}"


def gib(b):
    return None if b is None else b / 2 ** 30


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="a tiny config of the same shape: a smoke run anywhere")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--skip-compile", action="store_true", help="eager decoding only")
    args = p.parse_args()
    config = SMALL if args.small else QWEN_3B
    new_tokens = 16 if args.small else 256
    rows_list = (2, 4) if args.small else (4, 16, 64)
    compile_too = not args.skip_compile and not args.small
    dtype = torch.bfloat16 if torch.device(args.device).type == "cuda" else torch.float32
    start = time.time()
    model, tok = build(config, args.device, dtype), Tokens()
    vocab = config["vocab_size"]
    print(f"random Qwen2 of {'a small' if args.small else 'Qwen2.5-Coder-3B'} config, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:,.1f}M parameters, {dtype}, {args.device} "
          f"({torch.cuda.get_device_name(args.device) if dtype == torch.bfloat16 else 'CPU'})", flush=True)
    equal = greedy_equal(model, tok, vocab, new_tokens)
    print(f"greedy equal to model.generate: {equal}", flush=True)
    decoding(model, tok, vocab, rows_list, new_tokens, compile_too, args.device)
    if compile_too:
        graph_count(model, tok, vocab)
    top_kernels(model, tok, vocab, compile_too, args.device)
    logprob_pass(model, vocab, new_tokens, args.device)
    step = lora_train_step(model, tok, vocab, min(new_tokens, 64), args.device)
    print("\n| one train_step, 2 LoRA agents (r 16), G = 4 | seconds | peak GiB |\n|---|---|---|", flush=True)
    print(f"| shared base | {step['seconds']:.2f} | {cell(gib(step['peak']))} |", flush=True)
    del model
    resident, peak = full_finetune_bytes(config, args.device)
    print(f"\nfull fine-tuning, bytes per parameter: resident {cell(resident)}, peak during a step {cell(peak)}")
    print(f"greedy equal: {equal}; {time.time() - start:.0f} s in all")


if __name__ == "__main__":
    main()
