"""The course kit (tests/make_assignment.py): the handout it writes, the students' copy (the listed
functions blanked, no answer left, their tests failing), and what the tests of the six core functions
say to a student: an answer written another way than the reference passes them, and each known wrong
answer fails them with a message that names what differs. The kit leaves this file out of a
students' copy: the answers below, right and wrong, are a line away from the reference's."""
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KIT = [sys.executable, str(ROOT / "tests" / "make_assignment.py")]
sys.path.insert(0, str(ROOT / "tests"))
import make_assignment  # noqa: E402

SIX = ["sample_token", "decode_step", "completion_logprobs", "group_advantages", "policy_loss", "node_return"]


def kit(*args):
    return subprocess.run([*KIT, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)

# -----------------------------------------------------------------------------
# Answers written another way than the reference (each must pass its function's tests), and wrong
# answers made from them: (function, the mistake, the text of the right answer it replaces, by what,
# words the failure message must hold); a wrong answer that is not a small edit is written whole
# below, and named instead of a replacement.

RIGHT = {
    "sample_token": '''def sample_token(logits, temperature=1.0, top_p=1.0, top_k=0, uniform=None):
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, -1)
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, -1).values[:, -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p
        probs = probs * torch.zeros_like(probs).scatter(-1, order, (before < top_p).double())
        probs = probs / probs.sum(-1, keepdim=True)
    if uniform is None:
        uniform = torch.rand(probs.shape[0], dtype=torch.float64)
    cdf = probs.cumsum(-1)
    token = (cdf <= uniform.double()[:, None]).sum(-1)
    return token.clamp(max=probs.shape[-1] - 1)
''',
    "decode_step": '''def decode_step(model, cache, tokens, mask, positions, slot=None):
    kwargs = forward_kwargs(model, cache, slot=slot)
    out = model(input_ids=tokens.unsqueeze(1), attention_mask=mask, position_ids=positions.unsqueeze(1), **kwargs)
    return out.logits[:, -1].float()
''',
    "completion_logprobs": '''def completion_logprobs(model, rollout, temperature=1.0):
    T = temperature if temperature > 0 else 1.0
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
    L = rollout.completion_ids.shape[1]
    scores = torch.log_softmax(logits[:, -L - 1:-1].float() / T, -1)
    return scores.gather(-1, rollout.completion_ids[..., None]).squeeze(-1)
''',
    "group_advantages": '''def group_advantages(rewards, mode="mean", baseline=None, scale="none"):
    r = rewards.float() if isinstance(rewards, torch.Tensor) else torch.tensor(rewards, dtype=torch.float32)
    if r.shape[-1] < 2 or mode not in ("mean", "rloo", "none", "remax"):
        raise ValueError("a group of at least 2, and a baseline of the four")
    groups = r.reshape(-1, r.shape[-1])
    if mode == "remax":
        bases = torch.tensor(baseline, dtype=torch.float32).reshape(-1).expand(len(groups))
    everyone = r[~r.isnan()]
    a = torch.zeros_like(groups)
    for i, group in enumerate(groups):
        judged = ~group.isnan()
        g = group[judged]
        G = len(g)
        if G < 2 or (mode == "remax" and bases[i].isnan()):
            continue
        if mode == "none":
            x = g
        elif mode == "remax":
            x = g - bases[i]
        elif mode == "rloo":
            x = g - (g.sum() - g) / (G - 1)
        else:
            x = g - g.mean()
        if scale == "group":
            x = x / (g.std() + 1e-4)
        elif scale == "batch":
            x = x / (everyone.std() + 1e-4)
        a[i, judged] = x
    a = a.reshape(r.shape)
    return a
''',
    "policy_loss": '''def policy_loss(logprobs, mask, advantages, loss_type="seq_sum", normalizer=None):
    m = mask.to(logprobs.dtype)
    adv = torch.as_tensor(advantages, dtype=logprobs.dtype).reshape(-1, 1)
    weighted = adv * logprobs * m
    if loss_type == "seq_mean":
        weighted = weighted / m.sum(-1, keepdim=True).clamp(min=1)
    if normalizer is None and loss_type == "token_budget":
        normalizer = m.numel()
    if normalizer is None:
        normalizer = m.sum() if loss_type == "token_mean" else m.shape[0]
    return -weighted.sum() / normalizer
''',
    "node_return": '''def node_return(reward, child_returns, gamma):
    value = float(reward)
    if len(child_returns) > 0:
        value = value + gamma * sum(float(c) for c in child_returns) / len(child_returns)
    return value
''',
}

WRONG = [
    ("sample_token", "a cumulative sum in sorted order (a valid sampler, but other tokens for the same seed)",
     "    cdf = probs.cumsum(-1)\n    token = (cdf <= uniform.double()[:, None]).sum(-1)\n",
     "    sorted_p, order = probs.sort(-1, descending=True)\n"
     "    index = (sorted_p.cumsum(-1) <= uniform.double()[:, None]).sum(-1, keepdim=True)\n"
     "    token = order.gather(-1, index.clamp(max=probs.shape[-1] - 1)).squeeze(-1)\n",
     "sorted order"),
    ("sample_token", "top_p cut before top_k", None, "SWAPPED_CUTS", "top_p cut before top_k"),
    ("sample_token", "the logits not divided by the temperature",
     "logits.double() / temperature", "logits.double()", "not divided by the temperature"),
    ("sample_token", "uniform ignored (torch.rand always)", "    if uniform is None:", "    if True:",
     "drew"),
    ("sample_token", "the token that crosses top_p left out of the nucleus",
     "(before < top_p)", "(sorted_p.cumsum(-1) < top_p)", "drew"),
    ("decode_step", "no position ids (padded rows take the wrong positions)",
     "position_ids=positions.unsqueeze(1), ", "", "rows whose prompt is left-padded"),
    ("decode_step", "no attention mask (padded rows attend to the padding)",
     "attention_mask=mask, ", "", "rows whose prompt is left-padded"),
    ("decode_step", "the cache not passed", "kwargs = forward_kwargs(model, cache, slot=slot)", "kwargs = {}",
     "did not see the cache"),
    ("completion_logprobs", "the logits not divided by the temperature",
     "T = temperature if temperature > 0 else 1.0", "T = 1.0", "yours are the log-probs at T = 1"),
    ("completion_logprobs", "temperature 0 divides by 0", "T = temperature if temperature > 0 else 1.0",
     "T = temperature", "T = 0 means T = 1"),
    ("completion_logprobs", "off by one: the logit at token t scores token t",
     "logits[:, -L - 1:-1]", "logits[:, -L:]", "the worst: row"),
    ("completion_logprobs", "the first token's logit (the prompt's last) left out, the rest shifted",
     "    scores = torch.log_softmax(logits[:, -L - 1:-1].float() / T, -1)\n"
     "    return scores.gather(-1, rollout.completion_ids[..., None]).squeeze(-1)\n",
     "    scores = torch.log_softmax(logits[:, -L:-1].float() / T, -1)\n"
     "    lp = scores.gather(-1, rollout.completion_ids[:, 1:, None]).squeeze(-1)\n"
     "    return torch.nn.functional.pad(lp, (0, 1))\n", "shifted by one"),
    ("completion_logprobs", "no position ids (left-padded rows shifted)",
     "position_ids=positions_from_mask(mask)", "position_ids=None", "left-padded"),
    ("completion_logprobs", "computed under torch.no_grad",
     "    logits = model(", "    with torch.no_grad():\n        logits = model(", "carry no gradient"),
    ("completion_logprobs", "the prompt's pass detached (its keys and values carry no gradient)",
     None, "DETACHED_PROMPT", "their gradient differs"),
    ("group_advantages", "the population std", "(g.std() + 1e-4)", "(g.std(correction=0) + 1e-4)",
     "population std"),
    ("group_advantages", "the std without its 1e-4: nan for a group of equal rewards",
     "(g.std() + 1e-4)", "g.std()", "add 1e-4"),
    ("group_advantages", "batch scaled by each group's std", "(everyone.std() + 1e-4)",
     "(g.std() + 1e-4)", "the std of all the rewards"),
    ("group_advantages", "rloo as mean", "g - (g.sum() - g) / (G - 1)", "g - g.mean()",
     "leave the completion's own reward out"),
    ("group_advantages", "mean divided by the std (GRPO's z-score where Eq. 1 has none)",
     "            x = g - g.mean()\n", "            x = (g - g.mean()) / (g.std() + 1e-4)\n",
     "mean is Eq. 1 alone"),
    ("group_advantages", "a reward without a verdict (NaN) read as 0",
     "        judged = ~group.isnan()\n", "        group = group.nan_to_num(0.0)\n        judged = ~group.isnan()\n",
     "without a verdict read as 0"),
    ("group_advantages", "a list returned", "    return a\n", "    return a.tolist()\n",
     "want a float tensor"),
    ("policy_loss", "the padding counted", "weighted = adv * logprobs * m", "weighted = adv * logprobs",
     "padding counted"),
    ("policy_loss", "the sign", "return -weighted.sum() / normalizer", "return weighted.sum() / normalizer",
     "the sign"),
    ("policy_loss", "normalizer ignored", "    if normalizer is None:", "    if True:",
     "divide by `normalizer`"),
    ("policy_loss", "token_mean divided by sequences",
     "m.sum() if loss_type == \"token_mean\" else m.shape[0]", "m.shape[0]", "seq_sum's value"),
    ("node_return", "a tensor returned", "    value = float(reward)\n", "    value = reward\n",
     "want a Python float"),
    ("node_return", "the children's sum", " / len(child_returns)", "", "the children's sum"),
    ("node_return", "gamma on the node's own reward too",
     "value = value + gamma * sum(float(c) for c in child_returns) / len(child_returns)",
     "value = gamma * (value + sum(float(c) for c in child_returns) / len(child_returns))",
     "gamma times the node's own reward"),
]

SWAPPED_CUTS = '''def sample_token(logits, temperature=1.0, top_p=1.0, top_k=0, uniform=None):
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, -1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p
        probs = probs * torch.zeros_like(probs).scatter(-1, order, (before < top_p).double())
        probs = probs / probs.sum(-1, keepdim=True)
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, -1).values[:, -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    if uniform is None:
        uniform = torch.rand(probs.shape[0], dtype=torch.float64)
    cdf = probs.cumsum(-1)
    token = (cdf <= uniform.double()[:, None]).sum(-1)
    return token.clamp(max=probs.shape[-1] - 1)
'''

DETACHED_PROMPT = '''def completion_logprobs(model, rollout, temperature=1.0):
    from transformers import DynamicCache
    T = temperature if temperature > 0 else 1.0
    P = rollout.prompt_ids.shape[1]
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    positions = positions_from_mask(mask)
    cache = DynamicCache()
    with torch.no_grad():
        out = model(input_ids=rollout.prompt_ids, attention_mask=rollout.prompt_mask,
                    position_ids=positions[:, :P], **forward_kwargs(model, cache))
    rest = model(input_ids=rollout.completion_ids, attention_mask=mask, position_ids=positions[:, P:],
                 **forward_kwargs(model, cache)).logits
    logits = torch.cat([out.logits[:, -1:], rest[:, :-1]], dim=1).float() / T
    scores = torch.log_softmax(logits, -1)
    return scores.gather(-1, rollout.completion_ids[..., None]).squeeze(-1)
'''


# cached_attention, not of the six: a right answer written another way (the cache written by
# assignment, each KV head repeated for its query heads), and its usual mistakes as edits of it,
# (the mistake, the text replaced, by what, words of the failure message), checked in this process.
RIGHT_ATTENTION = '''def cached_attention(query, key, value, cache, slot, mask, scale=None):
    keys, values = cache
    keys[:, :, slot] = key
    values[:, :, slot] = value
    group = query.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1)
    v = values.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)
'''
WRITES = "    keys[:, :, slot] = key\n    values[:, :, slot] = value\n"
ATTENTION_MISTAKES = [
    ("the key and value not written", WRITES, "", "key was not written into the cache"),
    ("the value not written", "    values[:, :, slot] = value\n", "", "value was not written into the cache"),
    ("written into a copy of the cache", "    keys, values = cache\n",
     "    keys, values = cache[0].clone(), cache[1].clone()\n", "in place"),
    ("written one position after slot", WRITES, WRITES.replace("slot]", "slot + 1]"), "want slot 5 alone"),
    ("the cache read before the write", WRITES,
     "    keys, values = keys.clone(), values.clone()\n" + WRITES.replace("keys[", "cache[0][").replace(
         "values[", "cache[1]["), "before its own key and value were written"),
    ("the mask not applied", "attn_mask=mask, ", "", "the mask was not added to the scores"),
    ("the scale ignored", ", scale=scale)", ")", "`scale` (0.3) was ignored"),
    ("repeat for repeat_interleave (query head h on KV head h % KV heads)", "repeat_interleave(group, dim=1)",
     "repeat(1, group, 1, 1)", "(repeat_interleave)"),
    ("the heads left in dim 1", "    return out.transpose(1, 2)\n", "    return out\n", "(transpose(1, 2))"),
    ("the packed heads unpacked in the wrong order",
     "    k = keys.repeat_interleave(group, dim=1)\n    v = values.repeat_interleave(group, dim=1)\n"
     "    out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale)\n"
     "    return out.transpose(1, 2)\n",
     "    rows, heads, _, dim = query.shape\n    packed = query.reshape(rows, keys.shape[1], group, dim)\n"
     "    out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=scale)\n"
     "    return out.transpose(1, 2).reshape(rows, 1, heads, dim)\n", "the right heads in another order"),
]


def attention_answer(old=None, new=None):
    """RIGHT_ATTENTION as a function, with `old` replaced by `new` (every occurrence) if given."""
    import torch
    source = RIGHT_ATTENTION if old is None else RIGHT_ATTENTION.replace(old, new)
    assert old is None or old in RIGHT_ATTENTION, old
    namespace = {"torch": torch, "F": torch.nn.functional}
    exec(source, namespace)
    return namespace["cached_attention"]


def wrong_answer(function, mistake):
    """The source of a wrong answer of WRONG."""
    for name, what, old, new, _ in WRONG:
        if (name, what) == (function, mistake):
            if old is None:
                return globals()[new]
            assert RIGHT[name].count(old) == 1, (name, what)
            return RIGHT[name].replace(old, new)
    raise KeyError(mistake)


def put(where, answers):
    """Write each function's answer ({name: its source}) into the modules of the copy `where`."""
    for name, source in answers.items():
        module = Path(where) / make_assignment.TEACHABLE[name][0]
        module.write_text(make_assignment.replace_function(module.read_text(), name, source))


# Two tests take half of a run of the six functions' tests (a torch.compile; a fresh interpreter) and
# name none of WRONG's mistakes: a run that looks for a wrong answer's message leaves them out, while
# the runs of right answers keep every test.
LONG = ("compiled_decode_step_keeps_few_graphs", "completion_logprobs_prints_no_deprecation_warning")


def failures(where, names, leave_out=()):
    """{function: [failure texts of its tests]} of a run of the functions' tests in `where` but the
    tests named in `leave_out`, and the number of tests each has."""
    expression = make_assignment.own_expression(names)
    if leave_out:
        expression = f"({expression}) and not ({' or '.join(leave_out)})"
    outcomes = make_assignment.run_tests(where, "-k", expression,
                                         paths=("tests/test_sampler.py", "tests/test_magrpo.py"))
    texts, counts = {}, {}
    for name in names:
        tests = [why for test, why in outcomes.items() if make_assignment.selects(name, test)]
        counts[name] = len(tests)
        texts[name] = [why for why in tests if why is not None]
    return texts, counts

# -----------------------------------------------------------------------------
# Fast: the list, --help, the handout


def test_list_names_each_function_with_its_points_and_grading_command():
    out = kit("--list").stdout
    for name, (module, _, expression, points) in make_assignment.TEACHABLE.items():
        line = rf"{name} +{re.escape(module)} +{points} points +pytest -k \"{expression}\""
        assert re.search(line, out), name


def test_help_keeps_the_line_breaks_of_its_examples():
    out = kit("--help").stdout
    assert "\n    python tests/make_assignment.py --list" in out
    assert "\n    python tests/make_assignment.py --grade STUDENT" in out and "--solutions" in out


def test_the_handout_holds_setup_order_deliverables_grading_final_check_and_experiments():
    text = make_assignment.assignment_text(SIX)
    sections = re.findall(r"^## (.*)$", text, flags=re.MULTILINE)
    assert sections == ["Setup", "Order of work", "The functions", "What is graded", "The final check",
                        "Written experiments"]
    assert "pip install -r requirements.txt" in text and 'pytest -m "not slow"' in text
    steps = re.findall(r"^\d+\. (.*)$", text, flags=re.MULTILINE)
    assert [re.match(r"`(\w+)`", step).group(1) for step in steps[:6]] == SIX
    assert "then `pytest -k generate`" in steps[1] and "the final check" in steps[6]
    for name in SIX:  # each function's problem: its signature, its docstring indented as in the module
        module, _, _, points = make_assignment.TEACHABLE[name]
        assert f"### `{name}` ({module}, {points} points)" in text
        assert f'Its tests: `pytest -k "{name}"`' in text
    assert "    the nucleus of what is left" in text  # a docstring's second line keeps its indentation
    assert "| `completion_mask` | [rows, T], long |" in text  # Rollout's fields
    assert "0.2372" in text and "logprob_drift_0" in text and "python train.py" in text
    for run in ("--advantage none", "--loss-type seq_mean", "--num-turns 2"):
        assert run in text
    assert "For the TA" not in text and "expected figures" not in text.lower()  # no answers to experiments
    assert re.search(r"50 points for the functions, 20 for the final check and the written experiments", text)


def test_course_md_gives_each_function_the_points_of_the_kits_list():
    sections = make_assignment.course_sections()
    for name, (_, _, _, points) in make_assignment.TEACHABLE.items():
        assert f"Points: {points}." in sections[name], name


def test_each_test_counts_for_the_one_function_it_checks():
    """Bug: 24 tests were named after both group_advantages and policy_loss, so `pytest -k` and grading
    counted each for both (a right policy_loss beside a wrong group_advantages lost policy_loss's points).
    Every test of the suite is selected by at most one function's -k expression."""
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    tests = [line for line in p.stdout.splitlines() if "::" in line]
    assert len(tests) > 500, p.stdout[-2000:]
    shared = {}
    for test in tests:
        owners = [name for name, (_, _, expression, _) in make_assignment.TEACHABLE.items()
                  if make_assignment.selects(expression, test)]
        if len(owners) > 1:
            shared[test] = owners
    assert not shared, f"{len(shared)} tests count for two functions, e.g. {next(iter(shared.items()))}"


def failure_of(test, monkeypatch, module, name, wrong, *args):
    """The failure message of `test(*args)` with `module.name` replaced by a wrong answer."""
    monkeypatch.setattr(module, name, wrong)
    with pytest.raises(pytest.fail.Exception) as failed:
        test(*args)
    monkeypatch.undo()
    return str(failed.value)


def test_the_usual_mistakes_of_each_blankable_function_are_named(monkeypatch):
    """Bug: group_advantages divided by the std in mean mode failed with raw numbers and a traceback,
    where policy_loss names its mistake. Each function a course can blank names its usual mistakes (those
    of the six core functions: WRONG, checked in a copy by the slow test below; here the others', and
    cached_attention's: ATTENTION_MISTAKES)."""
    import itertools
    import magrpo
    import eval as evaluation
    import rewards
    import torch
    import test_eval
    import test_magrpo
    import test_rewards

    def z_score(rewards, mode="mean", baseline=None, scale="none"):
        r = torch.as_tensor(rewards, dtype=torch.float32)
        return (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-4)
    message = failure_of(test_magrpo.test_group_advantages_eq1_by_hand, monkeypatch, test_magrpo,
                         "group_advantages", z_score)
    assert "yours is divided by the std: mean is Eq. 1 alone" in message
    with_replacement = lambda n, c, k: 1 - (1 - c / n) ** k  # noqa: E731
    message = failure_of(test_eval.test_pass_at_k_matches_brute_force, monkeypatch, evaluation, "pass_at_k",
                         with_replacement)
    assert "k draws with replacement" in message
    reversed_agents = lambda n, G, mode="aligned": [tuple(reversed(a)) for a in  # noqa: E731
                                                    itertools.product(range(G), repeat=n)] if mode == "cross" \
        else [(g,) * n for g in range(G)]
    message = failure_of(test_magrpo.test_joint_actions_and_credited_returns, monkeypatch, magrpo,
                         "joint_actions", reversed_agents)
    assert "the agents reversed" in message
    real_band = rewards.band_score
    zero_outside = lambda x, band: real_band(x, band) or 0.0  # noqa: E731
    message = failure_of(test_rewards.test_writing_reward_band_edges, monkeypatch, rewards, "band_score",
                         zero_outside)
    assert "0 outside the zero points" in message
    fenced = lambda text, name, signature=None: text.strip()  # noqa: E731
    message = failure_of(test_rewards.test_extract_function_from_prose_and_fences, monkeypatch, test_rewards,
                         "extract_function", fenced, "```python\ndef f(x):\n    return x + 1\n```")
    assert "the markdown fence kept" in message
    import sampler
    import test_sampler
    test = test_sampler.test_cached_attention_writes_at_slot_and_attends_as_by_hand
    monkeypatch.setattr(sampler, "cached_attention", attention_answer())  # written another way: it passes
    for case in [(4, 2, 0.3), (6, 2, None), (2, 2, 0.7)]:
        test(*case)
    monkeypatch.undo()
    for mistake, old, new, words in ATTENTION_MISTAKES:
        wrong = attention_answer(old, new)
        message = failure_of(test, monkeypatch, sampler, "cached_attention", wrong, 4, 2, 0.3)
        assert words in message, (mistake, message)


def test_the_students_copy_blanks_kept_floor_with_sample_token(tmp_path):
    """Bug: with sample_token blanked, kept_floor still held its exact top-k/top-p cut (the answer's
    hard half). kept_floor is the cut, sample_token calls it, and the kit blanks the two together."""
    import sampler
    import torch
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    calls = []
    real = sampler.kept_floor
    sampler.kept_floor = lambda *args: calls.append(args) or real(*args)
    try:
        sampler.sample_token(logits, 1.0, top_p=0.7, uniform=torch.tensor([0.5], dtype=torch.float64))
    finally:
        sampler.kept_floor = real
    assert calls, "sample_token makes its cut with kept_floor: one function computes the cut"
    out = tmp_path / "copy"
    make_assignment.make_students_copy(out, ["sample_token"])
    copy = (out / "sampler.py").read_text()
    for name in ("sample_token", "kept_floor"):
        assert f'raise NotImplementedError("{name}: write it' in copy
    cut = {line for line in make_assignment.body_lines((ROOT / "sampler.py").read_text(), "kept_floor") if len(line) >= 30}
    assert cut and not cut & {line.strip() for line in copy.split("\n")}
    assert "def kept_floor(logits" in (out / "ASSIGNMENT.md").read_text()


def test_blanking_keeps_the_signature_and_docstring_and_removes_the_body_and_its_comments():
    source = (ROOT / "magrpo.py").read_text()
    blanked = make_assignment.blank(source, "group_advantages")
    fn = make_assignment.find_function(blanked, "group_advantages")
    assert "Eq. 1 over the last dim" in make_assignment.ast.get_docstring(fn)
    assert [type(node).__name__ for node in fn.body] == ["Expr", "Raise"]
    assert 'raise NotImplementedError("group_advantages: write it' in blanked
    body = {line for line in make_assignment.body_lines(source, "group_advantages") if len(line) >= 30}
    assert body and not body & {line.strip() for line in blanked.split("\n")}
    assert "unbiased, as TRL" not in blanked  # a comment of the body


@pytest.mark.parametrize("args, why", [
    (["--functions", "no_such_function"], "unknown no_such_function"),
    (["--functions", ""], "--functions"),
])
def test_bad_input_is_one_line(tmp_path, args, why):
    p = kit(str(tmp_path / "out"), *args)
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and why in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_directory_is_refused(tmp_path):
    p = kit(str(tmp_path), "--functions", "group_advantages")
    assert p.returncode != 0 and "already exists" in p.stderr and p.stderr.count("\n") == 1

# -----------------------------------------------------------------------------
# Slow: the copies for real, and what the tests say to students


@pytest.mark.slow
def test_a_function_whose_tests_pass_blanked_is_refused(tmp_path):
    """The check itself: a copy where group_advantages is NOT blanked passes its tests, which the kit
    must call out (an assignment whose tests cannot fail grades nothing)."""
    make_assignment.copy_repository(tmp_path)
    with pytest.raises(SystemExit) as stop:
        make_assignment.check(tmp_path, ["group_advantages"])
    assert "group_advantages: its tests do not fail when it is blanked" in str(stop.value.code)


def files_that_name(words, left_out):
    """The test files of the repository, but those of `left_out`, whose text names one of `words`."""
    files = sorted((ROOT / "tests").glob("test_*.py"))
    return [f"tests/{f.name}" for f in files
            if f"tests/{f.name}" not in left_out and any(word in f.read_text() for word in words)]


@pytest.mark.slow
def test_the_students_copy_holds_no_answer_and_grades_an_answer_written_another_way(tmp_path, monkeypatch,
                                                                                   capsys):
    """completion_logprobs and node_return blanked: the copy has no kit tests, no row-by-row pass, no
    bench_logprobs.py, but a recording; its tests fail, the other tests that call the two are named
    by the error they raise; then a right answer written another way passes there, against the
    recording, and a wrong one fails with its message; grading gives the points.
    The kit runs in this process (main, as the command line does) and its check runs the fast
    suite's files that name the two, what the copy removes, or the recording's readers: only those
    can miss what was removed, and the waiting tests asked for below are among them (the whole fast
    suite took minutes)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two pytest runs at a time on 2 cores: a thread each
    out = tmp_path / "hw"
    files, helpers = make_assignment.ANSWERS["completion_logprobs"]
    removed = [Path(f).stem for f in files] + [helper for _, helper in helpers]
    suite = files_that_name(["completion_logprobs", "node_return", "reference_logprobs", "reference_gradient",
                             *removed], make_assignment.LEFT_OUT + files)
    assert "tests/test_magrpo.py" in suite and "tests/test_sampler.py" in suite, suite
    check = make_assignment.check
    monkeypatch.setattr(make_assignment, "check", lambda out, names: check(out, names, suite=suite))
    argv = ["make_assignment.py", str(out), "--functions", "node_return,completion_logprobs"]
    monkeypatch.setattr(sys, "argv", argv)
    make_assignment.main()
    stdout = capsys.readouterr().out
    lines = stdout.split("\n")
    assert "completion_logprobs, node_return blanked" in lines[0]
    waiting = r"\d+ other tests of the fast suite call node_return and wait for it \(test_magrpo"
    assert any(re.search(waiting, line) for line in lines), stdout
    assert "fail without calling a blanked function" not in stdout, stdout
    assert not (out / "tests" / "test_make_assignment.py").exists()
    assert not (out / "tests" / "bench_logprobs.py").exists()
    assert "def logprobs_row_by_row" not in (out / "tests" / "conftest.py").read_text()
    assert "def row_logprobs" not in (out / "magrpo.py").read_text()
    assert (out / make_assignment.RECORDING).exists() and (out / "ASSIGNMENT.md").exists()
    assert make_assignment.TA_SECTION not in (out / "docs" / "course.md").read_text()
    assert 'raise NotImplementedError("completion_logprobs: write it' in (out / "magrpo.py").read_text()
    put(out, {"completion_logprobs": RIGHT["completion_logprobs"], "node_return": RIGHT["node_return"]})
    forgot = wrong_answer("completion_logprobs", "the logits not divided by the temperature")
    shutil.copytree(out, tmp_path / "forgot")  # the three runs below, two at a time: each its own copy
    put(tmp_path / "forgot", {"completion_logprobs": forgot})
    with ThreadPoolExecutor(max_workers=2) as pool:
        right = pool.submit(failures, out, ["completion_logprobs", "node_return"])
        wrong = pool.submit(failures, tmp_path / "forgot", ["completion_logprobs"], LONG)
        grading = pool.submit(kit, "--grade", str(tmp_path / "forgot"), "--functions",
                              "completion_logprobs,node_return")
    texts, counts = right.result()
    assert counts["completion_logprobs"] >= 8 and not any(texts.values()), texts
    texts, _ = wrong.result()
    assert any("yours are the log-probs at T = 1" in text for text in texts["completion_logprobs"])
    graded = grading.result()
    assert re.search(r"node_return +\d+ of +\d+ tests pass +4.0 of 4 points", graded.stdout), graded.stdout
    assert "divide the logits by the temperature" in graded.stdout and "total" in graded.stdout


@pytest.mark.slow
def test_the_tas_copy_has_the_reference_bodies_and_the_expected_figures(tmp_path):
    p = kit(str(tmp_path / "ta"), "--functions", "group_advantages,policy_loss", "--solutions")
    assert p.returncode == 0, p.stderr[-2000:]
    solutions = (tmp_path / "ta" / "SOLUTIONS.md").read_text()
    assert "def group_advantages(" in solutions and "centered = (rewards - rewards.sum(-1" in solutions
    assert "population std" in solutions and "Expected figures" in solutions and "0.2372" in solutions
    assert (tmp_path / "ta" / "ASSIGNMENT.md").exists()


@pytest.mark.slow
def test_right_answers_written_another_way_pass_and_each_wrong_answer_is_named(tmp_path, monkeypatch):
    """On copies of the repository (its live reference): the RIGHT answers pass every test of the six
    functions; then, round by round, one wrong answer per function (the others right): each fails its
    function's tests with a message that holds the words of WRONG. Each round has its own copy, and
    the rounds run two at a time (the machine's 2 cores)."""
    # Two copies' pytest runs share the 2 cores: one torch thread each, or their threads oversubscribe.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rounds = {}
    for name, mistake, _, _, words in WRONG:
        rounds.setdefault(name, []).append((mistake, words))
    this = [{name: mistakes[k] for name, mistakes in rounds.items() if k < len(mistakes)}
            for k in range(max(len(mistakes) for mistakes in rounds.values()))]
    copies = []
    for k, wrong in enumerate([{}] + this):
        where = tmp_path / f"round{k}"
        make_assignment.copy_repository(where)
        put(where, RIGHT)
        put(where, {name: wrong_answer(name, mistake) for name, (mistake, _) in wrong.items()})
        copies.append((where, list(wrong) or SIX, LONG if wrong else ()))
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda job: failures(*job), copies))
    texts, counts = results[0]
    assert all(counts[name] for name in SIX) and not any(texts.values()), texts
    for wrong, (texts, _) in zip(this, results[1:]):
        for name, (mistake, words) in wrong.items():
            assert texts[name], f"{name}, {mistake}: its tests pass"
            assert any(words in text for text in texts[name]), (name, mistake, texts[name][:2])
