"""Tests of rewards.py: the paper's leveled code reward (Sec. 4) and writing rewards (Sec. 5).

Rows that reach the tests level need sandbox.py (skipped without it); the rest, and the
fake-sandbox tests of the level logic, run anywhere and fast.
"""
import string
import sys
import types

import pytest

import rewards as R
from rewards import (CodeReward, arxiv_reward, code_reward, code_reward_many, extract_function,
                     prompt_imports, strip_fences, tldr_reward)

TEST = "def check(candidate):\n    assert candidate(1) == 3\n    assert candidate(2) == 5\n"
AUX = "def aux(x):\n    return 2 * x\n"


def f(body):
    """`def f(x):` with the given body lines."""
    return "def f(x):\n" + "".join(f"    {line}\n" for line in body.split("\n"))


# (id, aux output, main output, reward, reaches the tests level)
TABLE = [
    ("cooperates", AUX, f("y = aux(x)\nreturn y + 1"), 4.0, True),
    ("thin_wrapper", "def aux(x):\n    return 2 * x + 1\n", f("return aux(x)"), 3.0, True),
    ("no_aux_call", AUX, f("return 2 * x + 1"), 2.5, True),
    ("main_empty", AUX, "", 0.4, False),
    ("syntax_error", AUX, "def f(x): return (2 * x +", 1.0, False),
    ("half_pass", AUX, f("return aux(x) + (1 if x == 1 else 0)"), 3.5, True),
    ("none_pass", AUX, f("return aux(x) - 7"), 1.5, True),
    ("discards_result", AUX, f("aux(x)\nreturn 2 * x + 1"), 3.5, True),
    ("single_agent", "", f("return 2 * x + 1"), 2.1, True),
]


@pytest.fixture
def no_sandbox(monkeypatch):
    """Any import of sandbox fails: proves a code path runs no model code."""
    monkeypatch.setitem(sys.modules, "sandbox", None)


@pytest.fixture
def fake_sandbox(monkeypatch):
    """A sandbox where every test passes (2 of 2), recording the programs it was given."""
    fake = types.SimpleNamespace(jobs=[])

    def run_tests(program, test, entry_point, timeout=None):
        fake.jobs.append((program, test, entry_point))
        return types.SimpleNamespace(passed=2, total=2)

    def run_tests_many(jobs, workers=None, timeout=None):
        return [run_tests(*job) for job in jobs]

    fake.run_tests, fake.run_tests_many = run_tests, run_tests_many
    monkeypatch.setitem(sys.modules, "sandbox", fake)
    return fake

# -----------------------------------------------------------------------------
# code reward: the table (Sec. 4)


@pytest.mark.parametrize("aux,main,want,runs", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_code_reward_table(aux, main, want, runs):
    if runs:
        pytest.importorskip("sandbox")
    r = code_reward(aux, main, "f", TEST)
    assert isinstance(r, CodeReward)
    assert float(r) == pytest.approx(want)
    assert r.total == pytest.approx(r.structure + r.syntax + r.tests + r.coop)


def test_code_reward_many_matches_code_reward():
    pytest.importorskip("sandbox")
    items = [dict(aux=a, main=m, entry_point="f", test=TEST) for _, a, m, _, _ in TABLE]
    got = [float(r) for r in code_reward_many(items)]
    assert got == pytest.approx([t[3] for t in TABLE])


@pytest.mark.parametrize("exiting", ["exit(0)", "import sys; sys.exit(0)", "import os; os._exit(0)",
                                     "raise SystemExit"])
def test_code_that_exits_gets_no_test_credit(exiting):
    pytest.importorskip("sandbox")
    r = code_reward(AUX, f(f"{exiting}\nreturn 2 * x + 1"), "f", TEST)
    assert r.passed == 0 and r.tests == 0
    assert float(r) == pytest.approx(1.5)


def test_gated_levels_run_no_code(no_sandbox):
    assert float(code_reward(AUX, "", "f", TEST)) == pytest.approx(0.4)
    r = code_reward(AUX, "def f(x): return (2 * x +", "f", TEST)
    assert (r.structure, r.syntax, r.tests) == (pytest.approx(1.0), 0.0, 0.0)
    assert "SyntaxError" in r.syntax_error
    assert float(code_reward("", "prose only, no code", "f", TEST)) == 0.0


def test_levels_with_fake_sandbox(fake_sandbox):
    """L3 and the bonus from a report, independent of the real sandbox (all tests pass)."""
    want = {"cooperates": 4.0, "thin_wrapper": 3.0, "no_aux_call": 2.5, "half_pass": 4.0,
            "none_pass": 4.0, "discards_result": 3.5, "single_agent": 2.1}
    for name, aux, main, _, runs in TABLE:
        if runs:
            assert float(code_reward(aux, main, "f", TEST)) == pytest.approx(want[name]), name


def test_many_sends_only_parsing_programs(fake_sandbox):
    items = [dict(aux=a, main=m, entry_point="f", test=TEST) for _, a, m, _, _ in TABLE]
    rs = code_reward_many(items)
    runs = [t[4] for t in TABLE]
    assert len(fake_sandbox.jobs) == sum(runs)
    assert [r.n_tests == 2 for r in rs] == runs  # reports went back to the right items
    assert all(job[0] == r.program for job, r in zip(fake_sandbox.jobs, [r for r in rs if r.n_tests]))


def test_no_tests_passed_means_no_bonus(monkeypatch):
    fake = types.SimpleNamespace(run_tests=lambda *a, **k: types.SimpleNamespace(passed=0, total=3))
    monkeypatch.setitem(sys.modules, "sandbox", fake)
    r = code_reward(AUX, f("y = aux(x)\nreturn y + 1"), "f", TEST)
    assert r.calls_aux and r.coop == 0 and float(r) == pytest.approx(1.5)


def test_wrapper_shapes(fake_sandbox):
    doc = '"""Docstring."""'
    assert code_reward(AUX, f(f"{doc}\nreturn aux(x)"), "f", TEST).wrapper  # docstring ignored
    assert code_reward(AUX, f("v = aux(x)\nreturn v"), "f", TEST).wrapper
    assert not code_reward(AUX, f("v = aux(x)\nreturn v + 1"), "f", TEST).wrapper
    assert not code_reward(AUX, f("return [aux(y) for y in range(x)]"), "f", TEST).wrapper
    r = code_reward(AUX, f("[aux(y) for y in range(x)]\nreturn 3"), "f", TEST)
    assert r.calls_aux and not r.discards_aux  # a list built and dropped is not `aux(...)` alone
    r = code_reward(AUX, f("for y in range(x):\n    aux(y)\nreturn 3"), "f", TEST)
    assert r.discards_aux and r.coop == pytest.approx(1.0)


def test_nested_aux_shadows_helper(fake_sandbox):
    main = f("def aux(y):\n    return y\nreturn aux(x) + 2")
    r = code_reward(AUX, main, "f", TEST)
    assert not r.calls_aux and r.coop == 0


def test_aux_without_return(fake_sandbox):
    r = code_reward("def aux(x):\n    print(x)\n", f("return 2 * x + 1"), "f", TEST)
    assert r.structure == pytest.approx(0.6) and r.has_aux

# -----------------------------------------------------------------------------
# extraction


def test_strip_fences():
    text = "Sure! Here it is:\n```python\ndef f(x):\n    return 1\n```\nIt returns one."
    assert strip_fences(text) == "def f(x):\n    return 1"
    assert strip_fences("```\na = 1\n```\nthen\n```py\nb = 2\n```") == "a = 1\nb = 2"
    assert strip_fences("```python\ndef f(x):\n    return 1") == "def f(x):\n    return 1"  # cut off
    assert strip_fences("def f(x):\n    return 1") == "def f(x):\n    return 1"


@pytest.mark.parametrize("text", [
    "```python\ndef f(x):\n    return x + 1\n```",
    "Here is my solution.\n\n```python\ndef f(x):\n    return x + 1\n```\n\nThis adds one to x.",
    "Here is my solution:\ndef f(x):\n    return x + 1\nThis adds one to x.",
    "def f(x):\n    return x + 1\n\n\nprint(f(3))\nassert f(1) == 2\n",
    "```python\n    def f(x):\n        return x + 1\n```",
])
def test_extract_function_from_prose_and_fences(text):
    assert extract_function(text, "f") == "def f(x):\n    return x + 1"


def test_extract_drops_aux_redefined_in_main(fake_sandbox):
    main = "def aux(x):\n    return 0\n\ndef f(x):\n    return aux(x) + 1\n"
    assert extract_function(main, "f") == "def f(x):\n    return aux(x) + 1"
    r = code_reward(AUX, main, "f", TEST)
    assert "return 0" not in r.program and r.program.count("def aux") == 1


def test_extract_drops_other_helpers_keeps_nested():
    main = ("import math\n\nclass Box:\n    pass\n\ndef helper(x):\n    return x\n\n"
            "def f(x):\n    def inner(y):\n        return y * 2\n    return helper(inner(x))\n")
    got = extract_function(main, "f")
    assert got.startswith("def f(x):") and "def inner" in got
    assert "class Box" not in got and "def helper" not in got and "import math" not in got


def test_extract_body_only_completion():
    body = "    y = x * 2\n    return y + 1\n\n\ndef check(candidate):\n    pass\n"
    sig = 'def f(x):\n    """Doubles and adds one."""'
    assert extract_function(body, "f", signature=sig) == sig + "\n    y = x * 2\n    return y + 1"
    assert extract_function(body, "f") is None  # a body needs the header to be a function
    assert extract_function("    return x\n```\nDone.", "f", "def f(x):") == "def f(x):\n    return x"


def test_body_only_completion_scores(fake_sandbox):
    r = code_reward(AUX, "    return aux(x) + 1\n", "f", TEST, signature="def f(x):")
    assert float(r) == pytest.approx(4.0)


def test_extract_missing_function():
    assert extract_function("def g(x):\n    return x", "f") is None
    assert extract_function("I cannot solve this.", "f") is None
    assert extract_function("", "f") is None
    assert extract_function("def fx(x):\n    return x", "f") is None  # name must match exactly
    assert extract_function("def f(x): return (2 * x +", "f") == "def f(x): return (2 * x +"


def test_prompt_imports():
    prompt = ('from typing import List, Tuple\nimport math\n\n\ndef f(numbers: List[int]) -> int:\n'
              '    """ from the list, import nothing\n    >>> f([1])\n    1\n    """\n')
    assert prompt_imports(prompt) == "from typing import List, Tuple\nimport math"
    assert prompt_imports("def f(x):\n") == ""
    assert prompt_imports("from typing import (\n    List,\n    Dict,\n)\ndef f(): pass") == \
        "from typing import (\n    List,\n    Dict,\n)"


def test_imports_go_into_program(fake_sandbox):
    r = code_reward(AUX, f("return 3"), "f", TEST, imports="import math")
    assert r.program.startswith("import math\n")

# -----------------------------------------------------------------------------
# hostile outputs never raise


HOSTILE = {
    "empty": "",
    "none": None,
    "prose": "I think the answer is to double it and add one. Hope this helps!",
    "surrogate": "def f(x):\n    return '\ud800' + \udfff",
    "replacement": b"def f(x):\n    return 3 \xff\xfe\n".decode("utf-8", errors="replace"),
    "nul": "def f(x):\n    return 3\x00\n",
    "1MB_prose": "lorem ipsum " * 90_000,
    "1MB_bad_code": "def f(x):\n    return (" + "1 +" * 350_000,
    "deep_nesting": "def f(x):\n    return " + "(" * 50_000 + "1" + ")" * 50_000,
    "deep_unary": "def f(x):\n    return " + "-" * 200_000 + "1",
    "fences_only": "```\n```\n```python",
}


@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_outputs_never_raise(text, no_sandbox):
    # none of these parses into a runnable entry function, so no sandbox is needed
    for aux, main in ((text, text), (AUX, text)):
        r = code_reward(aux, main, "f", TEST)
        assert 0.0 <= float(r) <= 1.0 and r.syntax == 0
    for reward in (tldr_reward, arxiv_reward):
        for a, b in ((text, text), ("a b c d e f g h", text), (text, "a b c d e f g h")):
            assert 0.0 <= float(reward(a, b)) <= 3.0
    extract_function(text, "f", signature="def f(x):")


def test_hostile_that_parses_is_sanitised(fake_sandbox):
    r = code_reward(AUX, "def f(x):\n    return '\ud800'\n", "f", TEST)
    assert r.syntax == 0.5 and "\ud800" not in r.program  # surrogates would crash the pipe
    r = code_reward(AUX, b"def f(x):\n    return 3\n\xff\xfe", "f", TEST)  # raw bytes, junk after
    assert r.syntax == 0.5 and r.program.endswith("def f(x):\n    return 3\n")

# -----------------------------------------------------------------------------
# writing rewards (Sec. 5)

W = ["q" + a + b + "x" for a in string.ascii_lowercase for b in string.ascii_lowercase]  # nonsense
T1 = " ".join(W[:10])
CONNECTIVES = ["furthermore", "namely", "essentially", "therefore", "however", "nevertheless",
               "finally", "meanwhile", "indeed", "likewise", "unless", "overall"]  # 12 categories


def test_tldr_cases():
    assert float(tldr_reward("too short here", T1)) == 0.0
    assert float(tldr_reward(T1, T1)) == pytest.approx(0.5)  # ratio 1.0 < 1.1: stop at L2
    r = tldr_reward(T1, T1 + " " + T1)  # ratio ~2, unique-word ratio 1 < 1.3: stop at L3
    assert r.length_ratio == pytest.approx(2.02, abs=0.01) and float(r) == pytest.approx(1.5)
    r = tldr_reward(T1, T1 + " " + " ".join(W[:3]))  # ramp of L2
    assert 1.1 < r.length_ratio < 1.6
    assert float(r) == pytest.approx(0.5 + (r.length_ratio - 1.1) / 0.5)


def test_tldr_near_perfect():
    summary = " ".join(W[:10] * 2)
    own = W[100:120]
    detailed = W[:3] + CONNECTIVES + own  # 3 shared words, 35 unique
    while len(" ".join(detailed)) < 2.9 * len(summary):
        detailed.append(own[len(detailed) % len(own)])
    r = tldr_reward(summary, " ".join(detailed))
    assert r.length_ratio == pytest.approx(2.9, abs=0.05) and r.unique_ratio == pytest.approx(3.5)
    assert r.categories == 12 and r.transition == pytest.approx(0.95)
    assert 2.75 <= float(r) <= 3.0
    assert r.levels["style"] == pytest.approx(0.4 * 0.95 + 0.6 * 1.0)


def test_tldr_gating():
    # great L4 content (shared words, connectives) cannot count past a failed level
    summary = " ".join(W[:10])
    too_long = " ".join(W[:10] * 12 + CONNECTIVES)  # ratio > 5.0: stop after L1
    assert float(tldr_reward(summary, too_long)) == pytest.approx(0.5)
    same_words = " ".join(W[:10] * 4 + ["however", "therefore"])  # ratio ~4.4 in the ramp, u2/u1 1.2
    r = tldr_reward(summary, same_words)
    assert r.unique_ratio == pytest.approx(1.2) and set(r.levels) == {"structure", "length"}
    assert float(r) == pytest.approx(0.5 + (5.0 - r.length_ratio) / 1.8)


def test_transition_score_and_matching():
    assert R.transition_score(0) == 0.0
    assert R.transition_score(1) == pytest.approx(0.4)
    assert R.transition_score(12) == pytest.approx(0.95)
    assert R.transition_categories(" ".join(CONNECTIVES)) == set(R.TRANSITIONS)
    assert R.transition_categories("In  short, it is good.") == {"summary"}
    assert R.transition_categories("alsoso thusly ifx butter") == set()  # whole words only
    assert len(R.TRANSITIONS) == 12


def test_words_and_jaccard():
    assert R.words("Hello, World! Don't stop.") == ["hello", "world", "don't", "stop"]
    assert R.jaccard(["the", "cat", "sat"], ["the", "cat", "ran"]) == pytest.approx(1 / 3)
    assert R.jaccard(["the"], ["a"]) == 0.0  # only stopwords


def test_band_edges():
    band = R.TLDR.length_band
    assert R.band_score(1.1, band) == 0.0  # on the zero edge: 0 but not a stop
    assert R.band_score(1.0999, band) is None
    assert R.band_score(1.35, band) == pytest.approx(0.5)
    assert R.band_score(4.1, band) == pytest.approx(0.5)
    assert R.band_score(5.01, band) is None
    assert R.band_score(100.0, R.TLDR.unique_band) == 1.0


def test_arxiv_cases():
    assert float(arxiv_reward(" ".join(W[:10]), " ".join(W[10:20]))) == 0.0
    r = arxiv_reward(" ".join(W[:160]), " ".join(W[160:410]))
    assert r.length_ratio == pytest.approx(1.56, abs=0.01) and float(r) == pytest.approx(0.5)
    r = arxiv_reward(" ".join(W[:160]), " ".join(W[160:340]))  # ratio 1.125, nothing shared
    assert float(r) == pytest.approx(2.0) and r.levels["style"] == 0.0


def test_arxiv_counts_transitions_in_both_texts():
    background = " ".join(W[:159] + ["however"])
    methods = " ".join(W[160:339] + ["therefore"])
    assert arxiv_reward(background, methods).categories == 2
    assert tldr_reward(background, methods).categories == 1  # TLDR looks at output 2 only
