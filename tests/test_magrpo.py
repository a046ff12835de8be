"""Tests of the algorithm in magrpo.py, one function at a time, each against an independent reference:
the row-by-row log-prob pass (conftest.reference_logprobs), hand-computed Eq. 1, Eq. 2 and multi-turn
returns. `pytest -k NAME` runs a function's tests (completion_logprobs, group_advantages, policy_loss,
node_return, ...), and a failure says what differs (where, by how much, and what the difference
usually means). The sampler's are in test_sampler.py. CPU, tiny random models, hand-written rollouts:
nothing here samples, so these tests do not wait for the sampler."""
import dataclasses
import itertools
import math
import statistics
from types import SimpleNamespace

import pytest
import torch

import magrpo
import models
import runs
import sampler
from conftest import (build, projected_gradient, reference_gradient, reference_logprobs, scripted_rollout,
                      update_on, weighted_loss)
from magrpo import completion_logprobs, group_advantages, node_return, policy_loss

PROMPTS = ["def add(a, b):", "Hi", "The quick brown fox jumps", "x"]  # ragged: left padding matters


# -----------------------------------------------------------------------------
# completion_logprobs: against each row run alone (conftest.reference_logprobs)


TEXTS = ["hello world", "x", "", "a longer completion, with more tokens"]  # EOS alone too


def hand_rollout(model, tok, size=3):
    """Four prompts of different lengths, `size` completions each of different lengths, written by hand
    (no sampler): groups of rows that share a prompt, as generate returns them."""
    return scripted_rollout(models.Agent(model, tok), PROMPTS, size, lambda b, g: TEXTS[(b + g) % 4])


def logprob_mismatch(got, rollout, want, temperature, at_one=None, tolerance=1e-5):
    """None when completion_logprobs' output `got` is `want` at every completion token (the values
    after EOS are the caller's to mask); else what differs, in words: the worst row and token, the
    ratio to the reference, and what a pattern of differences usually means. at_one: the reference
    at T = 1, to tell a forgotten temperature."""
    shape = list(rollout.completion_ids.shape)
    if not isinstance(got, torch.Tensor) or list(got.shape) != shape or not got.is_floating_point():
        what = type(got).__name__
        if isinstance(got, torch.Tensor):
            what = f"a {got.dtype} tensor of shape {list(got.shape)}"
        return (f"completion_logprobs returned {what}; want a float tensor [rows, T] = {shape}, one log-prob "
                "per completion token (rollout.completion_ids' shape)")
    mask = rollout.completion_mask.bool()
    values = got.detach().float()
    bad = ~torch.isfinite(values) & mask
    if bad.any():
        r, t = bad.nonzero()[0].tolist()
        return (f"completion_logprobs is not finite ({values[r, t].item()}) at row {r}, token {t}, and at "
                f"{int(bad.sum())} tokens in all (temperature {temperature}: T = 0 means T = 1, greedy "
                "sampling's log-probs, not a division by 0)")
    diff = (values - want).abs().masked_fill(~mask, 0.0)
    if diff.max() <= tolerance:
        return None
    G = rollout.num_generations
    r, t = divmod(int(diff.argmax()), shape[1])
    lines = [f"completion_logprobs differs from the reference (each row run alone) at "
             f"{int((diff > tolerance).sum())} of {int(mask.sum())} completion tokens "
             f"(tolerance {tolerance:g}); the worst: row {r} (prompt {r // G}, completion {r % G}), "
             f"token {t} of {int(mask[r].sum())}: got {values[r, t]:.5f}, want {want[r, t]:.5f}",
             f"got / want over the completion tokens: median {(values / want)[mask].median():.3f} "
             f"(temperature {temperature})"]
    if at_one is not None and temperature != 1 and (values - at_one).abs()[mask].max() <= tolerance:
        lines.append(f"yours are the log-probs at T = 1: divide the logits by the temperature "
                     f"({temperature}) before the log-softmax")
    shifts = ((1, "token t holds the reference's token t + 1"), (-1, "token t + 1 holds token t's"))
    for shift, words in shifts:
        ours = values[:, :-1] if shift == 1 else values[:, 1:]
        theirs = want[:, 1:] if shift == 1 else want[:, :-1]
        both = mask[:, 1:]
        if both.any() and (ours - theirs).abs()[both].max() <= tolerance:
            lines.append(f"shifted by one: your {words}; the logit at the prompt's last token predicts the "
                         "first completion token, the logit at completion token t predicts token t + 1")
    padded = rollout.prompt_mask.min(-1).values == 0
    wrong = (diff > tolerance).any(-1)
    if padded.any() and (~padded).any() and wrong[padded].all() and not wrong[~padded].any():
        lines.append("only the rows whose prompt is left-padded differ: give each row its own position ids "
                     "(0 at its first real token) and an attention mask that is 0 on the padding")
    return "\n".join(lines)


def expect_logprobs(got, rollout, want, temperature, at_one=None):
    why = logprob_mismatch(got, rollout, want, temperature, at_one)
    if why:
        pytest.fail(why, pytrace=False)
    if not got.requires_grad:
        pytest.fail("completion_logprobs' values are right but carry no gradient (requires_grad is False): "
                    "they were computed under torch.no_grad or detached, and Eq. 2 differentiates them",
                    pytrace=False)


def expect_gradient(model, logprobs, rollout, temperature, tolerance=1e-4):
    """The gradient of a weighted sum of the log-probs (Eq. 2's loss is one) against the reference's,
    seen along fixed random directions (conftest.projected_gradient)."""
    model.zero_grad(set_to_none=True)
    weighted_loss(logprobs, rollout).backward()
    ours = projected_gradient(model)
    want = reference_gradient(model, rollout, temperature)
    error = ((ours - want).norm() / want.norm()).item()
    if not error <= tolerance:
        pytest.fail(f"completion_logprobs' values are right but their gradient differs from the reference's "
                    f"by {error:.2%} (relative, along {len(want)} fixed random directions of the weights; "
                    f"tolerance {tolerance:g}): part of the computation does not carry it, e.g. the "
                    "prompt's pass under torch.no_grad or its cache detached (the prompt's keys and values "
                    "depend on the weights too), a .detach() or a .item()", pytrace=False)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_completion_logprobs_equal_the_row_by_row_pass(tok, arch):
    """Each group's prompt runs once and its rows share its cache: the log-probs equal each row run
    alone, unpadded (within 1e-5), and so does the gradient of a weighted sum of them, of which Eq. 2's
    loss is one (within 1e-4, relative)."""
    model = models.tiny_model(tok, arch=arch, init_std=0.15, seed=4)
    r = hand_rollout(model, tok)
    assert (r.completion_mask == 0).any() and (r.prompt_mask == 0).any(), "want ragged rows"
    lp = completion_logprobs(model, r, temperature=0.7)
    expect_logprobs(lp, r, reference_logprobs(model, r, 0.7), 0.7, at_one=reference_logprobs(model, r, 1.0))
    expect_gradient(model, lp, r, 0.7)


def test_completion_logprobs_of_long_prompts_and_short_completions(tok):
    """Long prompts and short completions, where several rows share one pass of their prompt (each
    completion after it in its own block, sampler.shared_prompt_rows): the values and the gradient are
    the row-by-row reference's, for whole groups and for a micro-batch that cuts them."""
    model = models.tiny_model(tok, arch="qwen2", init_std=0.15, seed=4)
    prompts = ["def add(a, b):\n    # return the sum of a and b, both ints", "Hi" * 20,
               "x = [i for i in range(9)]"]
    short = ["ab", "", "xyz!", "q"]
    r = scripted_rollout(models.Agent(model, tok), prompts, 4, lambda b, g: short[(b + g) % 4])
    ids = sampler.shared_prompt_rows(model, r)[0]
    assert ids.shape[0] < len(r), "want rows that share a pass of their prompt"
    lp = completion_logprobs(model, r, temperature=0.7)
    expect_logprobs(lp, r, reference_logprobs(model, r, 0.7), 0.7)
    expect_gradient(model, lp, r, 0.7)
    part = r.rows(2, 9)
    with torch.no_grad():
        lp = completion_logprobs(model, part, temperature=0.7)
    why = logprob_mismatch(lp, part, reference_logprobs(model, part, 0.7), 0.7)
    assert not why, f"rows 2-8 of groups of 4 (a micro-batch that cuts two groups): {why}"


def test_completion_logprobs_at_temperature_0_are_those_of_t_1(tok):
    """Greedy sampling (T = 0) has no distribution of its own: the trainer, as the sampler, takes the
    log-probs at T = 1 (the docstring's "greedy: T = 1")."""
    model = models.tiny_model(tok, init_std=0.15, seed=4)
    r = hand_rollout(model, tok)
    expect_logprobs(completion_logprobs(model, r, temperature=0), r, reference_logprobs(model, r, 1.0), 0)


def test_completion_logprobs_of_a_model_without_logits_to_keep(tok, monkeypatch):
    """A model whose forward has no logits_to_keep returns every prompt position's logits: the
    log-probs must still read the prompt's last one."""
    model = models.tiny_model(tok, init_std=0.15, seed=4)
    r = hand_rollout(model, tok)
    accepted = sampler._forward_parameters(type(model)) - {"logits_to_keep"}
    monkeypatch.setattr(sampler, "_forward_parameters", lambda model_class: accepted)
    with torch.no_grad():
        lp = completion_logprobs(model, r, temperature=1.0)
    why = logprob_mismatch(lp, r, reference_logprobs(model, r, 1.0), 1.0)
    assert not why, f"a model without logits_to_keep (it returns the logits of every prompt token): {why}"


def test_completion_logprobs_of_a_micro_batch_that_cuts_a_group(tok):
    """Rows 2-6 of groups of 3 (parts of two groups, padding trimmed by Rollout.rows): the same values."""
    model = models.tiny_model(tok, init_std=0.15, seed=4)
    part = hand_rollout(model, tok).rows(2, 7)
    with torch.no_grad():
        lp = completion_logprobs(model, part, temperature=0.7)
    why = logprob_mismatch(lp, part, reference_logprobs(model, part, 0.7), 0.7)
    assert not why, f"rows 2-6 of groups of 3 (a micro-batch that cuts two groups): {why}"


def test_completion_logprobs_of_lora_agents_on_a_shared_base(tok):
    """Two LoRA agents on one frozen base: each agent's log-probs and adapter gradient are the
    reference's."""
    base = models.tiny_model(tok, init_std=0.15, seed=4)
    for seed in (1, 2):
        model = models.add_lora(base, models.LoRAConfig(4), seed=seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(seed))  # a trained adapter
        r = hand_rollout(model, tok)
        lp = completion_logprobs(model, r, temperature=1.0)
        expect_logprobs(lp, r, reference_logprobs(model, r), 1.0)
        expect_gradient(model, lp, r, 1.0)


def test_completion_logprobs_in_bf16(tok):
    """bf16: the log-probs are as close to the fp32 truth as the row-by-row bf16 pass is (within
    bf16's own error), and the gradient within 5% of the row-by-row bf16 gradient."""
    model = models.tiny_model(tok, init_std=0.15, seed=4)
    r = hand_rollout(model, tok)
    mask = r.completion_mask.bool()
    truth = reference_logprobs(model, r)
    model = model.to(torch.bfloat16)
    lp = completion_logprobs(model, r)
    bf16_error = (reference_logprobs(model, r) - truth)[mask].abs().max().item()
    error = (lp.detach().float() - truth)[mask].abs().max().item()
    assert error <= 1.5 * bf16_error + 1e-3, (
        f"a bf16 model: your log-probs are {error:.4f} from the fp32 truth at worst, the row-by-row bf16 "
        f"pass {bf16_error:.4f}: take the log-softmax of the logits in float32")
    expect_gradient(model, lp, r, 1.0, tolerance=0.05)


def test_the_log_prob_pass_never_holds_the_logits_of_every_position(tok, monkeypatch):
    """With a large vocabulary the logits are the pass's largest tensors: with 4 MB of logits at a time
    (sampler.LOGITS_BYTES, 256 MB by default), no tensor of the forward or the backward pass holds as
    much as half of the [rows, tokens, vocab] logits (100 MB)."""
    monkeypatch.setattr(sampler, "LOGITS_BYTES", 2 ** 22)
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import Qwen2Config, Qwen2ForCausalLM
    vocab = 32000
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    rows, n = 4, 200
    rollout = sampler.Rollout(torch.randint(0, vocab, (rows, 8), generator=g), torch.ones(rows, 8, dtype=torch.long),
                              torch.randint(0, vocab, (rows, n), generator=g), torch.ones(rows, n, dtype=torch.long),
                              torch.zeros(rows, n), [], 2)

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out
    with Largest():
        lp = completion_logprobs(model, rollout, temperature=0.7)
        lp.sum().backward()
    assert Largest.numel < rows * n * vocab / 2, f"a tensor of {Largest.numel} elements"
    reference = reference_logprobs(model, rollout, temperature=0.7)
    assert torch.allclose(lp, reference, atol=1e-4), (lp - reference).abs().max()


def test_the_log_prob_pass_dispatches_at_most_1_2x_the_ops_of_the_textbook_pass(tok):
    """On a GPU a pass of a small batch is bound by launching kernels: completion_logprobs, forward and
    backward, dispatches at most 1.2 times the operations of magrpo.row_logprobs, which runs every
    row whole (8 layers, one group of G = 8, a prompt of 256 tokens, 64-token completions), and gets
    its values."""
    from torch.utils._python_dispatch import TorchDispatchMode
    if not hasattr(magrpo, "row_logprobs"):
        pytest.skip("a course copy holds no textbook pass (it would be completion_logprobs' answer)")

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))
    model = models.tiny_model(tok, layers=8, init_std=0.15)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (1, 256), generator=g).repeat(8, 1)
    completion = torch.randint(0, 256, (8, 64), generator=g)
    rollout = sampler.Rollout(prompt, torch.ones_like(prompt), completion, torch.ones_like(completion),
                              torch.zeros(8, 64), [], 8)
    ops, values = {}, {}
    for name, fn in (("textbook", magrpo.row_logprobs), ("shared", completion_logprobs)):
        Count.ops = 0
        with Count():
            lp = fn(model, rollout, 1.0)
            lp.sum().backward()
        ops[name], values[name] = Count.ops, lp.detach()
        model.zero_grad(set_to_none=True)
    assert ops["shared"] <= 1.2 * ops["textbook"], ops
    assert torch.allclose(values["shared"], values["textbook"], atol=1e-4)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the subclass hides which cache keyword it takes
def test_the_log_prob_pass_refuses_a_model_whose_logits_are_scaled(tok):
    """A model that scales or caps its logits after the output layer (Gemma 2, Cohere) would get wrong
    log-probs from the output layer alone: one clear error instead."""
    model = models.tiny_model(tok, init_std=0.5)
    head = model.lm_head
    model.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=False)
    model.lm_head.weight = head.weight

    class Scaled(type(model)):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.5
            return out
    model.__class__ = Scaled
    with pytest.raises(ValueError, match="not its output layer's"):
        completion_logprobs(model, hand_rollout(model, tok))


def test_the_log_prob_pass_under_top_p_and_top_k_is_the_samplers(tok):
    """On-policy under a cut (fp32): with top-p < 1 or top-k, the trainer's log-probs are the sampler's,
    those of the cut and renormalised distribution that drew each token (the rollout's floors); without
    the floors (--logprob full, TRL's and the authors' choice) they are the uncut ones, lower, and the
    drift the step logs shows the difference."""
    model = models.tiny_model(tok, init_std=0.3, seed=6)
    prompts = ["def add(a, b):", "Hi", "The quick brown fox jumps", "x"]
    for top_p, top_k in ((0.7, 0), (1.0, 5), (0.8, 20)):
        r = sampler.generate(model, tok, prompts, 2, 10, temperature=0.9, top_p=top_p, top_k=top_k, seed=3)
        mask = r.completion_mask.bool()
        with torch.no_grad():
            cut = completion_logprobs(model, r, temperature=0.9)
            full = completion_logprobs(model, dataclasses.replace(r, floors=None), temperature=0.9)
        assert torch.allclose(cut[mask], r.logprobs[mask], atol=1e-4), (top_p, top_k)
        assert (full[mask] <= cut[mask] + 1e-5).all(), (top_p, top_k)
        assert (full[mask] < cut[mask] - 1e-3).any(), (top_p, top_k)
    agent = models.Agent(model, tok, torch.optim.SGD(model.parameters(), lr=0.0))
    advantages = torch.tensor([1.0, -1.0] * 4)
    drift = {mode: update_on(agent, [(r, advantages)], magrpo.Config(temperature=0.9, logprob=mode))
             ["logprob_drift"] for mode in ("cut", "full")}
    assert drift["cut"] < 1e-5 < 1e-2 < drift["full"], drift


def test_micro_batches_hold_whole_groups_where_they_can():
    assert magrpo.micro_batches(12, 4, 8) == [(0, 8), (8, 12)]  # two groups of 4, then one
    assert magrpo.micro_batches(12, 4, 6) == [(0, 4), (4, 8), (8, 12)]  # one whole group each, not 6 rows
    assert magrpo.micro_batches(9, 3, 2) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 9)]  # a group over 2
    assert magrpo.micro_batches(5, 1, 8) == [(0, 5)]


# -----------------------------------------------------------------------------
# Eq. 1, Eq. 2, the multi-turn return

R = [[1.0, 2.0, 3.0, 6.0], [2.0, 2.0, 2.0, 2.0]]  # group 0's mean 3; group 1 all equal (no signal)
STD = math.sqrt(((1 - 3) ** 2 + 1 + 0 + 9) / 3)  # group 0's unbiased std: divided by G - 1 = 3


def rounded(values, G):
    """Groups of G numbers, 4 decimals each, as a list of lists (for messages)."""
    return [[round(x, 4) for x in group] for group in values.reshape(-1, G).tolist()]


def expect_advantages(rewards, mode, want, wrong=(), baseline=None, scale="none"):
    """group_advantages(rewards, mode, baseline, scale) must be `want` (a float tensor of the rewards'
    shape); wrong: (words, what a wrong answer returns), named in the message when the result is that."""
    got = group_advantages(rewards, mode, baseline=baseline, scale=scale)
    want = torch.tensor(want)
    call = f"group_advantages({rewards}, {mode!r}"
    call += f", baseline={baseline})" if baseline is not None else ")"
    if scale != "none":
        call = call[:-1] + f", scale={scale!r})"
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or not got.is_floating_point():
        what = type(got).__name__
        if isinstance(got, torch.Tensor):
            what = f"a {got.dtype} tensor {list(got.shape)}"
        pytest.fail(f"{call} returned {what}; want a float tensor of the rewards' shape {list(want.shape)}",
                    pytrace=False)
    if torch.allclose(got.float(), want, atol=1e-6):
        return
    lines = [f"{call} = {rounded(got, want.shape[-1])}; want {rounded(want, want.shape[-1])}"]
    for words, value in wrong:
        if torch.allclose(got.float(), torch.tensor(value), atol=1e-6, equal_nan=True):
            lines.append(f"yours is {words}")
    pytest.fail("\n".join(lines), pytrace=False)


def test_group_advantages_eq1_by_hand():
    """mean (the paper): A = R - the group's mean, over the last dim, whatever the leading dims."""
    expect_advantages(R, "mean", [[-2.0, -1.0, 0.0, 3.0], [0.0] * 4],
                      [("R itself: the baseline is missing", R),
                       ("divided by the std: mean is Eq. 1 alone, R - mean (only scale='group' divides)",
                        [[a / (STD + 1e-4) for a in (-2.0, -1.0, 0.0, 3.0)], [0.0] * 4]),
                       ("divided by the std without 1e-4: mean is Eq. 1 alone, R - mean",
                        [[a / STD for a in (-2.0, -1.0, 0.0, 3.0)], [float("nan")] * 4]),
                       ("the mean over the whole batch: the baseline is each group's own mean (the last dim)",
                        [[r - 2.5 for r in R[0]], [2.0 - 2.5] * 4]),
                       ("mean - R: the sign is reversed", [[2.0, 1.0, 0.0, -3.0], [0.0] * 4])])
    expect_advantages([0.0, 4.0], "mean", [-2.0, 2.0])  # one group, a list
    expect_advantages([[[0.0, 4.0]]], "mean", [[[-2.0, 2.0]]])  # leading dims are groups too


def test_group_advantages_rloo_by_hand():
    """rloo: R minus the mean of the other G - 1 rewards."""
    expect_advantages(R, "rloo", [[1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 6 / 3], [0.0] * 4],
                      [("R minus the mean of all G rewards: leave the completion's own reward out",
                        [[-2.0, -1.0, 0.0, 3.0], [0.0] * 4])])


def test_group_advantages_scaled_by_the_std_of_the_group_or_the_batch_by_hand():
    """scale: the advantage divided by the std + 1e-4 of its group (the original GRPO) or of all the
    rewards given (batch), the unbiased std (divided by G - 1, torch.std's default, as TRL's GRPO); the
    1e-4 keeps a group of equal rewards at 0."""
    centered = [-2.0, -1.0, 0.0, 3.0]
    population = math.sqrt((4 + 1 + 0 + 9) / 4)
    expect_advantages(R, "mean", [[a / (STD + 1e-4) for a in centered], [0.0] * 4],
                      [("divided by the population std (over G): the unbiased std divides by G - 1",
                        [[a / (population + 1e-4) for a in centered], [0.0] * 4]),
                       ("nan where a group's rewards are all equal: add 1e-4 to the std",
                        [[a / STD for a in centered], [float("nan")] * 4])], scale="group")
    flat = [r for group in R for r in group]
    batch = statistics.stdev(flat) + 1e-4  # of all 8 rewards
    expect_advantages(R, "mean", [[a / batch for a in centered], [0.0] * 4],
                      [("divided by each group's std: batch divides by the std of all the rewards",
                        [[a / (STD + 1e-4) for a in centered], [0.0] * 4])], scale="batch")
    # The scale divides whatever the baseline gave: with none, a group of equal rewards 2 gets 2 / 1e-4.
    expect_advantages(R, "none", [[r / (STD + 1e-4) for r in R[0]], [2 / 1e-4] * 4], scale="group")


def test_group_advantages_none_and_remax_by_hand():
    """none: REINFORCE, A = R; remax: A = R - the group's greedy reward (one baseline per group)."""
    expect_advantages(R, "none", R)
    expect_advantages(R, "remax", [[-1.5, -0.5, 0.5, 3.5], [-1.0, -1.0, -1.0, -1.0]], baseline=[2.5, 3.0])
    expect_advantages([4.0, 0.0], "remax", [0.0, -4.0], baseline=4.0)


def test_group_advantages_leaves_an_answer_without_a_verdict_out():
    """Bug: a joint action nobody judged (NaN: a sandbox error, a ScoreError) entered Eq. 1 as a failure.
    It gets A = 0 and stays out of its group's baseline and std, G counting the verdicts; a group left
    with one verdict teaches nothing. By hand, on [1, nan, 3, 5] (mean 3, 3 verdicts) and [nan, 4, nan, nan]."""
    nan = float("nan")
    rewards = [[1.0, nan, 3.0, 5.0], [nan, 4.0, nan, nan]]
    as_a_zero = [[-1.25, -2.25, 0.75, 2.75], [-1.0, 3.0, -1.0, -1.0]]  # the bug: nan read as 0
    expect_advantages(rewards, "mean", [[-2.0, 0.0, 0.0, 2.0], [0.0] * 4],
                      [("a reward without a verdict read as 0: leave it out of the baseline, with A = 0", as_a_zero),
                       ("nan where a reward has no verdict: give it A = 0", [[-2.0, nan, 0.0, 2.0], [nan, 0.0, nan, nan]])])
    expect_advantages(rewards, "rloo", [[1 - 4.0, 0.0, 3 - 3.0, 5 - 2.0], [0.0] * 4])
    std = statistics.stdev([1.0, 3.0, 5.0])
    expect_advantages(rewards, "mean", [[-2 / (std + 1e-4), 0.0, 0.0, 2 / (std + 1e-4)], [0.0] * 4], scale="group")
    batch = statistics.stdev([1.0, 3.0, 5.0, 4.0]) + 1e-4
    expect_advantages(rewards, "none", [[1 / batch, 0.0, 3 / batch, 5 / batch], [0.0] * 4], scale="batch")
    expect_advantages(rewards, "remax", [[-1.0, 0.0, 1.0, 3.0], [0.0] * 4], baseline=[2.0, 1.0])
    expect_advantages([[1.0, 2.0], [3.0, 5.0]], "remax", [[0.0, 0.0], [-1.0, 1.0]], baseline=[nan, 4.0])
    expect_advantages([nan, nan, nan], "mean", [0.0, 0.0, 0.0])


def test_group_advantages_refuses_a_group_of_one_and_an_unknown_baseline():
    with pytest.raises(ValueError):
        group_advantages([1.0])  # no group to compare with: Eq. 1 is 0, and std is nan
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0], "std")  # std is mean with scale="group": never mean unscaled


def test_policy_loss_eq2_by_hand_with_padding():
    """Two sequences, row 0 ended by its EOS at t = 1 (t = 2 is padding): each loss type's value and
    its gradient with respect to the log-probs, by hand."""
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([2.0, -1.0])
    cases = {"seq_sum": (-(2 * -3 + -1 * -10) / 2, [[-1.0, -1.0, 0.0], [0.5, 0.5, 0.5]], -(2 * -6 + 10) / 2),
             "token_mean": (-(2 * -3 + -1 * -10) / 5, [[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]],
                            -(2 * -6 + 10) / 6),
             "seq_mean": (-(2 * -3 / 2 + -1 * -10 / 3) / 2, [[-0.5, -0.5, 0.0], [1 / 6, 1 / 6, 1 / 6]],
                          -(2 * -2 + 10 / 3) / 2),
             "token_budget": (-(2 * -3 + -1 * -10) / 6, [[-1 / 3, -1 / 3, 0.0], [1 / 6, 1 / 6, 1 / 6]],
                              -(2 * -6 + 10) / 6)}  # 2 rows x the mask's width 3
    for loss_type, (value, grad, unmasked) in cases.items():
        lp.grad = None
        loss = policy_loss(lp, mask, adv, loss_type)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
            pytest.fail(f"policy_loss(..., {loss_type!r}) returned {loss!r}; want a scalar tensor with grad "
                        "(the loss that backward() differentiates)", pytrace=False)
        loss.backward()
        if loss.item() != pytest.approx(value) or not torch.allclose(lp.grad, torch.tensor(grad)):
            lines = [f"policy_loss(logprobs {lp.tolist()}, mask {mask.tolist()}, advantages {adv.tolist()}, "
                     f"{loss_type!r}) = {loss.item():.4f} with gradient {lp.grad.tolist()}; want {value:.4f} "
                     f"with gradient {grad}"]
            named = {"-value: the sign (a loss to minimise is -A * log pi)": -value,
                     "the value with the padding counted: multiply by the mask (1 up to and including EOS)":
                     unmasked}
            named.update({f"{other}'s value: {other} divides by another count": cases[other][0]
                          for other in cases if other != loss_type})
            lines += [f"yours is {words}" for words, wrong in named.items()
                      if loss.item() == pytest.approx(wrong)]
            pytest.fail("\n".join(lines), pytrace=False)


def test_policy_loss_micro_batches_add_up_to_the_batch():
    """normalizer, counted once over the whole batch: the micro-batches' losses add up to the batch's."""
    torch.manual_seed(0)
    lp, adv = torch.randn(6, 5), torch.randn(6)
    mask = (torch.rand(6, 5) > 0.3).long()
    mask[:, 0] = 1
    for loss_type in magrpo.Config.CHOICES["loss_type"]:
        whole = policy_loss(lp, mask, adv, loss_type)
        norm = magrpo.loss_normalizer(mask, loss_type)
        parts = sum(policy_loss(lp[i:i + 2], mask[i:i + 2], adv[i:i + 2], loss_type, norm)
                    for i in range(0, 6, 2))
        assert parts.item() == pytest.approx(whole.item(), abs=1e-6), (
            f"{loss_type}: three micro-batches of 2 rows, each given normalizer={norm} (the whole batch's "
            f"count), add up to {parts.item():.5f}, the batch's loss is {whole.item():.5f}: divide by "
            "`normalizer` when it is given, by this batch's own count only when it is None")


# TRL's GRPOTrainer, written out from its documented formulas (TRL is no dependency): the loss types
# and scale_rewards, as our flags resolve them (runs.SPELLINGS), through group_advantages,
# loss_mask, loss_normalizer and policy_loss.

EOS = 0


def trl_advantages(rewards, scale):
    """TRL's advantages: R minus its group's mean, divided (scale_rewards group or batch) by the
    unbiased std of the group or of the whole batch + 1e-4."""
    flat = [r for group in rewards for r in group]
    advantages = []
    for group in rewards:
        std = {"group": statistics.stdev(group), "batch": statistics.stdev(flat)}.get(scale)
        for r in group:
            a = r - sum(group) / len(group)
            advantages.append(a / (std + 1e-4) if std is not None else a)
    return torch.tensor(advantages)


def trl_loss(per_token, mask, loss_type, max_completion_length):
    """TRL's loss of one micro-batch (no accumulation), per_token [rows, T] its per-token loss."""
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    # bnpo: the micro-batch's tokens; dapo: num_items_in_batch, the whole batch's (one micro-batch here)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


TRL_REWARDS = [[1.0, 2.0, 4.0], [0.5, 0.5, 3.0]]  # two groups of 3


@pytest.mark.parametrize("scale", ["none", "group", "batch"])
def test_group_advantages_give_trls_advantages_by_hand(scale):
    """TRL's scale_rewards, as --scale-rewards resolves it, against TRL's formula (trl_advantages)."""
    cfg = magrpo.Config(scale_rewards=scale)
    expect_advantages(TRL_REWARDS, cfg.advantage, trl_advantages(TRL_REWARDS, scale).view(2, 3).tolist(),
                      scale=cfg.scale_rewards)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
def test_policy_loss_gives_trls_loss_types_by_hand(loss_type, masked):
    """Two groups of 3 rows, rows 1 and 5 cut without EOS; the budget (6) above the mask's width (4);
    TRL's advantages (group-scaled), given. On-policy TRL's per-token loss is -A * ratio, ratio =
    exp(lp - lp.detach()) = 1 (its clipping never binds), whose gradient is ours; its value is our loss
    with lp in place of the ratio. (group_advantages has its own TRL test: each test checks one function.)"""
    torch.manual_seed(0)
    lengths = [2, 4, 3, 4, 1, 4]
    ends = [True, False, True, True, True, False]  # whether the row's last token is EOS
    ids = torch.randint(1, 9, (6, 4))
    mask = torch.tensor([[1] * n + [0] * (4 - n) for n in lengths])
    for row, (n, ended) in enumerate(zip(lengths, ends)):
        if ended:
            ids[row, n - 1] = EOS
    rollout = SimpleNamespace(completion_ids=ids, completion_mask=mask)
    lp = -torch.rand(6, 4) * 3
    cfg = runs.checked_config(loss_type=loss_type, max_new_tokens=6, mask_truncated_completions=masked)
    want = trl_advantages(TRL_REWARDS, "group")
    loss_mask = magrpo.loss_mask(rollout, [EOS] if cfg.mask_truncated_completions else None)
    lp_ours = lp.clone().requires_grad_()
    loss = policy_loss(lp_ours, loss_mask, want, cfg.loss_type,
                       magrpo.loss_normalizer(loss_mask, cfg.loss_type, cfg.max_new_tokens))
    loss.backward()
    trl_mask = mask.float()
    if masked:  # TRL: a completion whose last token is not EOS (or pad) is truncated: its mask is 0
        trl_mask = trl_mask * torch.tensor([ends]).T
    lp_trl = lp.clone().requires_grad_()
    ratio = torch.exp(lp_trl - lp_trl.detach())
    trl_loss(-want[:, None] * ratio, trl_mask, loss_type, 6).backward()
    value = trl_loss(-want[:, None] * lp, trl_mask, loss_type, 6)
    case = f"--loss-type {loss_type}" + " --mask-truncated-completions" * masked
    assert loss.item() == pytest.approx(value.item(), rel=1e-5), f"{case}: {loss.item()} != {value.item()}"
    assert torch.allclose(lp_ours.grad, lp_trl.grad, atol=1e-6), f"{case}: gradients differ"
    if masked:
        assert not lp_ours.grad[[1, 5]].any()  # the truncated rows learn nothing


def expect_return(reward, children, gamma, want):
    got = node_return(reward, children, gamma)
    call = f"node_return({reward!r}, {children!r}, {gamma})"
    if type(got) is not float:
        pytest.fail(f"{call} returned {type(got).__name__} {got!r}; want a Python float (float(...) of it): "
                    "episode_returns makes a tensor of the returns, and a reward may be an env's number, a "
                    "tensor or a ScoreError", pytrace=False)
    if got != pytest.approx(want):
        total = sum(float(c) for c in children)
        hints = {float(reward) + gamma * total: "the children's sum, not their mean",
                 gamma * (float(reward) + total / max(1, len(children))):
                 "gamma times the node's own reward too (R_t = r_t + gamma * mean of the children)"}
        named = [f"\nyours is {words}" for value, words in hints.items() if got == pytest.approx(value)]
        pytest.fail(f"{call} = {got}; want {want}" + "".join(named[:1]), pytrace=False)


def test_node_return_by_hand():
    expect_return(2.0, [], 0.9, 2.0)  # a leaf: its reward
    expect_return(1.0, [2.0, 4.0], 0.9, 1.0 + 0.9 * 3.0)
    expect_return(1.0, [2.0, 4.0], 0.0, 1.0)
    expect_return(1.5, [3.0], 1.0, 4.5)


def test_node_return_is_a_float_whatever_the_rewards_type():
    """A reward or a child's return may be a tensor element, an int, or a ScoreError (no verdict: its
    float is NaN, and so is the return): the return is a Python float."""
    expect_return(torch.tensor(1.0), [torch.tensor(1.0)], 0.5, 1.5)
    expect_return(1, [2, 4], 0.5, 2.5)
    unjudged = node_return(magrpo.ScoreError("raised"), [1.0, 3.0], 0.5)
    assert type(unjudged) is float and math.isnan(unjudged)
    expect_return(torch.tensor(2.0), [], 0.9, 2.0)


def test_node_return_of_a_solved_node_is_an_absorbing_state():
    """A solved node keeps its reward for the turns it skips: r + gamma r + gamma^2 r ..."""
    assert magrpo.solved_return(4.0, 0, 0.9) == 4.0  # at the last turn: its reward
    assert magrpo.solved_return(4.0, 1, 0.9) == pytest.approx(4.0 + 0.9 * 4.0)
    assert magrpo.solved_return(4.0, 2, 0.5) == pytest.approx(4.0 + 0.5 * 4.0 + 0.25 * 4.0)
    assert magrpo.solved_return(3.0, 2, 0.0) == 3.0


def expect_joint(num_agents, G, mode, want):
    """joint_actions(num_agents, G, mode) must be `want`; the usual mistakes are named in the failure."""
    got = magrpo.joint_actions(num_agents, G, mode)
    if got == want:
        return
    hints = [(got == [tuple(reversed(a)) for a in want], "the agents reversed: (g_0, ..., g_{n-1}), agent 0 first "
              "and the last agent's index changing fastest (itertools.product's order)"),
             (got == list(range(G)), "plain ints: each joint action is a tuple, one index per agent"),
             (mode == "cross" and got == [(g,) * num_agents for g in range(G)], "aligned: cross is every combination"),
             (got is not None and sorted(map(tuple, got)) == sorted(want) and got != want, "another order: the "
              "joint actions' order is itertools.product's, which the rewards' columns follow")]
    named = "".join(f"\nyours is {words}" for hit, words in hints if hit)
    pytest.fail(f"joint_actions({num_agents}, {G}, {mode!r}) = {got!r}; want {want!r}{named}", pytrace=False)


def test_joint_actions_and_credited_returns():
    expect_joint(2, 3, "aligned", [(0, 0), (1, 1), (2, 2)])
    expect_joint(2, 2, "cross", [(0, 0), (0, 1), (1, 0), (1, 1)])
    expect_joint(3, 2, "cross", list(itertools.product(range(2), repeat=3)))
    cross = magrpo.joint_actions(2, 2, "cross")
    rewards = torch.tensor([[1.0, 2.0, 3.0, 6.0]])  # R(0,0)=1, R(0,1)=2, R(1,0)=3, R(1,1)=6
    a0, a1 = magrpo.credited_returns(rewards, cross, 2, 2)
    assert torch.allclose(a0, torch.tensor([[1.5, 4.5]]))  # agent 0's g: mean over agent 1's choices
    assert torch.allclose(a1, torch.tensor([[2.0, 4.0]]))
    aligned = torch.tensor([[1.0, 5.0, 2.0]])
    for c in magrpo.credited_returns(aligned, magrpo.joint_actions(3, 3), 3, 3):
        assert torch.equal(c, aligned)
    assert len(magrpo.joint_actions(3, 2, "cross")) == 8

# -----------------------------------------------------------------------------
# The multi-turn tree (Sec. 3) on scripted rewards: expand_nodes, episode_returns, episode_advantages


def scripted_turn(rewards, groups_parents, size=2, joint=None, num_agents=2, threshold=4.0):
    """A Turn with the given rewards ([groups][J]) and no model: what the tree functions read; a node
    whose reward reaches `threshold` is solved, as sample_turn marks it."""
    joint = joint or magrpo.joint_actions(num_agents, size)
    groups = [magrpo.Group(0, parent, [], [], 0) for parent in groups_parents]
    flat = [r for row in rewards for r in row]
    solved = [r >= threshold for r in flat]
    return magrpo.Turn(groups, size, [None] * num_agents, joint, [("", "")] * len(flat), flat, solved)


def test_turn_zero_advantage_groups_counts_groups_where_every_agent_learns_nothing():
    """Three groups of 2 rows: group 0 all zero for both agents, group 1 zero for agent 0 only, group
    2 with a signal for both: one group teaches nothing."""
    turn = scripted_turn([[1.0, 1.0], [1.0, 2.0], [0.0, 3.0]], [None, None, None])
    turn.advantages = [torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0, 1.0]),
                       torch.tensor([0.0, 0.0, -0.5, 0.5, -1.0, 1.0])]
    assert turn.zero_advantage_groups() == 1
    turn.advantages[1][2:4] = 0.0  # now group 1 teaches nothing either
    assert turn.zero_advantage_groups() == 2


def test_expand_nodes_best_all_and_termination():
    def turn(threshold):
        return scripted_turn([[1.0, 3.0], [2.0, 2.0]], [None, None], threshold=threshold)
    assert magrpo.expand_nodes(turn(4.0), "best") == [1, 2]  # group 1's tie goes to the first
    assert magrpo.expand_nodes(turn(4.0), "all") == [0, 1, 2, 3]
    assert magrpo.expand_nodes(turn(3.0), "best") == [1, 2]  # best: solved, its group is not
    assert turn(3.0).solved == [False, True, False, False]
    assert magrpo.expand_nodes(turn(3.0), "all") == [0, 2, 3]  # all: a solved node is not revised
    assert magrpo.expand_nodes(turn(2.0), "best") == [1]  # group 1 is all solved: done
    assert magrpo.expand_nodes(turn(2.0), "all") == [0]


def test_turn_names_the_tree():
    """Node n of a turn is group n // J's joint action n % J, and place() is node()'s inverse."""
    t = scripted_turn([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [None, None], size=3)
    assert [t.node(k, j) for k in range(2) for j in range(3)] == list(range(6))
    assert [t.group_action(n) for n in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    cross = scripted_turn([[0.0] * 4], [None], joint=magrpo.joint_actions(2, 2, "cross"))
    assert cross.node(0, 3) == 3 and cross.group_action(3) == (0, 3)


def test_episode_advantages_best_compares_each_turns_rewards_by_hand():
    """G = 4, 2 turns, expand best: turn-1 rewards [3, 2, 1, 0]; the best node (0) is revised and its
    children all score 3. With a return across turns the revised node would gain gamma * 3 and
    push the second-best below the mean; each turn's own rewards keep the turn-1 order."""
    t1 = scripted_turn([[3.0, 2.0, 1.0, 0.0]], [None], size=4)
    assert magrpo.expand_nodes(t1, "best") == [0]
    t1.children = {0: 0}
    t2 = scripted_turn([[3.0, 3.0, 3.0, 3.0]], [0], size=4)
    for gamma in (0.9, 0.0):
        cfg = magrpo.Config(num_generations=4, num_turns=2, discount=gamma)  # expand best: the default
        (a1, b1), (a2, b2) = magrpo.episode_advantages([t1, t2], cfg)
        assert a1.tolist() == b1.tolist() == [1.5, 0.5, -0.5, -1.5]
        assert a2.tolist() == b2.tolist() == [0.0] * 4


def test_episode_advantages_all_never_punish_a_solved_answer_by_hand():
    """G = 4, 2 turns, expand all, threshold = max = 4: turn-1 rewards [4, 3, 2, 1]; node 0 is solved,
    every child of nodes 1-3 scores 4, gamma 0.9. Returns [4 + 0.9 * 4, 3 + 3.6, 2 + 3.6, 1 + 3.6]:
    the solved answer covers the same two turns as its revised siblings, and leads them."""
    t1 = scripted_turn([[4.0, 3.0, 2.0, 1.0]], [None], size=4)
    assert magrpo.expand_nodes(t1, "all") == [1, 2, 3] and t1.solved[0]
    t1.children = {1: 0, 2: 1, 3: 2}
    t2 = scripted_turn([[4.0] * 4] * 3, [1, 2, 3], size=4)
    r1, r2 = magrpo.episode_returns([t1, t2], gamma=0.9, num_turns=2)
    assert r1[0].tolist() == pytest.approx([7.6, 6.6, 5.6, 4.6]) and r2.tolist() == [[4.0] * 4] * 3
    cfg = magrpo.Config(num_generations=4, num_turns=2, discount=0.9, expand="all")
    (a1, _), (a2, _) = magrpo.episode_advantages([t1, t2], cfg)
    assert a1.tolist() == pytest.approx([1.5, 0.5, -0.5, -1.5]) and a2.tolist() == [0.0] * 12


def test_episode_returns_of_a_leaf_neither_solved_nor_at_the_last_turn_is_its_reward():
    """An --expand best tree: turn 1 [1, 3], only node 1 revised (into [2, 4]); node 0 is neither solved
    nor at the last turn, and its return is its reward, 1, not a solved answer's 1 + 0.5 * 1."""
    t1 = scripted_turn([[1.0, 3.0]], [None], threshold=5.0)
    assert magrpo.expand_nodes(t1, "best") == [1]
    t1.children = {1: 0}
    t2 = scripted_turn([[2.0, 4.0]], [1], threshold=5.0)
    r1, r2 = magrpo.episode_returns([t1, t2], gamma=0.5, num_turns=2)
    assert r1.tolist() == [[1.0, 3.0 + 0.5 * 3.0]] and r2.tolist() == [[2.0, 4.0]]


def test_episode_advantages_all_with_early_termination_at_turn_two_of_three_by_hand():
    """G = 2, 3 turns, expand all, threshold 4, gamma 0.5. Turn 1 [4, 1]: node 0 solved, node 1
    revised into turn 2's [4, 2]: its node 0 solved, node 1 revised into turn 3's [3, 1].
    Returns: turn 3 [3, 1]; turn 2 [4 + 0.5 * 4, 2 + 0.5 * 2] = [6, 3];
    turn 1 [4 + 0.5 * 4 + 0.25 * 4, 1 + 0.5 * (6 + 3) / 2] = [7, 3.25]."""
    t1 = scripted_turn([[4.0, 1.0]], [None])
    assert magrpo.expand_nodes(t1, "all") == [1]
    t1.children = {1: 0}
    t2 = scripted_turn([[4.0, 2.0]], [1])
    assert magrpo.expand_nodes(t2, "all") == [1]
    t2.children = {1: 0}
    t3 = scripted_turn([[3.0, 1.0]], [1])
    returns = magrpo.episode_returns([t1, t2, t3], gamma=0.5, num_turns=3)
    assert [r.tolist() for r in returns] == [[[7.0, 3.25]], [[6.0, 3.0]], [[3.0, 1.0]]]
    cfg = magrpo.Config(num_generations=2, num_turns=3, discount=0.5, expand="all")
    (a1, _), (a2, _), (a3, _) = magrpo.episode_advantages([t1, t2, t3], cfg)
    assert a1.tolist() == [1.875, -1.875] and a2.tolist() == [1.5, -1.5] and a3.tolist() == [1.0, -1.0]


def random_tree(rng, expand, G=3, T=3, top=4.0):
    """A scripted multi-turn tree: rewards drawn from {0, 1, ..., top}, children by expand_nodes."""
    turns, parents = [], [None]
    for t in range(T):
        turn = scripted_turn([[float(rng.randint(0, int(top))) for _ in range(G)] for _ in parents], parents,
                             size=G, threshold=top)
        turns.append(turn)
        nodes = magrpo.expand_nodes(turn, expand)
        if t == T - 1 or not nodes:
            break
        turn.children = {node: k for k, node in enumerate(nodes)}
        parents = nodes
    return turns


def test_episode_advantages_a_solved_answer_never_trails_a_revised_sibling():
    """On random trees (threshold = max): with `all` a solved node has the highest advantage of its
    group; with `best` every turn's advantages keep the order of that turn's rewards."""
    import random
    rng = random.Random(0)
    for _ in range(200):
        for expand in ("all", "best"):
            turns = random_tree(rng, expand)
            cfg = magrpo.Config(num_generations=3, num_turns=3, expand=expand, discount=0.9)
            for turn, (adv, _) in zip(turns, magrpo.episode_advantages(turns, cfg)):
                for k, (a, r) in enumerate(zip(adv.view(-1, 3), turn.values())):
                    solved = [j for j in range(3) if turn.solved[k * 3 + j]]
                    if expand == "all":
                        assert all(a[j] >= a.max() - 1e-5 for j in solved), (turn.values(), a)
                    else:
                        assert all((a[i] - a[j]) * (r[i] - r[j]) >= 0 for i in range(3) for j in range(3))


def test_episode_advantages_cross_credits_each_completion():
    """cross: a completion's return is the mean over the joint actions it takes part in."""
    t = scripted_turn([[1.0, 2.0, 3.0, 6.0]], [None], joint=magrpo.joint_actions(2, 2, "cross"))
    (a0, a1), = magrpo.episode_advantages([t], magrpo.Config(num_generations=2, joint="cross"))
    assert a0.tolist() == [-1.5, 1.5] and a1.tolist() == [-1.0, 1.0]

# -----------------------------------------------------------------------------
# Config


@pytest.mark.parametrize("field, value, flag", [
    ("num_turns", 0, "--num-turns"), ("discount", 1.5, "--discount"), ("discount", -0.1, "--discount"),
    ("expand", "some", "--expand"), ("feedback", "loud", "--feedback"), ("top_p", 0.0, "--top-p"),
    ("temperature", -1.0, "--temperature"), ("loss_type", "x", "--loss-type"),
    ("advantage", "max", "--advantage"), ("scale_rewards", "std", "--scale-rewards"),
    ("max_grad_norm", -1.0, "--max-grad-norm"),
    ("joint", "all", "--joint"), ("top_k", -1, "--top-k"),
])
def test_config_rejects_a_bad_value_naming_its_flag(field, value, flag):
    with pytest.raises(ValueError, match=f"^{flag}: "):
        runs.checked_config(**{field: value})


def test_config_refuses_a_value_no_step_knows():
    """A Config made in Python is plain, but a choice no step knows would change nothing, silently (TRL's
    dapo read as seq_sum): it is refused, and runs.checked_config is the way to TRL's names."""
    for name, value in (("loss_type", "dapo"), ("advantage", "std"), ("joint", "all"), ("feedback", "loud")):
        with pytest.raises(ValueError, match=f"^Config.{name}: use one of "):
            magrpo.Config(**{name: value})
    assert runs.checked_config(loss_type="dapo").loss_type == "token_mean"


def test_config_resolves_trls_loss_types_and_advantage_std_to_ours():
    """One place (runs.SPELLINGS) turns TRL's names, and --advantage std, into our settings; the
    defaults stay the paper's: --advantage mean --scale-rewards none --loss-type seq_sum, no truncation
    mask, no clipping."""
    for trl, ours in (("grpo", "seq_mean"), ("dapo", "token_mean"), ("bnpo", "token_mean"),
                      ("dr_grpo", "token_budget")):
        assert runs.checked_config(loss_type=trl).loss_type == ours
    for given in ({"advantage": "std"}, {"advantage": "std", "scale_rewards": "group"}):
        cfg = runs.checked_config(**given)
        assert (cfg.advantage, cfg.scale_rewards) == ("mean", "group")
    with pytest.raises(ValueError, match="^--scale-rewards: --advantage std sets it to group, got 'batch'"):
        runs.checked_config(advantage="std", scale_rewards="batch")
    with pytest.raises(ValueError, match="^--loss-type: use one of seq_sum, .*, grpo, dapo, bnpo, dr_grpo"):
        runs.checked_config(loss_type="sapo")
    cfg = runs.checked_config()
    assert cfg == runs.checked_config(advantage="mean", scale_rewards="none", loss_type="seq_sum")
    assert (cfg.mask_truncated_completions, cfg.max_grad_norm) == (False, 0.0)


def test_group_advantages_of_advantage_std_are_the_original_grpos_z_score():
    """--advantage std, as README.md documents it: (R - mean R) / (std R + 1e-4), the unbiased std of
    the group; a group of equal rewards gets 0."""
    turn = scripted_turn(R, [None, None], size=4, joint=magrpo.joint_actions(2, 4))
    (a0, a1), = magrpo.episode_advantages([turn], runs.checked_config(num_generations=4, advantage="std"))
    want = [a / (STD + 1e-4) for a in [-2.0, -1.0, 0.0, 3.0]] + [0.0] * 4
    assert torch.allclose(a0, torch.tensor(want)) and torch.equal(a0, a1)


def test_config_turn_weights_need_one_per_turn():
    assert runs.checked_config(num_turns=2, turn_weights=[1.2, 0.8]).turn_weights == (1.2, 0.8)
    assert runs.checked_config(num_turns=2, turn_weights="1.2, 0.8").turn_weights == (1.2, 0.8)  # as the flag
    for bad in ([1.0], "1.2,x"):
        with pytest.raises(ValueError, match="^--turn-weights: "):
            runs.checked_config(num_turns=2, turn_weights=bad)

# -----------------------------------------------------------------------------
# The update: train_step on given turns (conftest.update_on)


def test_train_step_update_skips_a_non_finite_step(tok):
    model = models.tiny_model(tok)
    agent = models.Agent(model, tok, torch.optim.AdamW(model.parameters(), lr=1e-2))
    r = scripted_rollout(agent, ["a", "b"], 2, lambda b, g: TEXTS[b + g])
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match="non-finite"):
        out = update_on(agent, [(r, torch.tensor([1.0, float("nan"), -1.0, 0.0]))], magrpo.Config())
    assert out["skipped"] == 1
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_train_step_logs_the_drift_between_the_samplers_and_the_trainers_logprobs(tok):
    """logprob_drift_i: about 0 when the trainer sees the policy that sampled; large when it does not
    (here, log-probs the sampler never computed), the bug class the metric is there to catch."""
    model = models.tiny_model(tok, init_std=0.3)
    agent = models.Agent(model, tok, torch.optim.SGD(model.parameters(), lr=0.0))
    r = hand_rollout(model, tok, size=2)
    r.logprobs = reference_logprobs(model, r, temperature=0.7).float()  # what a sampler would record
    cfg = magrpo.Config(temperature=0.7)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)
    good = update_on(agent, [(r, advantages)], cfg)
    assert good["logprob_drift"] <= good["logprob_drift_max"] < 1e-5
    r.logprobs = torch.zeros_like(r.logprobs)
    bad = update_on(agent, [(r, advantages)], cfg)
    assert 0.1 < bad["logprob_drift"] < bad["logprob_drift_max"]  # the max beside the mean
    trained = r.completion_mask.bool()
    largest = reference_logprobs(model, r, 0.7)[trained].abs().max().item()
    assert bad["logprob_drift_max"] == pytest.approx(largest)
    assert update_on(agent, [(r, torch.zeros(8))], cfg)["logprob_drift"] is None  # no row trained


def test_train_step_update_steps_on_the_weighted_eq2_loss_of_every_turn(tok):
    """Two turns with weights and micro-batches: with SGD (lr 1) the step is minus the gradient of
    sum_t w_t * policy_loss(turn t), written out here on the whole batch."""
    torch.manual_seed(0)
    model = models.tiny_model(tok, init_std=0.3)
    ref = models.tiny_model(tok, init_std=0.3)
    before = [p.detach().clone() for p in model.parameters()]
    agent = models.Agent(model, tok, torch.optim.SGD(model.parameters(), lr=1.0))
    r1 = scripted_rollout(agent, ["ab", "c"], 2, lambda b, g: TEXTS[b + g])
    r2 = scripted_rollout(agent, ["abc d"], 3, lambda b, g: TEXTS[3 - g])
    a1, a2 = torch.tensor([0.5, -0.5, 1.0, -1.0]), torch.tensor([2.0, 0.0, -2.0])
    cfg = magrpo.Config(micro_batch_size=2, num_turns=2, turn_weights=(1.2, 0.8), loss_type="token_mean")
    out = update_on(agent, [(r1, a1), (r2, a2)], cfg)
    loss = sum(w * policy_loss(completion_logprobs(ref, r, 1.0), r.completion_mask, a, "token_mean")
               for r, a, w in ((r1, a1, 1.2), (r2, a2, 0.8)))
    loss.backward()
    assert out["loss"] == pytest.approx(loss.item(), abs=1e-5) and out["skipped"] == 0
    for p, b, q in zip(model.parameters(), before, ref.parameters()):
        assert torch.allclose(b - p, q.grad, atol=1e-5)
    assert sum(q.grad.abs().sum() for q in ref.parameters()) > 0


def test_train_step_update_clips_the_gradient_norm_with_max_grad_norm(tok):
    """--max-grad-norm c: with SGD (lr 1) the step is the gradient g times min(1, c / (|g| + 1e-6)), as
    torch's clip_grad_norm_ (TRL's); the logged grad_norm is |g|, before clipping."""
    model = models.tiny_model(tok, init_std=0.3)
    ref = models.tiny_model(tok, init_std=0.3)
    before = [p.detach().clone() for p in model.parameters()]
    agent = models.Agent(model, tok, torch.optim.SGD(model.parameters(), lr=1.0))
    r = scripted_rollout(agent, ["ab", "c"], 2, lambda b, g: TEXTS[b + g])
    advantages = torch.tensor([0.5, -0.5, 1.0, -1.0])
    policy_loss(completion_logprobs(ref, r, 1.0), r.completion_mask, advantages).backward()
    norm = math.sqrt(sum(float(q.grad.square().sum()) for q in ref.parameters()))
    out = update_on(agent, [(r, advantages)], magrpo.Config(max_grad_norm=norm / 4))
    assert out["grad_norm"] == pytest.approx(norm, rel=1e-5)
    for p, b, q in zip(model.parameters(), before, ref.parameters()):
        assert torch.allclose(b - p, q.grad * (norm / 4) / (norm + 1e-6), atol=1e-6)


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo"])
def test_train_step_update_with_mask_truncated_completions_skips_rows_without_eos(tok, loss_type):
    """--mask-truncated-completions: a row whose last token is not EOS (cut at max_new_tokens) gets no
    gradient and leaves dapo's token count (dr_grpo divides by rows x max_new_tokens, 50 here); with
    SGD (lr 1) the step is minus the gradient of TRL's loss on the other rows, written out here."""
    model = models.tiny_model(tok, init_std=0.3)
    ref = models.tiny_model(tok, init_std=0.3)
    before = [p.detach().clone() for p in model.parameters()]
    agent = models.Agent(model, tok, torch.optim.SGD(model.parameters(), lr=1.0))
    r = scripted_rollout(agent, ["ab", "c"], 2, lambda b, g: TEXTS[b + g])
    last = int(r.completion_mask[0].sum()) - 1
    r.completion_ids[0, last] = tok.eos_token_id + 1  # row 0 never reached EOS
    advantages = torch.tensor([0.5, -0.5, 1.0, -1.0])
    cfg = runs.checked_config(loss_type=loss_type, mask_truncated_completions=True, max_new_tokens=50)
    update_on(agent, [(r, advantages)], cfg)
    kept = r.completion_mask * torch.tensor([[0], [1], [1], [1]])
    total = (advantages[:, None] * completion_logprobs(ref, r, 1.0) * kept).sum()
    (-total / (kept.sum() if loss_type == "dapo" else 4 * 50)).backward()
    for p, b, q in zip(model.parameters(), before, ref.parameters()):
        assert torch.allclose(b - p, q.grad, atol=1e-5)
    assert sum(q.grad.abs().sum() for q in ref.parameters()) > 0


def test_tiny_model_saves_and_loads_back(tok, tmp_path):
    model = build(tok, "qwen2")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, tok2 = models.load_model(str(tmp_path / "m"))
    ids = tok(PROMPTS[0], return_tensors="pt")["input_ids"]
    assert torch.equal(tok2(PROMPTS[0], return_tensors="pt")["input_ids"], ids)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(ValueError, match="not a directory"):
        models.load_model(str(tmp_path / "missing"))


def test_completion_logprobs_prints_no_deprecation_warning():
    """transformers 5 names the KV cache `cache`: the old name warns on stderr (once per process, so
    a fresh process), as would any other deprecated use in the log-prob pass (the sampler's:
    test_sampler.py)."""
    import subprocess
    import sys
    code = """if True:
        import sys
        sys.path.insert(0, "tests")
        import magrpo, models
        from conftest import scripted_rollout
        tok = models.tiny_tokenizer()
        for arch in ("qwen2", "llama", "gpt2"):
            model = models.tiny_model(tok, arch=arch)
            rollout = scripted_rollout(models.Agent(model, tok), ["ab", "c"], 2, lambda b, g: "xy"[b:] * g)
            magrpo.completion_logprobs(model, rollout).sum().backward()
        """
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, cwd=root,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "deprecat" not in p.stderr.lower(), p.stderr
