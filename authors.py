"""
The authors' released rewards, replicated exactly, to reproduce the paper's numbers (--authors-rewards).

Paper: arXiv 2508.04652, Sec. 4 (code) and Sec. 5 (writing). Our rewards (rewards.py) keep fixes to
theirs: a function cut out by the parse tree, tests as HumanEval runs them, whole-word connectives, a
bonus for a helper that main really uses. This module re-implements only what their first release does
differently (their text cleanup, extraction, wrapper rule, test loop, substring connectives and single-
agent cut) and shares rewards.py's levels (score_code, score_writing: the bands, gates and sums), so the
arithmetic of the two modes cannot drift apart. docs/rewards.md gives their sources and every place
where the two depart; the tests compare this replica with their code's outputs to the last bit.

reward_functions(authors) is the one switch an env reads: ours, or with authors=True theirs.

Try it: python -c "import authors; print(authors.writing_reward('A short summary.', 'A longer text.',
    authors.rewards.TLDR))"
"""
import ast
import re
from collections import namedtuple

import rewards

# The functions an env scores with, ours or the authors' (reward_functions, the one switch).
RewardFunctions = namedtuple("RewardFunctions", "code_many writing split_single")


def reward_functions(authors=False):
    """The one switch: our rewards (rewards.py), or with authors=True the authors' exact ones (below)."""
    if authors:
        return RewardFunctions(code_reward_many, writing_reward, split_single_output)
    return RewardFunctions(rewards.code_reward_many, rewards.writing_reward, rewards.split_single_output)


IMPORT_RE = re.compile(r"from\s+[\w.]+\s+import\s+.*$|import\s+[\w.,\s]+$")
PROSE = re.compile(r"[A-Z][a-z].*[.!?:]$")  # a sentence line, dropped from functions
CODE_MARK = re.compile(r"def |return |if |for |while |=|\(|\)|\[|\]")  # a line with one is code
_QUOTES = ('"""', "'''")
STOPWORDS = frozenset("""
a all also an and any are as at bad be been being both but by can could did do does each few first
for from good great had has have he her here him his how i if in is it its just last left little
long low many may me might more most much must my new no not now of old on only or other our own
right same shall should so some such than that the their them then there these they this those to
too us very was we were what when where which who why will with would you your
""".split())


def prompt_imports(prompt):
    """Their import lines: every line that is an import once stripped (HumanEval/115's, inside the
    function, too), deduplicated in order."""
    stripped = (line.strip() for line in rewards._raw(prompt).split("\n"))
    return "\n".join(dict.fromkeys(line for line in stripped if IMPORT_RE.match(line)))


def cleanup_code(code):
    """Their cleanup_code: fences removed (with the next line's indentation), then the blocks from
    each `def` line at any indentation (so a nested def ends its outer function), sentence-like
    lines dropped; "" when no def is left."""
    code = re.sub(r"```\s*\n?", "", re.sub(r"```python\s*\n?", "", code))
    lines = iter(code.split("\n"))
    out, base = [], None  # base is the indentation of the open def, None outside one
    for line in lines:
        stripped = line.strip()
        if re.match(r"\s*def\s+\w+\s*\(", line):
            if out:
                out.append("")  # their blocks are joined by a blank line
            out.append(line)
            base = len(line) - len(line.lstrip())
        elif base is not None:
            # Inside a block, blank lines, deeper lines and any tab-indented line belong to it.
            if not stripped or line.startswith((" " * (base + 1), "\t")):
                out.append(line)
            elif stripped.startswith(_QUOTES):
                # A docstring at the def's own indentation is kept whole, up to its closing quotes.
                out.append(line)
                if not (stripped.endswith(stripped[:3]) and len(stripped) > 3):
                    for more in lines:
                        out.append(more)
                        if stripped[:3] in more:
                            break
            else:
                # Any other line closes the block; lines outside every block are dropped.
                base = None
    # A line with a code mark stays; one without that reads as a sentence is prose, dropped.
    kept = [line for line in out if CODE_MARK.search(line) or not PROSE.match(line.strip())]
    result = "\n".join(kept).strip()
    return result if re.search(r"def\s+\w+\s*\(", result) else ""


def extract_function(code, name):
    """Their extract_specific_function: in the cleaned code, from the first `def name(` line (a
    later one, even nested, starts over) to the first line neither blank nor indented deeper."""
    pattern = re.compile(rf"\s*def\s+{re.escape(name)}\s*\(")
    found, base = None, 0
    for line in cleanup_code(code).split("\n"):
        if pattern.match(line):
            found, base = [line], len(line) - len(line.lstrip())
        elif found is not None:
            if line.strip() and not line.startswith((" " * (base + 1), "\t")):
                break
            found.append(line)
    return "" if found is None else "\n".join(found).strip()


def is_wrapper(func):
    """Their is_wrapper_function, on lines: with blanks, comments, `def ` lines and docstrings skipped,
    a wrapper is nothing, one line `return ...aux...`, or `v = aux(...)` then `return v`."""
    body, in_doc = [], False
    for line in func.split("\n"):
        stripped = line.strip()
        # A line starting with quotes opens a docstring unless it closes it too; only a later line that
        # holds quotes without starting with them closes it, so `"""` alone skips the rest.
        if stripped.startswith(_QUOTES):
            in_doc = in_doc or not (stripped.endswith(stripped[:3]) and len(stripped) > 3)
        elif in_doc:
            in_doc = not any(quotes in stripped for quotes in _QUOTES)
        elif stripped and not stripped.startswith(("#", "def ")):
            body.append(stripped)
    if not body:
        return True
    if len(body) == 1:
        return body[0].startswith("return ") and "aux" in body[0]
    if len(body) == 2:
        match = re.search(r"(\w+)\s*=\s*aux\s*\(", body[0])
        return bool(match) and body[1] == f"return {match.group(1)}"
    return False


def discards_aux(func):
    """Their check_aux_call_without_assignment: a line that is exactly `aux (x)` (one space, one
    character inside), so `aux(x)` never counts: the bug the paper's -0.5 never fires for."""
    return any(re.search(r"^aux\s\([^)]\)$", line.strip()) for line in func.split("\n"))


# Their test loop, one check() statement a test so that the sandbox times and counts each. For
# `assert f(args) == expected` they eval and format both sides for a log line (a second call, where
# an error fails the test), then exec the assert line, all in the program's globals.
RUNNER = """
def __authors_case(g, case, call):
    if call:
        actual, expected = eval(call[0], g), eval(call[1], g)
        format(expected, ""), format(actual, "")
    exec(case, g)
    return True


def check(candidate):
"""


def check_program(test, entry_point):
    """Their tests (extract_test_cases: check's lines that start `assert` and name candidate, up to
    a blank line and a `def`, deduplicated) as a check() that replays their loop; None if none."""
    check = re.search(r"def check\(candidate\):(.*?)(?=\n\ndef|\Z)", test, re.DOTALL)
    lines = [line.strip() for line in check.group(1).strip().split("\n")] if check else []
    cases = dict.fromkeys(line for line in lines if re.match(r"assert\s+[^\n]*candidate", line))
    if not cases:
        return None
    out = [RUNNER]
    for case in cases:
        case = case.replace("candidate", entry_point)
        # For `assert f(args) == expected`, the two sides their loop re-evaluates for its log line.
        match = re.search(r"assert\s+(\w+)\(([^)]*)\)\s*==\s*(.+)", case)
        call = (f"{match.group(1)}({match.group(2)})", match.group(3)) if match else None
        out.append(f"    assert __authors_case(globals(), {case!r}, {call!r})\n")
    return "".join(out)


def judge_text(item):
    """Their levels before the tests, as _judge_text. L1: 0.4 aux + 0.6 main, each if its text has
    `return` + whitespace (without main's, stop); L2: 0.5 if imports + aux + main pass ast.parse."""
    aux_fn = extract_function(rewards._raw(item.get("aux")), "aux")
    main_fn = extract_function(rewards._raw(item["main"]), item["entry_point"])
    # L1 looks in the text for `return` then whitespace, so `return(x)` is no return for them.
    aux_returns, main_returns = bool(re.search(r"return\s+", aux_fn)), bool(re.search(r"return\s+", main_fn))
    reward = rewards.CodeReward(structure=0.4 * aux_returns + 0.6 * main_returns, has_aux=bool(aux_fn),
                                has_main=bool(main_fn), authors=True)
    if not main_returns:
        return reward, None
    # Their program is the prompt's import lines (envs pass the problem's prompt), aux, then main.
    parts = [prompt_imports(item.get("prompt")), cleanup_code(aux_fn), cleanup_code(main_fn)]
    reward.program = "\n\n".join(part for part in parts if part)
    try:
        ast.parse(reward.program)
    except Exception as e:  # theirs caught SyntaxError only, so NUL bytes and surrogates crashed it
        reward.syntax_error = f"{type(e).__name__}: {e}"
        return reward, None
    reward.syntax = 0.5
    # The bonus's inputs come from the text, so `aux(` anywhere in main is a call, even in a comment.
    reward.calls_aux = re.search(r"\baux\s*\(", main_fn) is not None
    reward.wrapper, reward.discards_aux = is_wrapper(main_fn), discards_aux(main_fn)
    # None (no assert line) means no tests level and so no bonus, as in theirs.
    return reward, check_program(item["test"], item["entry_point"])


def code_reward_many(items, timeout=rewards.TEST_TIMEOUT, isolation=None):
    """Their code reward for a batch, as code_reward_many (item["prompt"]: the problem's prompt): no
    more tests after 3 timeouts, as theirs. A call of aux is theirs: its text (no count of aux's runs)."""
    return rewards._score_code(items, judge_text, dict(timeout=timeout, max_timeouts=3, isolation=isolation))


def transition_categories(text):
    """Theirs: a phrase counts anywhere in the lowercased text, even inside a word ("so" in "also")."""
    return rewards._categories_in(text.lower(), pad="")


def measures(first, second, connective_texts):
    """Their words (\\b\\w+\\b), substring connectives and Jaccard (1.0 when no word is left)."""
    words1, words2 = (re.findall(r"\b\w+\b", text.lower()) for text in (first, second))
    # One string for both texts, so a phrase may span the seam ("qzth" + "enqz" makes "then").
    found = transition_categories("".join(connective_texts))
    return words1, words2, found, rewards.jaccard(words1, words2, STOPWORDS, if_empty=1.0)


def writing_reward(text1, text2, spec):
    """Their writing reward, as writing_reward: the raw texts, so lengths count surrounding whitespace."""
    return rewards._score_writing(rewards._raw(text1), rewards._raw(text2), spec, measures)


def split_single_output(text):
    """Their cut of one output: at [PARAGRAPH_SPLIT], else "Paragraph 2:", else a third of the way."""
    text = rewards._raw(text).strip()
    # Without a marker, the first third of the characters (at least one) is the first part.
    return rewards._two_parts(text, (rewards._MARK, rewards._PARA2), cut=max(1, len(text) // 3))
