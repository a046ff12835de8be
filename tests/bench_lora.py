"""
Memory of n agents: LoRA adapters on one shared frozen base against full fine-tuning, for 1, 2 and 4
agents. Not a test (pytest does not collect bench_*.py).

    python tests/bench_lora.py                        # ~60M-parameter random Qwen2, CPU, a few minutes
    python tests/bench_lora.py --r 8 --layers 4
    python tests/bench_lora.py --estimate-3b           # and two Qwen2.5-Coder-3B agents on one GPU

Each configuration runs in a fresh subprocess (so peaks do not mix): it builds the agents, then
every agent takes one MAGRPO update (train_step's: the log-prob pass, Eq. 2's backward and one AdamW
step) on a synthetic rollout of 8 rows. It reports
  - resident:  the bytes of every distinct tensor storage the agents hold after the step (weights,
               AdamW moments: what stays in memory from step to step), counted from the tensors;
  - peak RSS:  the process's peak resident memory (getrusage ru_maxrss) minus its resident memory
               after the imports, before any model: the weights, the optimizer state, and the
               transient gradients and activations of the step.
"""
import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import magrpo  # noqa: E402
import sampler  # noqa: E402
import models  # noqa: E402
import train  # noqa: E402
from conftest import update_on  # noqa: E402

MB = 2 ** 20


def rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports kilobytes


def resident_bytes(agents):
    """Distinct storages of the agents' parameters, buffers and optimizer state (shared ones once)."""
    seen = {}
    tensors = []
    for a in agents:
        tensors += list(a.model.parameters()) + list(a.model.buffers())
        tensors += [t for state in a.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    for t in tensors:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def child(args):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    tok = models.tiny_tokenizer()  # the update never decodes: any tokenizer does
    before = rss_bytes()
    if args.mode == "lora":
        base = Qwen2ForCausalLM(config).eval()
        nets = [models.add_lora(base, models.LoRAConfig(args.r), seed=i) for i in range(args.agents)]
    else:
        nets = [Qwen2ForCausalLM(config).eval() for _ in range(args.agents)]
    agents = [models.Agent(m, tok, models.make_optimizer(m, 1e-5)) for m in nets]
    g = torch.Generator().manual_seed(1)
    rows, P, T = 8, args.prompt_len, args.completion_len
    rollout = sampler.Rollout(torch.randint(0, args.vocab, (rows, P), generator=g), torch.ones(rows, P, dtype=torch.long),
                             torch.randint(0, args.vocab, (rows, T), generator=g), torch.ones(rows, T, dtype=torch.long),
                             torch.zeros(rows, T), [], 4)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)
    cfg = magrpo.Config(micro_batch_size=4)
    t0 = time.perf_counter()
    for agent in agents:
        out = update_on(agent, [(rollout, adv)], cfg)
        assert out["skipped"] == 0
    seconds = (time.perf_counter() - t0) / len(agents)
    params = sum(p.numel() for p in nets[0].parameters())
    trainable = sum(p.numel() for p in nets[0].parameters() if p.requires_grad)
    print(json.dumps({"mode": args.mode, "agents": args.agents, "params": params, "trainable": trainable,
                      "resident": resident_bytes(agents), "peak": rss_bytes() - before, "seconds": seconds}))


# Qwen2.5-Coder-3B's shapes (its config.json): 36 layers, hidden 2048, MLP 11008, 16 query and 2 KV heads.
QWEN25_CODER_3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True,
                       max_position_embeddings=32768)
GB = 1e9


def saved_for_backward(model, rollout):
    """Bytes that autograd keeps for the backward pass of completion_logprobs + policy_loss: the
    activations (parameters excluded), each storage once."""
    skip, seen = {p.untyped_storage().data_ptr() for p in model.parameters()}, {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp = magrpo.completion_logprobs(model, rollout)
        magrpo.policy_loss(lp, rollout.completion_mask, torch.ones(len(rollout)))
    return sum(seen.values())


def estimate_3b(args):
    """Two Qwen2.5-Coder-3B agents on one GPU, from bytes per parameter (parameters counted on the
    meta device, no weights) and activation bytes per token per layer, measured here on the CPU in
    bf16 with 1 and 2 layers of the 3B's shapes (random weights: memory does not depend on them)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    with torch.device("meta"):
        full = Qwen2ForCausalLM(Qwen2Config(**QWEN25_CODER_3B))
    n = sum(p.numel() for p in full.parameters())
    k = sum(p.numel() for p in models.add_lora(full, models.LoRAConfig(args.r)).parameters() if p.requires_grad)
    rows, P, T = 2, 64, 64
    g = torch.Generator().manual_seed(0)
    rollout = sampler.Rollout(torch.randint(0, 150000, (rows, P), generator=g), torch.ones(rows, P, dtype=torch.long),
                             torch.randint(0, 150000, (rows, T), generator=g), torch.ones(rows, T, dtype=torch.long),
                             torch.zeros(rows, T), [], 2)
    saved = {}
    for layers in (1, 2):
        torch.manual_seed(0)
        config = Qwen2Config(**{**QWEN25_CODER_3B, "num_hidden_layers": layers})
        base = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
        saved[layers] = saved_for_backward(models.add_lora(base, models.LoRAConfig(args.r)), rollout)
    per_token_layer = (saved[2] - saved[1]) / (rows * (P + T))
    per_position = (saved[1] - per_token_layer * rows * (P + T)) / (rows * (T + 1))  # mostly fp32 logits
    prompt, new = args.est_prompt_len, args.est_new_tokens
    lora = 2 * n + 2 * 16 * k  # one bf16 base; per agent fp32 adapter + grad + AdamW's 2 moments
    fft = 2 * 16 * n           # per agent bf16 weights + bf16 grads + fp32 master + AdamW: 16 bytes/param
    print(f"\nEstimate (not a GPU measurement): two Qwen2.5-Coder-3B agents ({n / 1e9:.2f}B parameters), bf16,")
    print(f"LoRA r={args.r} on all 7 projections: {k / 1e6:.1f}M adapter parameters per agent "
          f"({16 * k / GB:.2f} GB with grads and AdamW: 16 bytes each)")
    print(f"  weights + optimizer: LoRA {lora / GB:.1f} GB (one base at 2 bytes/param + 2 adapters), "
          f"full fine-tuning {fft / GB:.1f} GB (16 bytes/param per agent)")
    print(f"  activations kept for backward, measured on the CPU with the 3B's shapes in bf16: "
          f"{per_token_layer / 1024:.0f} KiB per token per layer, {per_position / 1024:.0f} KiB per completion position (logits)")
    for mb in (4, 8):  # the paper's G = 4 with one prompt per step is 4 rows; --micro-batch-size caps it (8)
        acts = per_token_layer * mb * (prompt + new) * QWEN25_CODER_3B["num_hidden_layers"] + per_position * mb * (new + 1)
        print(f"  a micro-batch of {mb} rows x ({prompt} prompt + {new} new tokens): activations {acts / GB:.1f} GB; "
              f"total LoRA ~{(lora + acts) / GB:.0f} GB, full fine-tuning ~{(fft + acts) / GB:.0f} GB")
    print("  (agents update one after the other: one micro-batch's activations at a time; add a few GB for the "
          "CUDA context and the allocator's slack)")

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--counts", default="1,2,4")
    p.add_argument("--estimate-3b", action="store_true", help="also estimate two Qwen2.5-Coder-3B agents on one "
                   "GPU (--r, --est-prompt-len, --est-new-tokens; ~1 min of CPU)")
    p.add_argument("--est-prompt-len", type=int, default=512)
    p.add_argument("--est-new-tokens", type=int, default=256)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="lora", help=argparse.SUPPRESS)
    p.add_argument("--agents", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    shape = [x for k in ("r", "hidden", "intermediate", "layers", "heads", "kv_heads", "vocab", "prompt_len",
                         "completion_len") for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]
    results = {}
    for n in [int(c) for c in args.counts.split(",")]:
        for mode in ("full", "lora"):
            out = subprocess.run([sys.executable, __file__, "--child", "--mode", mode, "--agents", str(n), *shape],
                                 capture_output=True, text=True, check=True)
            results[mode, n] = json.loads(out.stdout.strip().splitlines()[-1])
    first = results["full", int(args.counts.split(",")[0])]
    print(f"random Qwen2 ({first['params'] / 1e6:.1f}M parameters, fp32, AdamW), LoRA r={args.r} on "
          f"{','.join(models.LORA_TARGETS)}: {results['lora', int(args.counts.split(',')[0])]['trainable'] / 1e6:.2f}M "
          f"trainable parameters per agent ({100 * results['lora', int(args.counts.split(',')[0])]['trainable'] / first['params']:.1f}%)")
    print(f"{'agents':>6} | {'full: resident':>14} {'peak RSS':>9} {'s/step':>7} | {'LoRA: resident':>14} {'peak RSS':>9} "
          f"{'s/step':>7} | {'LoRA/full: resident':>19} {'peak':>5}")
    for n in [int(c) for c in args.counts.split(",")]:
        f, lo = results["full", n], results["lora", n]
        print(f"{n:>6} | {f['resident'] / MB:>11.0f} MB {f['peak'] / MB:>6.0f} MB {f['seconds']:>7.2f} | "
              f"{lo['resident'] / MB:>11.0f} MB {lo['peak'] / MB:>6.0f} MB {lo['seconds']:>7.2f} | "
              f"{lo['resident'] / f['resident']:>19.3f} {lo['peak'] / f['peak']:>5.2f}")
    counts = [int(c) for c in args.counts.split(",")]
    if len(counts) > 1:
        a, b = counts[0], counts[-1]
        for mode in ("full", "lora"):
            extra = (results[mode, b]["resident"] - results[mode, a]["resident"]) / (b - a)
            peak = (results[mode, b]["peak"] - results[mode, a]["peak"]) / (b - a)
            print(f"each extra agent ({mode}): {extra / MB:.1f} MB resident, {peak / MB:.1f} MB peak RSS")
    if args.estimate_3b:
        estimate_3b(args)


if __name__ == "__main__":
    main()
