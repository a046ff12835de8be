"""
The shared rewards of the paper's collaboration tasks: one number R(a_1, a_2) per joint action.

Paper: arXiv 2508.04652. The rewards are *leveled*: a level adds only when the ones before it are
met, so an early failure gives a small, informative reward.

    code  (Sec. 4, max 4.0)  structure -> syntax -> tests -> cooperation bonus     code_reward
    TLDR  (Sec. 5, max 3.0)  tokens -> length ratio -> vocabulary -> style         tldr_reward
    arXiv (Sec. 5, max 3.0)  same levels, other numbers                             arxiv_reward
    single-agent writing: split_single_output(text) -> the two parts to score

Model code runs only in sandbox.py; the text levels never raise on model output (empty, prose,
broken unicode, NUL bytes, megabytes). authors=True: the values of the authors' first release
(README, "The authors' rewards, exactly").

Try it:
    python -c "import rewards; print(float(rewards.code_reward('def aux(x): return 2 * x',
        'def f(x): return aux(x) + 1', 'f', 'def check(candidate): assert candidate(1) == 3')))"
    python -m pytest tests/test_rewards.py -q
"""
import ast
import math
import re
import textwrap
from dataclasses import dataclass, field
from functools import reduce
from operator import add


def _raw(text):
    """Model output as the authors' code saw it: a str, nothing stripped or normalised."""
    if text is None:
        return ""
    return text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)


def _clean(text):
    """_raw, with lone surrogates (they crash compile() and pipes) as '?' and newlines as \\n."""
    text = _raw(text).encode("utf-8", errors="replace").decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _parse(code):
    """The ast of code, or None."""
    try:
        return ast.parse(code)
    except Exception:  # SyntaxError, ValueError (NUL bytes), RecursionError/MemoryError (nesting)
        return None

# -----------------------------------------------------------------------------
# Extraction (Sec. 4): from free-form model output to the one function we keep

_FENCE_RE = re.compile(r"^[ \t]*```", re.MULTILINE)


def strip_fences(text):
    """The code inside the markdown fences of (cleaned) text, all blocks joined (an unclosed one, cut
    by the token limit, keeps the rest); text without fences comes back unchanged."""
    if not _FENCE_RE.search(text):
        return text
    inside, keep = False, []
    for line in text.split("\n"):
        if _FENCE_RE.match(line):
            inside = not inside
        elif inside:
            keep.append(line)
    return "\n".join(keep)


def prompt_imports(prompt, authors=False):
    """The import lines of a HumanEval prompt: all of it the paper's program keeps (Sec. 4).
    authors=True: theirs, the lines that are imports once stripped (HumanEval/115's too), deduplicated."""
    if authors:
        kept = (line.strip() for line in _raw(prompt).split("\n"))
        return "\n".join(dict.fromkeys(s for s in kept if _AUTHORS_IMPORT_RE.match(s)))
    out, in_parens = [], False
    for line in _clean(prompt).split("\n"):
        if in_parens or re.match(r"import\s+\w|from\s+[\w.]+\s+import\b", line):
            out.append(line)
            # a parenthesised import continues until its closing parenthesis
            in_parens = (in_parens or "(" in line) and ")" not in line
    return "\n".join(out)


def _body(lines, indent):
    """The leading lines that are blank or indented deeper than `indent` columns: a def's body."""
    for line in lines:
        if line.strip() and len(line) - len(line.lstrip(" \t")) <= indent:
            return
        yield line


def _function_by_ast(text, name):
    """A top-level `def name` cut out of text that parses: exact, even with odd docstrings."""
    tree = _parse(text)
    for node in tree.body if tree else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            # from the `def` line: decorators would need imports the program does not have
            return "\n".join(text.split("\n")[node.lineno - 1:node.end_lineno])
    return None


def _function_by_lines(text, pattern):
    """The paper's line-based cut, for text that does not parse but has a `def name(` line (pattern):
    the outermost (then first) such line and the lines after it that are blank or deeper."""
    lines = text.split("\n")
    indent, start = min((len(m.group(1)), i) for i, line in enumerate(lines) if (m := pattern.match(line)))
    return textwrap.dedent("\n".join([lines[start], *_body(lines[start + 1:], indent)]).rstrip())


def extract_function(text, name, signature=None):
    """The source of function `name` in a model output, or None. Only `name` is kept (with its
    nested defs), as in the paper (Sec. 4); fenced code is searched first, then the raw text. With
    `signature` (its `def` line and docstring) a body-only output is completed."""
    text = _clean(text)
    pattern = re.compile(rf"^([ \t]*)(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", re.MULTILINE)
    for candidate in dict.fromkeys((strip_fences(text), text)):  # dedup keeps order
        lines = candidate.split("\n")
        first = next((line for line in lines if line.strip()), "")
        if signature and first.startswith((" ", "\t")) and not pattern.match(first):  # a body only
            return _clean(signature).rstrip() + "\n" + "\n".join(_body(lines, 0)).rstrip()
        if not pattern.search(candidate):
            continue  # no `def name(` line: skip parsing (megabytes of prose cost 0.5 s a parse)
        found = _function_by_ast(candidate, name) or _function_by_lines(candidate, pattern)
        if found:
            return found
    return None

# -----------------------------------------------------------------------------
# The code reward (Sec. 4): structure -> syntax -> tests -> cooperation bonus


@dataclass
class CodeReward:
    """One joint action's code reward by level, with what the levels looked at (for logs and
    multi-turn feedback); float(r) is the trainer's scalar."""
    structure: float = 0.0     # L1: 0.4 aux defined with a return + 0.6 entry function likewise
    syntax: float = 0.0        # L2: 0.5 if imports + aux + main parses
    tests: float = 0.0         # L3: passed / n_tests
    coop: float = 0.0          # bonus: +0.5 calls aux, +1.0 not a wrapper, -0.5 discards a result
    bonus: tuple = ()          # authors mode: coop's steps, in the order their code adds them
    passed: int = 0
    n_tests: int = 0
    has_aux: bool = False
    has_main: bool = False
    calls_aux: bool = False
    wrapper: bool = False
    discards_aux: bool = False
    syntax_error: str = ""
    sandbox_error: str | None = None  # the tests could not run (not the program's fault): no verdict
    program: str = field(default="", repr=False)   # what was (or would have been) run
    report: object = field(default=None, repr=False)  # sandbox's TestReport, when tests ran

    @property
    def total(self):  # one by one, as theirs: float sums depend on the order (sum() compensates in 3.12+)
        return reduce(add, self.bonus or (self.coop,), self.structure + self.syntax + self.tests)

    @property
    def levels(self):
        return dict(structure=self.structure, syntax=self.syntax, tests=self.tests, cooperation=self.coop)

    def __float__(self):
        return float(self.total)


def _has_return(func):
    """A `return` anywhere in func; on the text when it does not parse (L1 before L2)."""
    tree = _parse(func)
    if tree is None:
        return re.search(r"\breturn\b", func) is not None
    return any(isinstance(n, ast.Return) for n in ast.walk(tree))


def _is_aux_call(node):
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "aux"


def _is_wrapper(fn):
    """Only `return aux(...)`, or `v = aux(...)` then `return v` (a docstring before them aside):
    the main agent handed the whole job to the helper."""
    match fn.body[1:] if ast.get_docstring(fn, clean=False) is not None else fn.body:
        case [ast.Return(value=call)]:
            return _is_aux_call(call)
        case [ast.Assign(targets=[ast.Name(id=v)], value=call), ast.Return(value=ast.Name(id=w))]:
            return _is_aux_call(call) and v == w
    return False


def _aux_usage(main_func, name):
    """(calls aux, is a mere wrapper, discards an aux result) for main function `name`: a call
    by name, not shadowed by a nested `def aux`; a discarded result is a statement `aux(...)`."""
    tree = _parse(main_func)
    fn = next((n for n in (tree.body if tree else []) if getattr(n, "name", None) == name), None)
    if fn is None:
        return False, False, False
    nodes = list(ast.walk(fn))
    if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "aux" for n in nodes):
        return False, False, False
    calls = any(_is_aux_call(n) for n in nodes)
    discards = any(isinstance(n, ast.Expr) and _is_aux_call(n.value) for n in nodes)
    return calls, calls and _is_wrapper(fn), discards


def _judge_text(item):
    """L1 structure and L2 syntax, no code run: (r, the test to run), or (r, None) when the
    program stops before the tests."""
    r = CodeReward()
    aux_fn = extract_function(item.get("aux"), "aux") or ""
    main_fn = extract_function(item["main"], item["entry_point"], item.get("signature")) or ""
    r.has_aux, r.has_main = bool(aux_fn), bool(main_fn)
    r.structure = 0.4 * _has_return(aux_fn) + 0.6 * _has_return(main_fn)
    if not r.has_main:
        return r, None
    r.program = "\n\n\n".join(p for p in (_clean(item.get("imports")).strip(), aux_fn, main_fn) if p) + "\n"
    try:
        compile(r.program, "<program>", "exec", dont_inherit=True)
    except Exception as e:  # as in _parse
        r.syntax_error = f"{type(e).__name__}: {e}"
        return r, None
    r.syntax = 0.5
    if r.has_aux:
        r.calls_aux, r.wrapper, r.discards_aux = _aux_usage(main_fn, item["entry_point"])
    # the problem's own code that its test calls (HumanEval/32's poly) goes on the test's side
    setup = _clean(item.get("imports") if item.get("test_setup") is None else item["test_setup"])
    return r, (f"{setup}\n\n\n{item['test']}" if setup.strip() else item["test"])


def _judge_tests(r, report, authors):
    """L3 tests and the cooperation bonus (aux called by main, a test passed) from the sandbox's
    report; its infra_error (the sandbox failed: no verdict) is r.sandbox_error."""
    r.report, r.passed, r.n_tests = report, int(report.passed), int(report.total)
    r.sandbox_error = getattr(report, "infra_error", None)
    r.tests = r.passed / r.n_tests if r.n_tests > 0 else 0.0
    if r.passed > 0 and r.has_aux and r.calls_aux:
        steps = (0.5,) + ((1.0,) if not r.wrapper else ()) + ((-0.5,) if r.discards_aux else ())
        r.coop, r.bonus = sum(steps), (steps if authors else ())


def code_reward(aux, main, entry_point, test, imports="", signature=None, timeout=None,
                test_setup=None, authors=False):
    """The shared code reward of one joint action (Sec. 4): max 4.0, 2.1 with an empty aux. aux, main:
    raw outputs; test: `def check(candidate): ...`; imports: code before aux; signature: main's
    header, for a body-only output; timeout: per test (None: the sandbox's, or the authors' 10 s);
    test_setup: code the test needs (None: imports)."""
    item = dict(aux=aux, main=main, entry_point=entry_point, test=test, imports=imports,
                signature=signature, test_setup=test_setup)
    return code_reward_many([item], timeout=timeout, authors=authors)[0]


def code_reward_many(items, timeout=None, authors=False):
    """code_reward for a batch (the trainer's G x batch joint actions): the text levels here, then
    one sandbox.run_tests_many call for the programs that reach the tests; items: dicts of
    code_reward's arguments."""
    judged = [(_authors_judge_text if authors else _judge_text)(it) for it in items]
    todo = [i for i, (_, test) in enumerate(judged) if test is not None]
    if todo:
        import sandbox  # here: the writing rewards need no sandbox
        jobs = [(judged[i][0].program, judged[i][1], items[i]["entry_point"]) for i in todo]
        kw = dict(timeout=AUTHORS_TEST_TIMEOUT, max_timeouts=AUTHORS_MAX_TIMEOUTS) if authors else {}
        if timeout is not None:
            kw["timeout"] = timeout
        for i, report in zip(todo, sandbox.run_tests_many(jobs, **kw)):
            _judge_tests(judged[i][0], report, authors)
    return [r for r, _ in judged]

# -----------------------------------------------------------------------------
# The authors' code reward, exactly (authors=True): shady-cs15/LLM_Collab_Code_Generation@ae03036b
# rewards/code_rewards.py + code_utils.py, re-implemented; their tests run in our sandbox.

_AUTHORS_IMPORT_RE = re.compile(r"from\s+[\w.]+\s+import\s+.*$|import\s+[\w.,\s]+$")
_AUTHORS_ANY_DEF = re.compile(r"\s*def\s+\w+\s*\(")
_AUTHORS_PROSE = re.compile(r"[A-Z][a-z].*[.!?:]$")  # a sentence line, dropped from functions
_AUTHORS_CODE_MARKS = ("def ", "return ", "if ", "for ", "while ", "=", "(", ")", "[", "]")
_AUTHORS_CALL = re.compile(r"assert\s+(\w+)\(([^)]*)\)\s*==\s*(.+)")
_QUOTES = ('"""', "'''")
AUTHORS_TEST_TIMEOUT = 10.0  # seconds per test (their signal.alarm(10)), given up after 3 timeouts
AUTHORS_MAX_TIMEOUTS = 3


def _authors_cleanup(code):
    """Their cleanup_code: fences removed (with the next line's indentation), then the blocks from
    each `def` line at any indentation (so a nested def ends its outer function), sentence-like
    lines dropped; "" when no def is left."""
    code = re.sub(r"```\s*\n?", "", re.sub(r"```python\s*\n?", "", code))
    lines, out, base = iter(code.split("\n")), [], None  # base: the open def's indentation
    for line in lines:
        s = line.strip()
        if _AUTHORS_ANY_DEF.match(line):
            if out:
                out.append("")  # their blocks are joined by a blank line
            out.append(line)
            base = len(line) - len(line.lstrip())
        elif base is not None:
            if not s or line.startswith(" " * (base + 1)) or line.startswith("\t"):
                out.append(line)
            elif s.startswith(_QUOTES):  # a docstring at the def's own indentation: kept whole
                out.append(line)
                if not (s.endswith(s[:3]) and len(s) > 3):
                    for more in lines:
                        out.append(more)
                        if s[:3] in more:
                            break
            else:
                base = None
    kept = [line for line in out if any(mark in line for mark in _AUTHORS_CODE_MARKS)
            or not _AUTHORS_PROSE.match(line.strip())]
    result = "\n".join(kept).strip()
    return result if re.search(r"def\s+\w+\s*\(", result) else ""


def _authors_function(code, name):
    """Their extract_specific_function: in the cleaned code, from the first `def name(` line (a
    later one, even nested, starts over) to the first line neither blank nor indented deeper."""
    pattern, found, base = re.compile(rf"\s*def\s+{re.escape(name)}\s*\("), None, 0
    for line in _authors_cleanup(code).split("\n"):
        if pattern.match(line):
            found, base = [line], len(line) - len(line.lstrip())
        elif found is not None:
            if line.strip() and not line.startswith(" " * (base + 1)) and not line.startswith("\t"):
                break
            found.append(line)
    return "\n".join(found).strip() if found else ""


def _authors_is_wrapper(func):
    """Their is_wrapper_function, on lines: with blanks, comments, `def ` lines and docstrings
    skipped (quotes alone on a line open one that never closes), a wrapper is nothing, one line
    `return ...aux...`, or `v = aux(...)` then `return v`."""
    body, in_doc = [], False
    for line in func.split("\n"):
        s = line.strip()
        if not s:
            continue
        if s.startswith(_QUOTES):
            in_doc = in_doc or not (s.endswith(s[:3]) and len(s) > 3)
            continue
        if in_doc:
            in_doc = not any(q in s for q in _QUOTES)
            continue
        if not s.startswith(("#", "def ")):
            body.append(s)
    if not body:
        return True
    if len(body) == 1:
        return body[0].startswith("return ") and "aux" in body[0]
    if len(body) == 2:
        m = re.search(r"(\w+)\s*=\s*aux\s*\(", body[0])
        return bool(m) and body[1] == f"return {m.group(1)}"
    return False


def _authors_discards(func):
    """Their check_aux_call_without_assignment: a line that is exactly `aux (x)` (one space, one
    character inside), so `aux(x)` never counts."""
    return any(re.search(r"^aux\s\([^)]\)$", line.strip()) for line in func.split("\n"))


# Their test loop, one check() statement a test so that the sandbox times and counts each: for
# `assert f(args) == expected` they eval and format both sides for a log line (a second call; an
# error fails the test), then exec the assert line, all in the program's globals.
_AUTHORS_RUNNER = """
def __authors_case(g, case, call):
    if call:
        actual, expected = eval(call[0], g), eval(call[1], g)
        format(expected, ""), format(actual, "")
    exec(case, g)
    return True


def check(candidate):
"""


def _authors_check(test, entry_point):
    """Their tests (extract_test_cases: check's lines that start `assert` and name candidate, up to
    a blank line and a `def`, deduplicated) as a check() that replays their loop; None if none."""
    m = re.search(r"def check\(candidate\):(.*?)(?=\n\ndef|\Z)", test, re.DOTALL)
    lines = (line.strip() for line in m.group(1).strip().split("\n")) if m else ()
    cases = dict.fromkeys(s for s in lines if re.match(r"assert\s+[^\n]*candidate", s))
    out = [_AUTHORS_RUNNER]
    for case in (c.replace("candidate", entry_point) for c in cases):
        m = _AUTHORS_CALL.search(case)
        call = (f"{m.group(1)}({m.group(2)})", m.group(3)) if m else None
        out.append(f"    assert __authors_case(globals(), {case!r}, {call!r})\n")
    return "".join(out) if cases else None


def _authors_judge_text(item):
    """Their levels before the tests, as _judge_text. L1: 0.4 aux + 0.6 main, each if its text has
    `return` + whitespace (without main's, stop); L2: 0.5 if imports + aux + main pass ast.parse."""
    r = CodeReward()
    aux_fn = _authors_function(_raw(item.get("aux")), "aux")
    main_fn = _authors_function(_raw(item["main"]), item["entry_point"])
    r.has_aux, r.has_main = bool(aux_fn), bool(main_fn)
    aux_ok, main_ok = (re.search(r"return\s+", fn) is not None for fn in (aux_fn, main_fn))
    r.structure = 0.4 * aux_ok + 0.6 * main_ok
    if not main_ok:
        return r, None
    parts = (prompt_imports(item.get("imports"), authors=True), _authors_cleanup(aux_fn),
             _authors_cleanup(main_fn))
    r.program = "\n\n".join(p for p in parts if p)
    try:
        ast.parse(r.program)
    except Exception as e:  # theirs caught SyntaxError only: NUL bytes, surrogates crashed it
        r.syntax_error = f"{type(e).__name__}: {e}"
        return r, None
    r.syntax = 0.5
    r.calls_aux = re.search(r"\baux\s*\(", main_fn) is not None
    r.wrapper, r.discards_aux = _authors_is_wrapper(main_fn), _authors_discards(main_fn)
    return r, _authors_check(item["test"], item["entry_point"])  # None: no tests, no bonus

# -----------------------------------------------------------------------------
# The writing rewards (Sec. 5): tokens -> length ratio -> vocabulary -> style. TRANSITIONS: the
# authors' 12 categories and phrase lists (OpenMLRL/LLM_Collab_Writing rewards/tldr_rewards.py,
# first release); a phrase may sit in two ("indeed": explanation and emphasis).

TRANSITIONS = {
    "elaboration": ["furthermore", "moreover", "additionally", "also", "besides", "in addition",
                    "what is more", "not only", "as well as", "along with", "coupled with", "together with",
                    "likewise", "similarly", "equally important", "by the same token", "in the same way",
                    "correspondingly", "in like manner", "comparatively", "analogously"],
    "examples": ["for example", "for instance", "specifically", "particularly", "namely", "such as",
                 "including", "especially", "in particular", "to illustrate", "as an illustration",
                 "case in point", "to demonstrate", "as evidence", "to exemplify", "notably", "markedly",
                 "chiefly", "mainly", "primarily", "above all", "most importantly"],
    "explanation": ["that is", "in other words", "to put it simply", "to clarify", "indeed", "in fact",
                    "actually", "clearly", "obviously", "to put it another way", "to rephrase",
                    "more precisely", "specifically speaking", "what this means is", "the point is",
                    "essentially", "basically", "fundamentally", "at its core", "in essence", "simply put",
                    "stated differently"],
    "cause_effect": ["therefore", "thus", "consequently", "as a result", "hence", "accordingly",
                     "for this reason", "due to this", "because of this", "so", "then", "thereby",
                     "wherefore", "thence", "ergo", "as a consequence", "in consequence", "it follows that",
                     "this leads to", "this results in", "this causes", "this brings about", "owing to",
                     "on account of", "thanks to", "resulting from"],
    "contrast": ["however", "nevertheless", "nonetheless", "on the other hand", "in contrast", "while",
                 "whereas", "although", "even though", "despite this", "but", "yet", "still", "conversely",
                 "on the contrary", "rather", "instead", "alternatively", "otherwise", "in opposition",
                 "by contrast", "contrarily", "notwithstanding", "regardless", "all the same", "even so",
                 "be that as it may", "in any case", "at any rate"],
    "sequence": ["first", "second", "third", "next", "then", "after that", "finally", "lastly", "initially",
                 "subsequently", "meanwhile", "to begin with", "to start with", "in the beginning",
                 "at first", "at the outset", "primarily", "secondly", "thirdly", "following this",
                 "afterward", "later", "later on", "in the meantime", "simultaneously", "concurrently",
                 "at the same time", "in conclusion", "to conclude", "ultimately", "in the end",
                 "to summarize", "in summary"],
    "emphasis": ["indeed", "certainly", "surely", "undoubtedly", "without doubt", "definitely",
                 "absolutely", "positively", "unquestionably", "indubitably", "of course", "naturally",
                 "obviously", "clearly", "evidently", "manifestly", "undeniably", "admittedly", "granted",
                 "to be sure", "in fact", "as a matter of fact", "notably", "significantly"],
    "summary": ["in summary", "in conclusion", "to summarize", "to conclude", "in short", "in brief",
                "briefly", "to sum up", "on the whole", "overall", "all in all", "in essence",
                "essentially", "basically", "fundamentally", "in the final analysis", "after all",
                "ultimately", "in the end", "when all is said and done", "the bottom line is"],
    "comparison": ["similarly", "likewise", "in the same way", "equally", "just as", "comparable to",
                   "in comparison", "by the same token", "correspondingly", "in like manner",
                   "along the same lines", "in similar fashion", "analogously", "by analogy", "just like",
                   "much like", "as with"],
    "concession": ["although", "though", "even though", "while", "whereas", "despite", "in spite of",
                   "regardless of", "notwithstanding", "admittedly", "granted", "even if",
                   "be that as it may", "nevertheless", "nonetheless", "however", "yet", "still",
                   "all the same"],
    "condition": ["if", "unless", "provided that", "assuming that", "supposing that", "in case",
                  "in the event that", "on condition that", "given that", "as long as", "so long as",
                  "only if", "even if", "whether or not", "should", "were", "had", "otherwise", "or else"],
    "time": ["when", "while", "as", "after", "before", "until", "since", "during", "meanwhile",
             "simultaneously", "at the same time", "concurrently", "previously", "formerly", "earlier",
             "later", "afterward", "subsequently", "eventually", "finally", "recently", "lately",
             "nowadays", "currently", "presently", "immediately"],
}

# The function words Jaccard drops: ours, the usual English list, and theirs (authors=True; README).
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had
has have having he her here hers herself him himself his how i if in into is it its itself just
me more most my myself no nor not now of off on once only or other our ours ourselves out over own
same she should so some such than that the their theirs them themselves then there these they
this those through to too under until up very was we were what when where which while who whom
why will with would you your yours yourself yourselves
""".split())

AUTHORS_STOPWORDS = frozenset("""
a all also an and any are as at bad be been being both but by can could did do does each few first
for from good great had has have he her here him his how i if in is it its just last left little
long low many may me might more most much must my new no not now of old on only or other our own
right same shall should so some such than that the their them then there these they this those to
too us very was we were what when where which who why will with would you your
""".split())

_WORD_RE = re.compile(r"[^\W_]+(?:'[^\W_]+)*")  # letters/digits, inner apostrophes kept: "don't"
_AUTHORS_WORD_RE = re.compile(r"\b\w+\b")


@dataclass(frozen=True)
class WritingLevels:
    """The numbers of one leveled writing reward; a band is (zero_lo, one_lo, one_hi, zero_hi)."""
    tokens: tuple          # L1: (min, max) whitespace tokens, both outputs
    length_band: tuple     # L2: character-length ratio c2 / c1
    unique_band: tuple     # L3: unique-word ratio u2 / u1
    jaccard_cap: float     # L4: Jaccard at or above the cap scores 1
    transitions_in: str    # L4: connectives counted in the "second" output or in "both"
    weights: tuple = (0.5, 1.0, 0.5, 1.0)  # L1..L4 maxima: 3.0 in all
    style: tuple = (0.4, 0.6)              # L4 = weights[3] * (0.4 * T + 0.6 * J)


TLDR = WritingLevels(tokens=(8, 256), length_band=(1.1, 1.6, 3.2, 5.0), jaccard_cap=0.03,
                     unique_band=(1.3, 2.0, math.inf, math.inf), transitions_in="second")
# The paper states no L4 weights for arXiv: TLDR's, as in the authors' code; connectives of both texts.
ARXIV = WritingLevels(tokens=(128, 256), length_band=(0.8, 1.0, 1.3, 1.5), jaccard_cap=0.23,
                      unique_band=(0.5, 0.7, 1.3, 1.7), transitions_in="both")


@dataclass
class WritingReward:
    """One joint action's writing reward: `levels`, what each level added (not the one that stopped
    it); the rest are diagnostics for logs, all filled in when L1 passes."""
    levels: dict = field(default_factory=dict)  # structure, coordination, vocabulary, style (Sec. 5)
    tokens: tuple = (0, 0)
    length_ratio: float = 0.0
    unique_ratio: float = 0.0
    categories: int = 0        # transition categories found
    transition: float = 0.0    # T
    jaccard: float = 0.0       # raw, before the cap

    @property
    def total(self):
        return reduce(add, self.levels.values(), 0.0)  # as CodeReward.total

    def __float__(self):
        return float(self.total)


def words(text, authors=False):
    """The lowercased words of text (ours keep inner apostrophes; authors: theirs, \\b\\w+\\b)."""
    return (_AUTHORS_WORD_RE if authors else _WORD_RE).findall(text.lower())


def transition_categories(text, authors=False):
    """The connective categories (of 12) in text: a phrase matches whole words (padded with spaces, in
    the words joined by spaces); authors: anywhere in the lowercased text ("so" in "also")."""
    pad, low = ("", text.lower()) if authors else (" ", f" {' '.join(words(text))} ")
    return {cat for cat, phrases in TRANSITIONS.items() if any(f"{pad}{p}{pad}" in low for p in phrases)}


def transition_score(n_categories):
    """T: 0 without connectives, else 0.4 + 0.05 per category beyond the first (0.95 for 12)."""
    return 0.0 if n_categories == 0 else min(1.0, 0.4 + 0.05 * (n_categories - 1))


def jaccard(words1, words2, authors=False):
    """|A & B| / |A | B| over the word sets without stopwords; 0 when neither text has a word left
    (authors: 1.0, the full Jaccard share)."""
    stop = AUTHORS_STOPWORDS if authors else STOPWORDS
    a, b = set(words1) - stop, set(words2) - stop
    if not a | b:
        return 1.0 if authors else 0.0
    return len(a & b) / len(a | b)


def band_score(x, band):
    """1 on [one_lo, one_hi], linear ramps to 0 at zero_lo and zero_hi, None (stop the reward)
    outside them. The ramps are written as theirs: both modes agree to the last bit."""
    zero_lo, one_lo, one_hi, zero_hi = band
    if not zero_lo <= x <= zero_hi:
        return None
    if x < one_lo:
        return (x - zero_lo) / (one_lo - zero_lo)
    if x <= one_hi:
        return 1.0
    return 1.0 - (x - one_hi) / (zero_hi - one_hi)


def writing_reward(text1, text2, spec, authors=False):
    """The leveled writing reward of two outputs under spec's numbers (Sec. 5): the first failed
    level ends the sum. authors=True: their first release's value on any two texts."""
    # theirs: the raw texts, so that lengths count the surrounding whitespace
    t1, t2 = (_raw(t) if authors else _clean(t).strip() for t in (text1, text2))
    r = WritingReward(tokens=(len(t1.split()), len(t2.split())))
    r.length_ratio = len(t2) / len(t1) if t1 else 0.0
    w_tokens, w_length, w_vocab, w_style = spec.weights
    lo, hi = spec.tokens
    if not all(lo <= n <= hi for n in r.tokens):
        return r  # the other diagnostics only for texts of bounded size: cheap on any input
    w1, w2 = words(t1, authors), words(t2, authors)
    if spec.transitions_in == "second":
        found = transition_categories(t2, authors)
    elif authors:
        found = transition_categories(t1 + t2, authors=True)  # one string: a match may span the seam
    else:
        found = transition_categories(t1) | transition_categories(t2)
    r.unique_ratio = len(set(w2)) / len(set(w1)) if w1 else 0.0
    r.jaccard = jaccard(w1, w2, authors)
    r.categories, r.transition = len(found), transition_score(len(found))
    r.levels["structure"] = w_tokens
    for name, x, band, weight in (("coordination", r.length_ratio, spec.length_band, w_length),
                                  ("vocabulary", r.unique_ratio, spec.unique_band, w_vocab)):
        score = band_score(x, band)
        if score is None:
            return r
        r.levels[name] = weight * score
    j = min(r.jaccard, spec.jaccard_cap) / spec.jaccard_cap
    r.levels["style"] = w_style * (spec.style[0] * r.transition + spec.style[1] * j)
    return r


def tldr_reward(summary, detailed, authors=False):
    """TLDR (Sec. 5): agent 1's concise summary, agent 2's detailed one. Max 3.0."""
    return writing_reward(summary, detailed, TLDR, authors)


def arxiv_reward(background, methods, authors=False):
    """arXiv introduction expansion (Sec. 5): agent 1's background, agent 2's methods. Max 3.0."""
    return writing_reward(background, methods, ARXIV, authors)


SPLIT_MARK = "[PARAGRAPH_SPLIT]"  # the authors' single-agent delimiter
_PARA2 = re.compile(r"Paragraph 2:\s*", re.IGNORECASE)
_DASH_LINE = re.compile(r"\n[ \t]*-{3,}[ \t]*\n")


def split_single_output(text, authors=False):
    """The two parts of one model's output (the GRPO baseline), cut as theirs (LLM_Collab_Writing
    train_grpo.py) at [PARAGRAPH_SPLIT], else "Paragraph 2:", labels removed; ours also at a line
    of ---, and without a marker no second part (theirs: a third of the characters; README)."""
    text = _raw(text).strip()
    if SPLIT_MARK in text:
        first, second = text.split(SPLIT_MARK, 1)
    elif not authors and _DASH_LINE.search(text):
        first, second = _DASH_LINE.split(text, 1)
    elif m := _PARA2.search(text):
        first, second = text[:m.start()], text[m.end():]
    else:
        cut = (len(text) // 3 or 1) if authors else len(text)
        first, second = text[:cut], text[cut:]
    return (re.sub(r"^Paragraph 1:\s*", "", first.strip(), flags=re.IGNORECASE),
            re.sub(r"^Paragraph 2:\s*", "", second.strip(), flags=re.IGNORECASE))
