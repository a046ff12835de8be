"""
Sampler throughput: sampler.generate against transformers' model.generate, same prompts, same
sampling settings, tokens per second (the best of a few repeats, the two alternating). Not a test.

    python tests/bench_generate.py                                   # a random ~100M Qwen2, CPU
    python tests/bench_generate.py --temperature 0                   # greedy (eval, expert reviews)
    python tests/bench_generate.py --lengths ragged                  # rows ending at different lengths
    python tests/bench_generate.py --model tiny                      # the demo's tiny model
    python tests/bench_generate.py --model Qwen/Qwen2.5-Coder-3B --device cuda --dtype bfloat16 \
        --prompts 8 --num-generations 4 --max-new-tokens 256

--model random100m: Qwen2, hidden 768, 12 layers, 12 heads (4 key/value), MLP 2048, the byte tokenizer
(~87M parameters), untied output layer. --lengths fixed: EOS can't be drawn (its output row is 0, the
others are sharpened), so every row runs max_new_tokens; ragged: EOS gets a logit that ends a row after
~max_new_tokens / 4 tokens on average, so rows finish at different lengths.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import magrpo  # noqa: E402
import sampler  # noqa: E402
import models  # noqa: E402


def random_100m(tok, lengths, max_new_tokens, seed=0):
    import transformers as tf
    config = tf.Qwen2Config(vocab_size=len(tok), hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                            num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=4096,
                            tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = tf.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        head = model.lm_head.weight
        head.mul_(20.0)  # sharp logits: sampling is decisive, as a trained model's
        head[tok.eos_token_id] = 0.0  # EOS's logit 0 while the others spread widely: never drawn
        if lengths == "ragged":  # EOS drawn with probability 4 / max_new_tokens at every step
            model.lm_head.register_forward_hook(lambda m, i, o: ragged(o, tok.eos_token_id, max_new_tokens))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def ragged(logits, eos, max_new_tokens):
    """Lift EOS to the log-probability log(4 / max_new_tokens) of the softmax it belongs to."""
    lse = torch.logsumexp(logits.float(), -1)
    logits[..., eos] = (lse + torch.log(torch.tensor(4.0 / max_new_tokens))).to(logits.dtype)
    return logits


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
    p.add_argument("--model", default="random100m")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--lengths", default="fixed", help="random100m: fixed or ragged")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    G, T = (args.num_generations if args.temperature > 0 else 1), args.max_new_tokens
    if args.model == "random100m":
        tok = models.tiny_tokenizer()
        model = random_100m(tok, args.lengths, T).to(args.device, models.DTYPES[args.dtype])
    else:
        model, tok = models.load_model(args.model, args.device, args.dtype)
    prompts = [f"def function_{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n" * (1 + i % 3) for i in range(args.prompts)]
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(args.device)
    sampling = dict(do_sample=True, temperature=args.temperature, top_p=1.0, top_k=0) if args.temperature > 0 \
        else dict(do_sample=False)

    def ours():
        return sampler.generate(model, tok, prompts, G, T, temperature=args.temperature, seed=0)

    @torch.no_grad()
    def theirs():
        return model.generate(**enc, **sampling, max_new_tokens=T, num_return_sequences=G,
                              pad_token_id=tok.pad_token_id)

    def tokens_of(name, out):
        if name == "sampler.generate":
            return int(out.completion_mask.sum())
        gen = out[:, enc["input_ids"].shape[1]:]  # up to and including the first EOS of each row, as ours
        eos = torch.isin(gen, torch.tensor(sampler.eos_token_ids(model, tok), device=gen.device)).long()
        return int((eos.cumsum(-1) - eos == 0).sum())

    ours(), theirs()  # warm-up
    best = {"sampler.generate": 0.0, "model.generate": 0.0}
    for _ in range(args.repeats):  # alternating, so that a busy machine slows both alike
        for name, fn in (("sampler.generate", ours), ("model.generate", theirs)):
            out, secs = timed(fn, args.device)
            best[name] = max(best[name], tokens_of(name, out) / secs)
    print(f"model={args.model} lengths={args.lengths} device={args.device} dtype={args.dtype} "
          f"prompts={args.prompts} G={G} max_new_tokens={T} temperature={args.temperature}")
    for name, tps in best.items():
        print(f"{name:16s} {tps:10.1f} tokens/s (best of {args.repeats})")
    print(f"ratio sampler/model.generate: {best['sampler.generate'] / best['model.generate']:.2f}")


if __name__ == "__main__":
    main()
