"""
Sampler throughput: magrpo.generate against transformers' model.generate, same prompts, same
sampling settings, tokens per second. Not a test (pytest does not collect bench_*.py).

    python tests/bench_generate.py                                   # tiny random model, CPU
    python tests/bench_generate.py --model Qwen/Qwen2.5-Coder-3B --device cuda --dtype bfloat16 \
        --prompts 8 --num-generations 4 --max-new-tokens 256
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import magrpo  # noqa: E402
import models  # noqa: E402


def timed(fn, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    model, tok = models.load_model(args.model, args.device, args.dtype)
    model.eval()
    prompts = [f"def function_{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n" * (1 + i % 3) for i in range(args.prompts)]
    G, T = args.num_generations, args.max_new_tokens
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(args.device)

    def ours():
        return magrpo.generate(model, tok, prompts, G, T, temperature=1.0, seed=0)

    @torch.no_grad()
    def theirs():
        return model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                              max_new_tokens=T, num_return_sequences=G, pad_token_id=tok.pad_token_id)

    ours(), theirs()  # warm-up
    rows = []
    for name, fn in (("magrpo.generate", ours), ("model.generate", theirs)):
        best_tps = 0.0
        for _ in range(args.repeats):
            out, secs = timed(fn, args.device)
            if name == "magrpo.generate":
                tokens = int(out.completion_mask.sum())
            else:  # count up to and including the first EOS of each row, as ours does
                gen = out[:, enc["input_ids"].shape[1]:]
                eos = torch.isin(gen, torch.tensor(magrpo.eos_token_ids(model, tok), device=gen.device))
                before = eos.long().cumsum(-1) - eos.long() == 0
                tokens = int(before.sum())
            best_tps = max(best_tps, tokens / secs)
        rows.append((name, best_tps))
    print(f"model={args.model} device={args.device} dtype={args.dtype} prompts={args.prompts} G={G} max_new_tokens={T}")
    for name, tps in rows:
        print(f"{name:16s} {tps:10.1f} tokens/s (best of {args.repeats})")
    print(f"ratio magrpo/model.generate: {rows[0][1] / rows[1][1]:.2f}")


if __name__ == "__main__":
    main()
