"""Tests of the sampler (sampler.py), one function at a time, each against an independent reference:
softmax by hand and by counting, attention by hand, transformers' own generate, a plain forward pass.
`pytest -k NAME` runs a function's tests (sample_token, decode_step, cached_attention, generate,
row_uniforms, mix_seed). CPU, tiny random models."""
import functools
import math

import pytest
import torch

import models
import sampler
from conftest import build, reference_logprobs
from sampler import generate, sample_token

PROMPTS = ["def add(a, b):", "Hi", "The quick brown fox jumps", "x"]  # ragged: left padding matters


def hf_greedy(model, tok, prompts, max_new_tokens):
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return out[:, enc["input_ids"].shape[1]:]


def total_variation(freq, probs):
    return 0.5 * (freq - probs).abs().sum().item()

# -----------------------------------------------------------------------------
# sample_token and the seeded uniforms


def expected_draws(logits, uniforms, temperature=1.0, top_p=1.0, top_k=0, sorted_order=False,
                   top_p_first=False):
    """The tokens sample_token must draw, worked out in plain Python: p = softmax(logits / T); the
    top_k most likely kept (0: all), renormalised; then the nucleus, the most likely tokens while the
    mass before them is below top_p, renormalised; then the first token, in vocabulary order, whose
    cumulative probability exceeds u. sorted_order and top_p_first give two wrong answers' draws,
    which the failure messages name."""
    z = [x / temperature for x in logits]
    e = [math.exp(x - max(z)) for x in z]
    p = [x / sum(e) for x in e]
    likely = sorted(range(len(p)), key=lambda i: -p[i])  # no ties in the cases below

    def top_k_cut(p):
        kept = set(likely[:top_k]) if 0 < top_k < len(p) else set(range(len(p)))
        return [p[i] if i in kept else 0.0 for i in range(len(p))]

    def nucleus(p):
        kept, before = set(), 0.0
        for i in likely:
            if before < top_p:
                kept.add(i)
            before += p[i]
        return [p[i] if i in kept else 0.0 for i in range(len(p))]

    for cut in ((nucleus, top_k_cut) if top_p_first else (top_k_cut, nucleus)):
        p = cut(p) if top_p < 1.0 or cut is top_k_cut else p
        p = [x / sum(p) for x in p]
    order = likely if sorted_order else range(len(p))
    draws = []
    for u in uniforms:
        total, drawn = 0.0, None
        for i in order:
            total += p[i]
            if drawn is None and total > u:
                drawn = i
        draws.append(drawn)
    return draws, p


# Probabilities out of vocabulary order (a cumulative sum in sorted order draws other tokens), and
# uniform numbers away from every boundary of the cumulative sums.
PROBS = [0.05, 0.20, 0.12, 0.30, 0.25, 0.08]
UNIFORMS = [0.02, 0.13, 0.31, 0.44, 0.58, 0.69, 0.86, 0.98]


@pytest.mark.parametrize("temperature, top_p, top_k", [
    (1.0, 1.0, 0), (0.5, 1.0, 0), (1.0, 1.0, 3), (1.0, 0.8, 0), (1.0, 0.6, 3)])
def test_sample_token_draws_the_inverse_cdf_in_vocabulary_order(temperature, top_p, top_k):
    """For given uniform numbers the drawn tokens are fixed: a student's seeded run then reproduces the
    reference's exactly. Together, top_k cuts first and top_p then cuts the renormalised rest."""
    logits = torch.log(torch.tensor(PROBS)).repeat(len(UNIFORMS), 1)
    u = torch.tensor(UNIFORMS, dtype=torch.float64)
    z = logits[0].tolist()
    want, kept = expected_draws(z, UNIFORMS, temperature, top_p, top_k)
    # Wrong answers and their draws: the message names the one a failure matches.
    wrong = {"a cumulative sum in sorted order (most likely first), not in vocabulary order":
             expected_draws(z, UNIFORMS, temperature, top_p, top_k, sorted_order=True)[0],
             "top_p cut before top_k (top_k cuts first, top_p the renormalised rest)":
             expected_draws(z, UNIFORMS, temperature, top_p, top_k, top_p_first=True)[0],
             "the logits not divided by the temperature": expected_draws(z, UNIFORMS, 1.0, top_p, top_k)[0]}
    assert any(draws != want for draws in wrong.values()), "the case must tell a wrong answer apart"
    got = sample_token(logits.clone(), temperature, top_p, top_k, uniform=u.clone())
    if not isinstance(got, torch.Tensor) or got.shape != (len(UNIFORMS),) or got.dtype != torch.long:
        what = f"{got.dtype} {list(got.shape)}" if isinstance(got, torch.Tensor) else type(got).__name__
        pytest.fail(f"sample_token returned {what}; want a long tensor [rows] = [{len(UNIFORMS)}], one token "
                    "id per row", pytrace=False)
    got = got.tolist()
    if got == want:
        return
    lines = [f"sample_token(logits, temperature={temperature}, top_p={top_p}, top_k={top_k}, uniform=u) drew "
             f"{got}; want {want}",
             f"softmax(logits) {PROBS}; at the temperature, cut and renormalised "
             f"{[round(x, 3) for x in kept]}; u {UNIFORMS}",
             "the token is the first, in vocabulary order, whose cumulative kept probability exceeds u "
             "(times the kept mass, if not renormalised)"]
    for words, draws in wrong.items():
        if got == draws and draws != want:
            lines.append(f"yours are the draws of {words}: a seeded run would draw other tokens than the "
                         "reference")
    pytest.fail("\n".join(lines), pytrace=False)


def test_sample_token_inverse_cdf_by_hand():
    """The first token whose cumulative probability exceeds u: probs (0.5, 0.3, 0.2)."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(5, 1)
    u = torch.tensor([0.0, 0.49, 0.51, 0.79, 0.81], dtype=torch.float64)
    assert sample_token(logits, 1.0, uniform=u).tolist() == [0, 0, 1, 1, 2]


def test_sample_token_follows_softmax_at_the_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).repeat(40000, 1)
    torch.manual_seed(0)
    for T in (1.5, 0.5):
        freq = torch.bincount(sample_token(logits, T), minlength=6).float() / 40000
        assert total_variation(freq, torch.softmax(logits[0] / T, -1)) < 0.01, T
    assert total_variation(freq, torch.softmax(logits[0], -1)) > 0.05  # T = 0.5 is not T = 1


def test_sample_token_top_p_keeps_the_nucleus():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).repeat(40000, 1)
    p = torch.softmax(logits[0], -1)  # [0.61, 0.22, 0.14, 0.08, ...] roughly
    top_p = float(p[0] + p[1]) + 1e-3  # the smallest prefix reaching it needs the 3rd token too
    torch.manual_seed(1)
    s = sample_token(logits, 1.0, top_p)
    assert set(s.tolist()) == {0, 1, 2}
    kept = p[:3] / p[:3].sum()
    assert torch.allclose(torch.bincount(s, minlength=6)[:3].float() / 40000, kept, atol=0.01)
    assert set(sample_token(logits, 1.0, 0.3).tolist()) == {0}


def test_sample_token_top_k_and_greedy():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).repeat(20000, 1)
    torch.manual_seed(2)
    s = sample_token(logits, 1.0, top_k=2)
    assert set(s.tolist()) == {1, 3}
    want = torch.softmax(torch.tensor([3.0, 2.0]), -1)
    assert torch.allclose(torch.bincount(s, minlength=4)[[1, 3]].float() / 20000, want, atol=0.01)
    assert sample_token(logits[:2], 0).tolist() == [1, 1]


class Float64Watch:
    """The largest float64 tensor that the operations of a block make (a TorchDispatchMode)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        watch = self
        self.largest = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                        watch.largest = max(watch.largest, t.numel())
                return out
        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def test_sampling_draws_as_one_float64_cumsum_without_a_float64_rows_by_vocab_tensor():
    """sample_token's inverse cdf (its test's name leaves sample_token out: an answer in float64 is right
    too). A vocabulary of several blocks (sampler.BLOCK), one of them and some scattered tokens of
    probability 0: the two-level inverse cdf draws the tokens that one float64 cumulative sum over the
    whole vocabulary draws, and makes no float64 tensor as large as a quarter of [rows, vocab]."""
    rows, vocab, T = 400, 6 * sampler.BLOCK + 77, 0.8
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g) * 3
    logits[:, sampler.BLOCK:2 * sampler.BLOCK] = -math.inf  # a whole block never drawn
    logits[:, ::7] = -math.inf
    u = sampler.row_uniforms(torch.arange(rows), 0)
    with Float64Watch() as watch:
        got = sample_token(logits, T, uniform=u)
    assert watch.largest < rows * vocab / 4, f"a float64 tensor of {watch.largest} elements"
    cdf = torch.softmax(logits / T, -1).double().cumsum(-1)
    want = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).squeeze(-1)
    assert torch.equal(got, want)
    assert len(set(got.tolist())) > rows / 2 and not (got % 7 == 0).any()


def test_row_uniforms_are_uniform_and_keyed():
    keys = torch.arange(20000)
    u = sampler.row_uniforms(keys, 3)
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    hist = torch.histc(u.float(), 10, 0, 1) / 20000
    assert (hist - 0.1).abs().max() < 0.01
    assert torch.equal(sampler.row_uniforms(keys[[5, 7]], 3), u[[5, 7]])  # a row's number is its own
    assert not torch.equal(sampler.row_uniforms(keys, 4), u)


def test_mix_seed_is_a_deterministic_hash():
    assert sampler.mix_seed(1, 2, 3) == sampler.mix_seed(1, 2, 3)
    seen = {sampler.mix_seed(a, b) for a in range(30) for b in range(30)}
    assert len(seen) == 900 and all(0 <= s < 2 ** 63 for s in seen)
    assert sampler.mix_seed(1, 2) != sampler.mix_seed(2, 1)

# -----------------------------------------------------------------------------
# decode_step: one token for every running row, from the cache, against a plain forward pass


def decode_step_mismatch(logits, refs, grew, padded, arch, step):
    """None when decode_step's logits are the plain forward passes' (`refs`, one per row); else which
    rows differ, by how much, and what that pattern usually means. grew: whether the cache grew by one
    token; padded: which rows' prompts are left-padded."""
    rows, vocab = refs.shape
    tensor = isinstance(logits, torch.Tensor)
    if not tensor or list(logits.shape) != [rows, vocab] or logits.dtype != torch.float32:
        what = f"{logits.dtype} {list(logits.shape)}" if tensor else type(logits).__name__
        return f"decode_step ({arch}) returned {what}; want float32 logits [rows, vocab] = [{rows}, {vocab}]"
    diff = (logits.detach() - refs).abs().amax(-1)
    wrong = [r for r in range(rows) if diff[r] > 1e-4]
    if not wrong:
        return None
    lines = [f"decode_step ({arch}), decode step {step}: the next-token logits of rows {wrong} of {rows} "
             f"differ from a plain forward pass of the row alone, unpadded (max |diff| {diff.max():.3g}, "
             "tolerance 1e-4)"]
    if not grew:
        lines.append("the cache did not grow by the new token: the model did not see the cache of the "
                     "earlier tokens (pass it as sampler.forward_kwargs(model, cache) does)")
    elif set(wrong) <= {r for r in range(rows) if padded[r]}:
        lines.append("only rows whose prompt is left-padded differ: pass the attention mask (0 on the "
                     "padding) and each row's own position id")
    return "\n".join(lines)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_decode_step_matches_a_plain_forward_pass(tok, arch):
    """Ragged prompts prefilled into a cache, then three decode steps with chosen tokens: each row's
    next-token logits equal a plain forward pass over that row alone, unpadded."""
    from transformers import DynamicCache
    model = build(tok, arch, seed=2)
    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    ids, mask = sampler.left_pad(rows, tok.pad_token_id, "cpu")
    padded = (mask == 0).any(-1).tolist()
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=sampler.positions_from_mask(mask),
              **sampler.forward_kwargs(model, cache))
        positions = mask.sum(-1)
        for step, text in enumerate(["ab", "c ", "d!"]):
            tokens = torch.tensor(tok(text, add_special_tokens=False)["input_ids"][:1] * len(rows))
            tokens = tokens + torch.arange(len(rows))  # a different token per row
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            cached = cache.get_seq_length()
            logits = sampler.decode_step(model, cache, tokens, mask, positions)
            grew = cache.get_seq_length() == cached + 1
            positions = positions + 1
            for r in range(len(rows)):
                rows[r] = rows[r] + [int(tokens[r])]
            refs = torch.stack([model(input_ids=torch.tensor([row])).logits[0, -1].float() for row in rows])
            why = decode_step_mismatch(logits, refs, grew, padded, arch, step)
            if why:
                pytest.fail(why, pytrace=False)


# -----------------------------------------------------------------------------
# cached_attention: one layer's attention on generate's own KV cache, against attention by hand


def attention_by_hand(query, keys, values, mask, scale, grouping="repeat_interleave"):
    """softmax(q K^T * scale + mask) V with explicit matmuls over the whole cache. Grouped-query
    attention: query head h reads KV head h // (heads / KV heads), each KV head repeated for its
    adjacent query heads (repeat_interleave); grouping="repeat" gives a wrong answer's h % KV heads.
    query [rows, heads, 1, dim]; keys, values [rows, KV heads, positions, dim] -> [rows, 1, heads, dim]"""
    group = query.shape[1] // keys.shape[1]
    if grouping == "repeat_interleave":
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    else:
        keys, values = keys.repeat(1, group, 1, 1), values.repeat(1, group, 1, 1)
    scores = query @ keys.transpose(-1, -2) * scale + mask
    return (torch.softmax(scores, dim=-1) @ values).transpose(1, 2)


def attention_case(heads, kv_heads):
    """A decode step's inputs for one layer: 3 rows and a cache of 8 positions, the prompt's at 0-4
    (row 0 left-padded by two, row 2 by one), the new token's at slot 5, two free ones after it. The
    padding, the free positions and slot itself hold random values before the write: reading any of
    them changes the output. -> (query, key, value, keys, values, slot, mask)"""
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    rows, positions, dim, slot = 3, 8, 8, 5
    query = torch.randn(rows, heads, 1, dim, generator=g)
    key = torch.randn(rows, kv_heads, 1, dim, generator=g)
    value = torch.randn(rows, kv_heads, 1, dim, generator=g)
    keys = torch.randn(rows, kv_heads, positions, dim, generator=g)
    values = torch.randn(rows, kv_heads, positions, dim, generator=g)
    mask = torch.full((rows, 1, 1, positions), -math.inf)
    mask[..., :slot + 1] = 0.0
    mask[0, ..., :2] = -math.inf
    mask[2, ..., :1] = -math.inf
    return query, key, value, keys, values, torch.tensor([slot]), mask


def cache_mistake(name, new, before, after, slot):
    """None if the cache `after` holds the new token's `name` (key or value) at slot and is `before`
    elsewhere; else what differs."""
    written = (after != before).any(-1).any(1).any(0).nonzero().flatten().tolist()  # over rows and heads
    if not written:
        return (f"the new token's {name} was not written into the cache in place (the next decode step "
                "reads the cache it was given, not a copy)")
    if written != [slot]:
        return f"the new token's {name} went to cache positions {written}; want slot {slot} alone"
    if not torch.equal(after[:, :, slot:slot + 1], new):
        return f"the cache holds another {name} at slot {slot} than the new token's"
    return None


def cached_attention_mistake(out, case, cache, scale):
    """None if cached_attention wrote the new key and value at slot and returned attention by hand on
    the cache so written; else what differs, and the usual mistake whose answer it is."""
    query, key, value, keys, values, slot, mask = case
    for name, new, before, after in (("key", key, keys, cache[0]), ("value", value, values, cache[1])):
        why = cache_mistake(name, new, before, after, int(slot))
        if why:
            return why
    rows, heads, dim = query.shape[0], query.shape[1], query.shape[-1]
    want_shape = [rows, 1, heads, dim]
    if not isinstance(out, torch.Tensor) or list(out.shape) != want_shape:
        what = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        lines = [f"cached_attention returned {what}; want [rows, 1, heads, head dim] = {want_shape}"]
        if what == [rows, heads, 1, dim]:
            lines.append("yours has the heads in dim 1: transformers' attention hooks return them in dim 2 "
                         "(transpose(1, 2))")
        return "\n".join(lines)
    written = [k.clone().index_copy_(2, slot, new) for k, new in ((keys, key), (values, value))]
    scale = dim ** -0.5 if scale is None else scale
    want = attention_by_hand(query, *written, mask, scale)
    if torch.allclose(out, want, atol=1e-5):
        return None
    lines = [f"cached_attention's output differs from attention by hand on the cache with the new key and "
             f"value at slot (max |diff| {(out - want).abs().max():.3g}, tolerance 1e-5)"]
    known = [("the mask was not added to the scores: rows attend to their left padding and to free positions",
              attention_by_hand(query, *written, torch.zeros_like(mask), scale)),
             ("the scores were not multiplied by `scale`", attention_by_hand(query, *written, mask, 1.0)),
             ("the token attended to the cache before its own key and value were written at slot",
              attention_by_hand(query, keys, values, mask, scale))]
    if scale != dim ** -0.5:
        known.append((f"`scale` ({scale}) was ignored for 1 / sqrt(head dim)",
                      attention_by_hand(query, *written, mask, dim ** -0.5)))
    if keys.shape[1] < heads:
        known.append(("query head h read KV head h % KV heads (repeat); in grouped-query attention it "
                      "reads KV head h // (heads / KV heads): a KV head's query heads are adjacent "
                      "(repeat_interleave)",
                      attention_by_hand(query, *written, mask, scale, grouping="repeat")))
    for words, answer in known:
        if torch.allclose(out, answer, atol=1e-5):
            lines.append(f"yours is the answer of this mistake: {words}")
    order = []
    for h in range(heads):  # which of the right heads each of yours is, if any
        same = [j for j in range(heads) if torch.allclose(out[:, :, h], want[:, :, j], atol=1e-5)]
        order.append(same[0] if same else None)
    if None not in order and order != list(range(heads)):
        lines.append(f"yours holds the right heads in another order along dim 2, the right ones' {order}: "
                     "query head h's output goes to position h")
    return "\n".join(lines)


@pytest.mark.parametrize("heads, kv_heads, scale", [(4, 2, 0.3), (6, 2, None), (2, 2, 0.7)])
def test_cached_attention_writes_at_slot_and_attends_as_by_hand(heads, kv_heads, scale):
    """Grouped-query (4 and 6 query heads on 2 KV heads) and plain multi-head attention, a given scale
    and the default: the new key and value go to the cache at slot, in place, and nowhere else, and
    the output is attention by hand on the cache so written."""
    case = attention_case(heads, kv_heads)
    query, key, value, keys, values, slot, mask = case
    cache = (keys.clone(), values.clone())
    with torch.no_grad():
        out = sampler.cached_attention(query.clone(), key.clone(), value.clone(), cache, slot.clone(),
                                       mask.clone(), scale)
    why = cached_attention_mistake(out, case, cache, scale)
    if why:
        pytest.fail(why, pytrace=False)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_cached_attention_in_a_model_writes_every_layer_at_slot(tok, arch):
    """In a model, on generate's own cache (sampler.prefill) through transformers' attention hook: the
    token's keys and values go to position `slot` of every layer and nowhere else, and the token
    attends to the prompt and to itself there: its logits are a plain forward pass's over the row
    alone, whatever free positions lie between."""
    model = build(tok, arch, seed=2)
    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    ids, mask = sampler.left_pad(rows, tok.pad_token_id, "cpu")
    P, length, slot = ids.shape[1], ids.shape[1] + 6, ids.shape[1] + 3
    with torch.no_grad():
        _, cache = sampler.prefill(model, ids, mask, torch.arange(len(rows)), length)
        before = [(keys.clone(), values.clone()) for keys, values in cache]
        attend = torch.full((len(rows), 1, 1, length), -math.inf)
        attend[:, 0, 0, :P] = torch.where(mask == 1, 0.0, -math.inf)
        attend[..., slot] = 0.0
        tokens = torch.tensor([65, 66, 67, 68])
        with sampler.attention(model, sampler.CACHED):
            out = model(input_ids=tokens[:, None], attention_mask=attend, position_ids=mask.sum(-1)[:, None],
                        **sampler.forward_kwargs(model, cache, slot=torch.tensor([slot])))
        refs = torch.stack([model(input_ids=torch.tensor([row + [int(t)]])).logits[0, -1] for row, t in
                            zip(rows, tokens)])
    for layer, (now, old) in enumerate(zip(cache, before)):
        for name, after, was in zip(("keys", "values"), now, old):
            written = (after != was).any(-1).any(1).any(0).nonzero().flatten().tolist()  # over rows and heads
            assert written == [slot], (f"{arch}, layer {layer}: the token's {name} went to cache positions "
                                       f"{written}; want slot {slot} alone")
    diff = (out.logits[:, -1] - refs).abs().max()
    assert diff < 1e-4, (f"{arch}: the logits differ from a plain forward pass of each row alone (max |diff| "
                         f"{diff:.3g}): the token attends to its row's prompt and to itself at slot, "
                         "nothing else")

# -----------------------------------------------------------------------------
# generate


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_generate_greedy_matches_model_generate(tok, arch):
    model = build(tok, arch)
    ours = generate(model, tok, PROMPTS, max_new_tokens=20, temperature=0)
    ref = hf_greedy(model, tok, PROMPTS, 20)
    T = ref.shape[1]
    assert torch.equal(ours.completion_ids[:, :T], ref)
    assert (ours.completion_ids[:, T:] == tok.pad_token_id).all()
    assert len(set(ours.completion_ids[0].tolist())) > 3, "degenerate greedy output: test is too weak"


def test_generate_without_a_pad_token(tok):
    model = build(tok, "llama", seed=7)
    ref = generate(model, tok, PROMPTS, max_new_tokens=6, temperature=0)
    bare = models.tiny_tokenizer()
    bare.pad_token = None
    bare.padding_side = "right"
    r = generate(model, bare, PROMPTS, max_new_tokens=6, temperature=0)
    assert r.texts == ref.texts and bare.padding_side == "right"
    assert (r.prompt_ids[r.prompt_mask == 0] == tok.eos_token_id).all()  # EOS stands in for padding


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_generate_batched_equals_unbatched(tok, arch):
    model = build(tok, arch, seed=1)
    batched = generate(model, tok, PROMPTS, num_generations=3, max_new_tokens=16, temperature=0)
    for b, prompt in enumerate(PROMPTS):
        alone = generate(model, tok, [prompt], max_new_tokens=16, temperature=0)
        for g in range(3):  # prompt-major order: row b * G + g
            assert torch.equal(batched.completion_ids[b * 3 + g], alone.completion_ids[0])
            assert batched.texts[b][g] == alone.texts[0][0]


def test_generate_stops_a_row_at_eos_and_masks_after_it(tok):
    model = build(tok, "qwen2", seed=2)
    free = generate(model, tok, PROMPTS, max_new_tokens=12, temperature=0)
    # Declare the 5th greedy token of row 0 an EOS: row 0 must stop there (EOS counted, pad after).
    stop_id = int(free.completion_ids[0, 4])
    model.generation_config.eos_token_id = [tok.eos_token_id, stop_id]
    r = generate(model, tok, PROMPTS, max_new_tokens=12, temperature=0)
    first = int((r.completion_ids[0] == stop_id).nonzero()[0])
    assert first <= 4
    assert r.completion_mask[0].tolist() == [1] * (first + 1) + [0] * (11 - first)
    assert (r.completion_ids[0, first + 1:] == tok.pad_token_id).all()
    assert torch.equal(r.completion_ids[0, :first + 1], free.completion_ids[0, :first + 1])
    assert r.texts[0][0] == tok.decode(free.completion_ids[0, :first].tolist())
    for row in range(1, len(PROMPTS)):  # the other rows decode as before until they emit stop_id
        ids = free.completion_ids[row].tolist()
        n = ids.index(stop_id) + 1 if stop_id in ids else 12
        assert torch.equal(r.completion_ids[row, :n], free.completion_ids[row, :n])


def test_generate_first_tokens_follow_softmax_at_the_temperature(tok):
    model = build(tok, "qwen2", seed=3)
    T, n = 0.7, 20000
    r = generate(model, tok, ["abc"], num_generations=n, max_new_tokens=1, temperature=T, seed=0)
    with torch.no_grad():
        enc = tok(["abc"], return_tensors="pt", add_special_tokens=False)
        logits = model(**enc).logits[0, -1]
    freq = torch.bincount(r.completion_ids[:, 0], minlength=logits.numel()).float() / n
    tv = total_variation(freq, torch.softmax(logits / T, -1))
    assert tv < 0.06, tv
    assert total_variation(freq, torch.softmax(logits, -1)) > 2 * tv  # the check tells temperatures apart


def test_generate_top_p_never_leaves_the_nucleus(tok):
    model = build(tok, "llama", seed=4)
    r = generate(model, tok, ["q"], num_generations=3000, max_new_tokens=1, temperature=1.0, top_p=0.5,
                 seed=1)
    with torch.no_grad():
        enc = tok(["q"], return_tensors="pt", add_special_tokens=False)
        p = torch.softmax(model(**enc).logits[0, -1], -1)
    sp, order = p.sort(descending=True)
    size = int((sp.cumsum(0) < 0.5).sum()) + 1
    nucleus = set(order[:size].tolist())
    assert set(r.completion_ids[:, 0].tolist()) <= nucleus
    assert len(set(r.completion_ids[:, 0].tolist())) == len(nucleus) or len(nucleus) > 20


def test_generate_seed_reproduces_and_varies(tok):
    model = build(tok, "qwen2", seed=5)
    a = generate(model, tok, PROMPTS, num_generations=2, max_new_tokens=8, seed=7)
    b = generate(model, tok, PROMPTS, num_generations=2, max_new_tokens=8, seed=7)
    c = generate(model, tok, PROMPTS, num_generations=2, max_new_tokens=8, seed=8)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    assert len({t for texts in a.texts for t in texts}) > len(PROMPTS)  # the G rows of a prompt differ


def test_generate_seeded_prompt_does_not_depend_on_its_batch(tok):
    """A prompt's completions depend on its own seed only: not on the other prompts of the call, on
    how many rows there are, or on how a batch is split into calls (data parallelism needs this)."""
    model = build(tok, "qwen2", seed=6)
    seeds = [11, 22, 33, 44]
    whole = generate(model, tok, PROMPTS, num_generations=3, max_new_tokens=10, temperature=0.9, seed=seeds)
    for b in range(len(PROMPTS)):
        alone = generate(model, tok, [PROMPTS[b]], num_generations=3, max_new_tokens=10, temperature=0.9,
                         seed=[seeds[b]])
        assert alone.texts[0] == whole.texts[b]
    fewer = generate(model, tok, PROMPTS[2:], num_generations=2, max_new_tokens=10, temperature=0.9,
                     seed=seeds[2:])
    assert [t[:2] for t in whole.texts[2:]] == fewer.texts


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generate_on_cuda_matches_cpu(tok):
    model = build(tok, "qwen2")
    cpu = generate(model, tok, PROMPTS, max_new_tokens=16, temperature=0)
    gpu = generate(model.cuda(), tok, PROMPTS, max_new_tokens=16, temperature=0)
    assert gpu.completion_ids.is_cuda
    assert cpu.texts == gpu.texts


def test_generate_records_the_logprob_of_each_sampled_token(tok):
    """Rollout.logprobs: log softmax(logits / T) of each drawn token, from the sampler itself; greedy
    decoding records them at T = 1, as the trainer computes them."""
    model = build(tok, "qwen2", seed=6)
    for T in (0.7, 0.0):
        r = generate(model, tok, PROMPTS, num_generations=2, max_new_tokens=10, temperature=T, seed=3)
        hint = (" (a rollout of generate: yours drew other tokens than the reference's; sample_token's and "
                "decode_step's tests say why)")
        reference = reference_logprobs(model, r, T, hint=hint)
        mask = r.completion_mask.bool()
        assert torch.allclose(r.logprobs[mask], reference[mask], atol=1e-4), T
        assert (r.logprobs[~mask] == 0).all()


def test_generate_prints_no_deprecation_warning():
    """transformers 5 names the KV cache `cache`: the old name warns on stderr (once per process, so
    a fresh process), as would any other deprecated use in the sampler."""
    import subprocess
    import sys
    code = """if True:
        import models, sampler
        tok = models.tiny_tokenizer()
        for arch in ("qwen2", "llama", "gpt2"):
            sampler.generate(models.tiny_model(tok, arch=arch), tok, ["ab", "c"], 2, 4, seed=0)
        """
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, cwd=root,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "deprecat" not in p.stderr.lower(), p.stderr


# -----------------------------------------------------------------------------
# generate's decode loop, as a GPU sees it: host syncs and copies per step


class OpCounter:
    """Counts, over a block, the operations that make the host wait for the device (a value read
    back, a data-dependent shape) and the largest tensor a copying operation makes."""
    SYNCS = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "masked_select", "_unique2", "unique_dim"}
    COPIES = {"cat", "stack", "clone", "_to_copy", "index", "index_select", "repeat_interleave", "contiguous"}

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = func.__name__.split(".")[0]
                counter.syncs += name in OpCounter.SYNCS
                if name in OpCounter.COPIES:
                    for t in out if isinstance(out, (tuple, list)) else [out]:
                        if isinstance(t, torch.Tensor):
                            counter.largest_copy = max(counter.largest_copy, t.numel())
                return out
        self.mode, self.syncs, self.largest_copy = Mode(), 0, 0


def decode_counts(model, tok, max_new_tokens):
    """(host syncs, largest copy) of generate's decode steps alone: a run's minus a one-token run's."""
    counts = []
    for n in (1, max_new_tokens):
        counter = OpCounter()
        with counter.mode:
            generate(model, tok, PROMPTS[:2], num_generations=2, max_new_tokens=n, seed=0)
        counts.append(counter)
    return counts[1].syncs - counts[0].syncs, counts[1].largest_copy


def test_generate_steps_rarely_wait_for_the_device_and_copy_nothing_that_grows(tok, monkeypatch):
    """Rows running to the cap (no EOS): at most one host sync per 4 decode steps (the loop looks at
    finished rows every CHECK_EVERY tokens, not at every one), and no step copies the cache or the mask,
    so the largest copy does not grow with the context."""
    model = build(tok, "qwen2")
    monkeypatch.setattr(sampler, "eos_token_ids", lambda model, tokenizer: [10 ** 6])  # never drawn
    syncs, short = decode_counts(model, tok, 33)
    assert syncs / 32 <= 0.25, f"{syncs} host syncs in 32 decode steps"
    _, long = decode_counts(model, tok, 97)
    assert long == short, f"the largest copy grew from {short} to {long} elements with 64 more tokens"


def varied_calls(count=12):
    """`count` generate calls as a run makes them: 4-12 rows, prompts of 20-200 tokens."""
    import random
    rng = random.Random(0)
    calls = []
    for _ in range(count):
        rows, longest = rng.randint(4, 12), rng.randint(20, 200)
        calls.append(["".join(rng.choice("abcdef ():") for _ in range(rng.randint(20, longest)))
                      for _ in range(rows)])
    return calls


def test_generate_padding_rows_and_positions_change_no_real_row(tok, monkeypatch):
    """--compile pads the rows to a bucket with copies of a real row and the cache to a bucket with
    masked positions: run eagerly on those padded shapes, every real row samples the tokens, and
    records the log-probs, of an unpadded run."""
    model = build(tok, "qwen2", seed=3)
    monkeypatch.setattr(sampler, "compiled", lambda function, device: function)  # padded, not compiled
    for prompts in varied_calls(3):
        plain = generate(model, tok, prompts, 1, 12, temperature=1.0, seed=5)
        padded = generate(model, tok, prompts, 1, 12, temperature=1.0, seed=5, compile=True)
        assert torch.equal(padded.completion_ids, plain.completion_ids)
        # Another batch shape sums the matmuls in another order (and, with threads, splits them
        # otherwise): the wide init's large logits carry that rounding to ~3e-5 in the log-probs.
        assert torch.allclose(padded.logprobs, plain.logprobs, atol=2e-4)
    assert sampler.bucket(5, 8) == 8 and sampler.bucket(9, 8) == 16 and sampler.bucket(300, 256) == 512


class DispatchCount:
    """How many operations torch dispatches in a block (a TorchDispatchMode)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        count = self
        self.ops = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                count.ops += 1
                return func(*args, **(kwargs or {}))
        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def test_generate_eager_dispatches_no_more_ops_a_step_than_model_generate(tok, monkeypatch):
    """Eager decoding is bound by launching kernels on a GPU: a decode step of ours (8 layers, 8 rows,
    sampling at T = 1, every row running to the cap), sampling and bookkeeping included, dispatches no
    more operations than one of transformers' model.generate. Each is counted as the difference between
    a run of 24 new tokens and one of 8, over 16 steps."""
    model = models.tiny_model(tok, layers=8, init_std=0.5).eval()
    model.generation_config.eos_token_id = None
    monkeypatch.setattr(sampler, "eos_token_ids", lambda model, tokenizer: [10 ** 6])  # never drawn
    prompts = ["def add(a, b):", "Hi", "The quick brown fox", "x"] * 2
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)

    def ours(n):
        generate(model, tok, prompts, max_new_tokens=n, temperature=1.0, seed=0)

    def theirs(n):
        with torch.no_grad():
            model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=n,
                           pad_token_id=tok.pad_token_id, eos_token_id=None)
    per_step = {}
    for name, run in (("ours", ours), ("model.generate", theirs)):
        counts = []
        for n in (8, 24):
            with DispatchCount() as count:
                run(n)
            counts.append(count.ops)
        per_step[name] = (counts[1] - counts[0]) / 16
    assert per_step["ours"] <= per_step["model.generate"], per_step


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own internals warn
def test_generate_compiled_step_keeps_few_graphs_and_the_eager_greedy_tokens(tok, monkeypatch):
    """--compile: 12 calls of 4-12 rows and prompts of 20-200 tokens compile at most 6 graphs of the
    decode step (the shapes come from buckets, not from each batch), and torch.compile changes how the
    step runs, not what it computes: the greedy tokens are the eager ones."""
    from torch._dynamo.testing import CompileCounterWithBackend
    model = build(tok, "qwen2", seed=3)
    counter = CompileCounterWithBackend("inductor")
    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda function, **options: compile(function, backend=counter,
                                                                              dynamic=False))
    monkeypatch.setattr(sampler, "compiled", functools.lru_cache(sampler.compiled.__wrapped__))  # none cached
    for prompts in varied_calls():
        eager = generate(model, tok, prompts, 1, 8, temperature=0)
        fast = generate(model, tok, prompts, 1, 8, temperature=0, compile=True)
        assert torch.equal(fast.completion_ids, eager.completion_ids)
        assert fast.texts == eager.texts
    assert 1 <= counter.frame_count <= 6, f"{counter.frame_count} graphs for 12 generate calls"
