"""
The log-prob pass of Eq. 2, forward + backward, two ways on the same rollouts: every row run whole,
prompt and completion (per-row, magrpo.row_logprobs: how TRL's GRPOTrainer and the authors' trainer
do it), against each group's prompt run once and its KV cache shared by the group's G rows
(magrpo.completion_logprobs). Seconds, the best of a few repeats, the two alternating; then one whole
training step (magrpo.train_step) each way. Not a test (pytest does not collect bench_*.py).

    python tests/bench_logprobs.py                               # a random ~57M Qwen2, the CPU
    python tests/bench_logprobs.py --prompt-lengths 256 --groups 4 --repeats 5
    python tests/bench_logprobs.py --model PATH --lora-r 16      # a real model (e.g. SmolLM2-135M)
    python tests/bench_logprobs.py --device cuda --dtype bfloat16

--model random57m: Qwen2, hidden 768, 8 layers, 12 heads (4 key/value), MLP 2048, the byte
tokenizer (~57M parameters); prompts and completions are random tokens, every completion
--completion-tokens long. The training step: the TLDR env's built-in corpus, one prompt, two agents,
G = the first of --groups, --completion-tokens new tokens, the second of two steps (the first warms
up), with a stand-in reward that varies (see VaryingTldr).
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import envs  # noqa: E402
import magrpo  # noqa: E402
import sampler  # noqa: E402
import models  # noqa: E402


def random_57m(tok):
    import transformers as tf
    config = tf.Qwen2Config(vocab_size=len(tok), hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                            num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=4096,
                            tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = tf.Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def random_rollout(vocab, prompt_length, G, completion_tokens, device):
    """One prompt of random tokens, G completions of random tokens, as generate would return them."""
    prompt = torch.randint(0, vocab, (1, prompt_length), device=device).repeat(G, 1)
    completion = torch.randint(0, vocab, (G, completion_tokens), device=device)
    ones = torch.ones_like(completion)
    return sampler.Rollout(prompt, torch.ones_like(prompt), completion, ones, ones.float(), [], G)


def forward_backward(model, fn, rollout):
    model.zero_grad(set_to_none=True)
    lp = fn(model, rollout, 1.0)
    (lp * rollout.completion_mask).sum().backward()
    return lp.detach()


def timed(fn, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def logprob_table(model, args):
    print(f"log-prob pass, forward + backward: model={args.model} device={args.device} dtype={args.dtype} "
          f"completion tokens={args.completion_tokens} (seconds, best of {args.repeats})")
    print(f"{'prompt':>7} {'G':>3} {'per-row s':>10} {'shared s':>10} {'speed-up':>9} {'max |diff|':>11}")
    vocab = model.config.vocab_size
    for prompt_length in args.prompt_lengths:
        for G in args.groups:
            rollout = random_rollout(vocab, prompt_length, G, args.completion_tokens, args.device)
            best = {}
            for _ in range(args.repeats):  # alternating, so that a busy machine slows both alike
                for name, fn in (("per-row", magrpo.row_logprobs), ("shared", magrpo.completion_logprobs)):
                    lp, secs = timed(lambda: forward_backward(model, fn, rollout), args.device)
                    best[name] = min(best.get(name, secs), secs)
                    if name == "per-row":
                        reference = lp
            diff = (lp.float() - reference.float()).abs().max().item()
            print(f"{prompt_length:7d} {G:3d} {best['per-row']:10.3f} {best['shared']:10.3f} "
                  f"{best['per-row'] / best['shared']:8.2f}x {diff:11.2e}", flush=True)


class VaryingTldr(envs.TldrEnv):
    """TLDR with a stand-in reward that differs within every group (the detailed summary's length), so
    that the update runs: a random model's writing scores 0 on TLDR's levels, and all-zero advantages
    skip the log-prob pass altogether."""

    def rewards(self, examples, outputs):
        return [len(out[1]) / 100 for out in outputs]


def train_step_seconds(args, G):
    """One magrpo.train_step on TLDR (built-in corpus, one prompt) each way, after a warm-up step."""
    env = VaryingTldr()
    cfg = magrpo.Config(num_generations=G, max_new_tokens=args.completion_tokens, micro_batch_size=G)
    results = {}
    for name, fn in (("per-row", magrpo.row_logprobs), ("shared", magrpo.completion_logprobs)):
        agents = []
        for i in range(2):
            model, tok = load(args)
            if args.lora_r:
                model = models.add_lora(model, models.LoRAConfig(args.lora_r), seed=i)
            agents.append(models.Agent(model, tok, models.make_optimizer(model, 1e-5), args.chat_template))
        real = magrpo.completion_logprobs
        magrpo.completion_logprobs = fn
        try:
            for step in range(2):  # the first pays one-off costs
                def one_step():
                    return magrpo.train_step(agents, env, env.examples[:1], cfg, [step])
                _, secs = timed(one_step, args.device)
        finally:
            magrpo.completion_logprobs = real
        results[name] = secs
    prompt_tokens = len(tok(agents[0].format(env.prompts(env.examples[0])[1]))["input_ids"])
    print(f"one training step (tldr, 2 agents, G={G}, {args.completion_tokens} new tokens, a prompt of "
          f"~{prompt_tokens} tokens, a stand-in reward): per-row {results['per-row']:.1f} s, shared "
          f"{results['shared']:.1f} s")


def load(args):
    if args.model == "random57m":
        tok = models.tiny_tokenizer()
        return random_57m(tok).to(args.device, models.DTYPES[args.dtype]), tok
    return models.load_model(args.model, args.device, args.dtype)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="random57m")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--groups", type=int, nargs="+", default=[4, 8], help="G values")
    p.add_argument("--completion-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--lora-r", type=int, default=0, help="the training step's agents as LoRA adapters")
    p.add_argument("--chat-template", action="store_true", help="the training step's prompts")
    p.add_argument("--no-train-step", action="store_true")
    args = p.parse_args()
    model, _ = load(args)
    if args.lora_r:
        model = models.add_lora(model, models.LoRAConfig(args.lora_r))
    logprob_table(model, args)
    if not args.no_train_step:
        train_step_seconds(args, args.groups[0])


if __name__ == "__main__":
    main()
