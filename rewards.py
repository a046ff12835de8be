"""
The shared rewards of the paper's collaboration tasks: one number R(a_1, a_2) per joint action.

Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning" (arXiv 2508.04652).
Both rewards are *leveled*: each level must be met before the next one can add anything, so an
early failure gives a small, informative reward instead of noise from the later levels.

    code  (Sec. 4, max 4.0)  structure -> syntax -> tests -> cooperation bonus     code_reward
    TLDR  (Sec. 5, max 3.0)  tokens -> length ratio -> vocabulary -> style         tldr_reward
    arXiv (Sec. 5, max 3.0)  same levels, other numbers                             arxiv_reward

Model code never runs in this process: sandbox.py runs every test assertion in a killable
subprocess. Everything else here is stdlib text processing and must never raise on model output
(empty, prose, broken unicode, NUL bytes, megabytes of garbage).
"""
import ast
import math
import re
import textwrap
from dataclasses import dataclass, field

# -----------------------------------------------------------------------------
# Data: connectives and stopwords for the writing rewards (Sec. 5), written for this project.
# Phrases match whole words, case-insensitively ("so" does not fire inside "also").

TRANSITIONS = {
    "addition": ["furthermore", "moreover", "additionally", "in addition", "besides", "what is more",
                 "as well as", "not only", "along with", "also"],
    "example": ["for example", "for instance", "such as", "to illustrate", "namely", "in particular",
                "specifically", "as an example"],
    "clarification": ["in other words", "that is to say", "to put it simply", "simply put",
                      "to clarify", "put differently", "essentially", "in essence"],
    "cause_effect": ["therefore", "thus", "consequently", "as a result", "hence", "accordingly",
                     "for this reason", "because", "due to", "so that"],
    "contrast": ["however", "on the other hand", "in contrast", "by contrast", "whereas",
                 "conversely", "instead", "on the contrary", "but", "yet"],
    "concession": ["although", "even though", "though", "despite", "in spite of", "nevertheless",
                   "nonetheless", "admittedly", "granted", "even so"],
    "sequence": ["first", "firstly", "second", "secondly", "thirdly", "next", "finally", "lastly",
                 "to begin with", "subsequently", "afterwards", "afterward"],
    "time": ["meanwhile", "eventually", "previously", "later", "at the same time", "currently",
             "recently", "during", "until", "before", "after", "when"],
    "emphasis": ["indeed", "in fact", "certainly", "undoubtedly", "notably", "above all",
                 "especially", "importantly", "clearly", "of course"],
    "comparison": ["similarly", "likewise", "in the same way", "equally", "compared to",
                   "compared with", "in comparison", "just as"],
    "condition": ["if", "unless", "provided that", "as long as", "in case", "otherwise",
                  "assuming that", "given that", "even if"],
    "summary": ["in summary", "in conclusion", "to sum up", "overall", "in short", "in brief",
                "all in all", "to conclude", "ultimately", "on the whole"],
}

STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had
has have having he her here hers herself him himself his how i if in into is it its itself just
me more most my myself no nor not now of off on once only or other our ours ourselves out over own
same she should so some such than that the their theirs them themselves then there these they
this those through to too under until up very was we were what when where which while who whom
why will with would you your yours yourself yourselves
""".split())

_WORD_RE = re.compile(r"[^\W_]+(?:'[^\W_]+)*")  # letters/digits, inner apostrophes kept: "don't"


def _phrase_index():
    """first word -> [(phrase as a word list, category)]: one dict lookup per word of the text
    (a regex alternation of all phrases costs a second per megabyte of hostile output)."""
    index = {}
    for cat, phrases in TRANSITIONS.items():
        for phrase in phrases:
            index.setdefault(phrase.split()[0], []).append((phrase.split(), cat))
    return index


_PHRASES = _phrase_index()


def _clean(text):
    """Model output as a str that every later step can handle: None -> "", bytes decoded with
    replacement, lone surrogates (unencodable, they crash compile() and pipes) replaced by '?',
    and newlines normalised to \\n so line numbers agree with the Python tokenizer."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    text = str(text).encode("utf-8", errors="replace").decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n")

# -----------------------------------------------------------------------------
# Extraction (Sec. 4): from free-form model output to the one function we keep

AUX_NAME = "aux"
_FENCE_RE = re.compile(r"^[ \t]*```")


def strip_fences(text):
    """The code inside markdown fences (```python ... ```), all blocks joined; text without fences
    comes back unchanged. An unclosed fence (output cut at max_new_tokens) keeps the rest."""
    lines = _clean(text).split("\n")
    if not any(_FENCE_RE.match(line) for line in lines):
        return "\n".join(lines)
    inside, keep = False, []
    for line in lines:
        if _FENCE_RE.match(line):
            inside = not inside
        elif inside:
            keep.append(line)
    return "\n".join(keep)


def prompt_imports(prompt):
    """The import lines of a HumanEval prompt ("from typing import List"), the only part of the
    prompt that goes into the program besides the agents' functions (Sec. 4)."""
    out, in_parens = [], False
    for line in _clean(prompt).split("\n"):
        if in_parens or re.match(r"import\s+\w|from\s+[\w.]+\s+import\b", line):
            out.append(line)
            # a parenthesised import continues until its closing parenthesis
            in_parens = (in_parens or "(" in line) and ")" not in line
    return "\n".join(out)


def _indent(line):
    return len(line) - len(line.lstrip(" \t"))


def _def_re(name):
    """A line that starts `def name(`, at any indentation."""
    return re.compile(rf"^([ \t]*)(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", re.MULTILINE)


def _function_by_ast(text, name):
    """A top-level `def name` cut out of text that parses: exact, even with odd docstrings."""
    try:
        tree = ast.parse(text)
    except Exception:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            # from the `def` line: decorators would need imports the program does not have
            return "\n".join(text.split("\n")[node.lineno - 1:node.end_lineno])
    return None


def _function_by_lines(text, name):
    """The paper's line-based cut for text that does not parse: the outermost (then first)
    `def name(` line plus every following line that is blank or indented deeper. Prose after
    the function stops it, and broken code still yields its text, so structure can be judged."""
    lines, pattern = text.split("\n"), _def_re(name)
    starts = [(len(m.group(1)), i) for i, line in enumerate(lines) if (m := pattern.match(line))]
    if not starts:
        return None
    indent, start = min(starts)
    block = [lines[start]]
    for line in lines[start + 1:]:
        if line.strip() and _indent(line) <= indent:
            break
        block.append(line)
    return textwrap.dedent("\n".join(block).rstrip())


def _is_body(text, name):
    """A raw-prompt continuation: the prompt ended inside `def name(...):` and the model wrote
    only the indented body, so the first real line is indented and is not the def itself."""
    first = next((line for line in text.split("\n") if line.strip()), "")
    return _indent(first) > 0 and not _def_re(name).match(first)


def _with_signature(body, signature):
    """signature + the body lines up to the first unindented line (the model's trailing prose,
    tests or a new top-level def)."""
    keep = []
    for line in body.split("\n"):
        if line.strip() and _indent(line) == 0:
            break
        keep.append(line)
    return signature.rstrip() + "\n" + "\n".join(keep).rstrip()


def extract_function(text, name, signature=None):
    """The source of function `name` in a model output, or None when it is not there.

    Fenced code is searched first, then the raw text (a stray closing fence after a body). Only
    `name` is kept: nested defs inside it stay, every other top-level def, class or import of the
    output is dropped, as in the paper (Sec. 4): so a main agent that redefines `aux` or leans on
    its own top-level helper loses it. With `signature` (the `def name(...):` header, possibly with
    the docstring, as in a raw HumanEval prompt) an output that is only an indented body becomes
    that function; without it such output has no function.
    """
    text, pattern = _clean(text), _def_re(name)
    for candidate in dict.fromkeys((strip_fences(text), text)):  # dedup keeps order
        if signature and _is_body(candidate, name):
            return _with_signature(candidate, _clean(signature))
        if not pattern.search(candidate):
            continue  # no `def name(` line: skip parsing (megabytes of prose cost 0.5 s a parse)
        found = _function_by_ast(candidate, name) or _function_by_lines(candidate, name)
        if found:
            return found
    return None

# -----------------------------------------------------------------------------
# The code reward (Sec. 4): structure -> syntax -> tests -> cooperation bonus


@dataclass
class CodeReward:
    """One joint action's code reward, by level, with what the levels looked at (for logs and
    for multi-turn feedback). float(r) is the scalar the trainer uses."""
    structure: float = 0.0     # L1: 0.4 aux defined with a return + 0.6 entry function likewise
    syntax: float = 0.0        # L2: 0.5 if imports + aux + main parses
    tests: float = 0.0         # L3: passed / n_tests
    coop: float = 0.0          # bonus: +0.5 calls aux, +1.0 not a wrapper, -0.5 discards a result
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
    def total(self):
        return self.structure + self.syntax + self.tests + self.coop

    @property
    def levels(self):
        return {"structure": self.structure, "syntax": self.syntax, "tests": self.tests, "coop": self.coop}

    def __float__(self):
        return float(self.total)


def _parse(code):
    """ast of code, or None: model output can fail in more ways than SyntaxError."""
    try:
        return ast.parse(code)
    except Exception:  # ValueError for NUL bytes, RecursionError/MemoryError for deep nesting
        return None


def _has_return(func):
    """A `return` anywhere in the function; judged on the text when it does not parse (the
    syntax-error row of the table still earns its structure points)."""
    tree = _parse(func)
    if tree is None:
        return re.search(r"\breturn\b", func) is not None
    return any(isinstance(n, ast.Return) for n in ast.walk(tree))


def _is_aux_call(node):
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == AUX_NAME


def _is_wrapper(body):
    """Only `return aux(...)`, or `v = aux(...)` then `return v` (a leading docstring ignored):
    the main agent handed the whole job to the helper."""
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) == 1:
        return isinstance(body[0], ast.Return) and _is_aux_call(body[0].value)
    if len(body) == 2:
        first, second = body
        return (isinstance(first, ast.Assign) and len(first.targets) == 1
                and isinstance(first.targets[0], ast.Name) and _is_aux_call(first.value)
                and isinstance(second, ast.Return) and isinstance(second.value, ast.Name)
                and second.value.id == first.targets[0].id)
    return False


def _aux_usage(main_func, name):
    """(calls aux, is a mere wrapper, discards an aux result) for the main function `name`.
    A call is `aux(...)` by name; a nested `def aux` shadows the helper, so it is no cooperation.
    A discarded result is an expression statement `aux(...)`, found on the ast: the authors'
    regex for it never fired (SPEC Sec. 4)."""
    tree = _parse(main_func)
    fn = next((n for n in (tree.body if tree else []) if getattr(n, "name", None) == name), None)
    if fn is None:
        return False, False, False
    nodes = list(ast.walk(fn))
    if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == AUX_NAME for n in nodes):
        return False, False, False
    calls = any(_is_aux_call(n) for n in nodes)
    discards = any(isinstance(n, ast.Expr) and _is_aux_call(n.value) for n in nodes)
    return calls, calls and _is_wrapper(fn.body), discards


def _judge_text(aux, main, entry_point, imports="", signature=None):
    """L1 structure and L2 syntax: the cheap levels, no code runs. The result's program is ready
    for the tests iff r.syntax > 0."""
    r = CodeReward()
    aux_fn = extract_function(aux, AUX_NAME) or ""
    main_fn = extract_function(main, entry_point, signature) or ""
    r.has_aux, r.has_main = bool(aux_fn), bool(main_fn)
    r.structure = 0.4 * (r.has_aux and _has_return(aux_fn)) + 0.6 * (r.has_main and _has_return(main_fn))
    if not r.has_main:
        return r  # nothing to test: the entry function is missing
    r.program = "\n\n\n".join(p for p in (_clean(imports).strip(), aux_fn, main_fn) if p) + "\n"
    try:
        compile(r.program, "<program>", "exec", dont_inherit=True)
    except Exception as e:  # SyntaxError, ValueError (NUL), RecursionError, MemoryError
        r.syntax_error = f"{type(e).__name__}: {e}"
        return r
    r.syntax = 0.5
    if r.has_aux:
        r.calls_aux, r.wrapper, r.discards_aux = _aux_usage(main_fn, entry_point)
    return r


def _judge_tests(r, report):
    """L3 tests and the cooperation bonus, from the sandbox's report on r.program. The bonus
    needs at least one passing test (a broken collaboration earns nothing) and an aux. A report
    with an infra_error (the sandbox failed, not the program) sets r.sandbox_error: callers must
    count and show those, not read their zero as a verdict."""
    r.report, r.passed, r.n_tests = report, int(report.passed), int(report.total)
    r.sandbox_error = getattr(report, "infra_error", None)
    r.tests = r.passed / r.n_tests if r.n_tests > 0 else 0.0
    if r.passed > 0 and r.has_aux and r.calls_aux:
        r.coop = 0.5 + (0.0 if r.wrapper else 1.0) - (0.5 if r.discards_aux else 0.0)
    return r


def _test_side(test, setup):
    """What the sandbox's tester runs: the problem's own code that its test calls (HumanEval/32's
    poly), then the test; the same as sandbox.run_tests(..., setup=setup)."""
    setup = _clean(setup)
    return f"{setup}\n\n\n{test}" if setup.strip() else test


def code_reward(aux, main, entry_point, test, imports="", signature=None, timeout=None,
                test_setup=None):
    """The shared code reward of one joint action (Sec. 4), max 4.0; empty aux is the
    single-agent baseline (max 2.1).

    aux, main: the helper agent's and the main agent's raw outputs; entry_point: the problem's
    function name; test: its `def check(candidate): ...`; imports: code put before aux, the
    paper's prompt_imports(prompt), or the prompt's whole context (some HumanEval prompts define
    helpers their tests call); signature: the entry function's header (and docstring), for
    outputs that are a body only; timeout: seconds per test (None: sandbox's default);
    test_setup: the problem's own code the test needs, run on the test's side, never the model's
    (the prompt's code before the entry function; None: `imports`).
    """
    r = _judge_text(aux, main, entry_point, imports, signature)
    if r.syntax == 0:
        return r
    import sandbox  # here, not at the top, so the writing rewards need no sandbox
    kw = {} if timeout is None else {"timeout": timeout}
    test = _test_side(test, imports if test_setup is None else test_setup)
    return _judge_tests(r, sandbox.run_tests(r.program, test, entry_point, **kw))


def code_reward_many(items, workers=None, timeout=None):
    """code_reward for a batch (the trainer's G x batch joint actions): the text levels here, then
    one sandbox.run_tests_many call for just the programs that parse. items: dicts with the keys
    of code_reward (main, entry_point, test; optional aux, imports, signature, test_setup)."""
    judged = [_judge_text(it.get("aux", ""), it["main"], it["entry_point"], it.get("imports", ""),
                          it.get("signature")) for it in items]
    todo = [i for i, r in enumerate(judged) if r.syntax > 0]
    if todo:
        import sandbox
        setup = [it.get("imports", "") if it.get("test_setup") is None else it["test_setup"]
                 for it in items]
        jobs = [(judged[i].program, _test_side(items[i]["test"], setup[i]), items[i]["entry_point"])
                for i in todo]
        kw = {} if timeout is None else {"timeout": timeout}
        for i, report in zip(todo, sandbox.run_tests_many(jobs, workers=workers, **kw)):
            _judge_tests(judged[i], report)
    return judged

# -----------------------------------------------------------------------------
# The writing rewards (Sec. 5): tokens -> length ratio -> vocabulary -> style
# Tokens are whitespace tokens; lengths are len() of the stripped texts; ratios are text 2 over
# text 1. Words (vocabulary, Jaccard) are _WORD_RE matches of the lowercased text: punctuation
# dropped, inner apostrophes kept. Unique words count every word; Jaccard drops STOPWORDS.


@dataclass(frozen=True)
class WritingLevels:
    """The numbers of one leveled writing reward; writing_reward is the shared logic.
    A band (zero_lo, one_lo, one_hi, zero_hi) scores 1 on [one_lo, one_hi], ramps linearly to 0
    at zero_lo and zero_hi, and *stops* the reward outside [zero_lo, zero_hi]."""
    tokens: tuple          # L1: (min, max) whitespace tokens, both outputs
    length_band: tuple     # L2: character-length ratio c2 / c1
    unique_band: tuple     # L3: unique-word ratio u2 / u1
    jaccard_cap: float     # L4: Jaccard at or above the cap scores 1
    transitions_in: str    # L4: connectives counted in the "second" output or in "both"
    weights: tuple = (0.5, 1.0, 0.5, 1.0)  # L1..L4 maxima: 3.0 in all
    style: tuple = (0.4, 0.6)              # L4 = weights[3] * (0.4 * T + 0.6 * J)


TLDR = WritingLevels(tokens=(8, 256), length_band=(1.1, 1.6, 3.2, 5.0),
                     unique_band=(1.3, 2.0, math.inf, math.inf), jaccard_cap=0.03,
                     transitions_in="second")
# paper era; L4 weights are not stated for arXiv, we keep TLDR's 0.4 T + 0.6 J (as the authors'
# code does) and count connectives in both texts: the union of the categories each one uses.
ARXIV = WritingLevels(tokens=(128, 256), length_band=(0.8, 1.0, 1.3, 1.5),
                      unique_band=(0.5, 0.7, 1.3, 1.7), jaccard_cap=0.23, transitions_in="both")


@dataclass
class WritingReward:
    """One joint action's writing reward: `levels` holds what each level added (a level that
    stopped the reward is absent); the rest are diagnostics for logs, all of them filled in
    whenever L1 passes, even where a later level stops the reward."""
    levels: dict = field(default_factory=dict)  # structure, length, vocabulary, style
    tokens: tuple = (0, 0)
    length_ratio: float = 0.0
    unique_ratio: float = 0.0
    categories: int = 0        # transition categories found
    transition: float = 0.0    # T
    jaccard: float = 0.0       # raw, before the cap

    @property
    def total(self):
        return sum(self.levels.values(), 0.0)

    def __float__(self):
        return float(self.total)


def words(text):
    """Lowercased words, punctuation stripped."""
    return _WORD_RE.findall(text.lower())


def transition_categories(text):
    """The connective categories (of 12) that occur in text; a phrase matches consecutive words."""
    ws, found = words(text), set()
    for i, w in enumerate(ws):
        for phrase, cat in _PHRASES.get(w, ()):
            if ws[i:i + len(phrase)] == phrase:
                found.add(cat)
    return found


def transition_score(n_categories):
    """T: 0 without connectives, else 0.4 + 0.05 per category beyond the first (0.95 for 12)."""
    return 0.0 if n_categories == 0 else min(1.0, 0.4 + 0.05 * (n_categories - 1))


def jaccard(words1, words2):
    """|A & B| / |A | B| over the word sets without stopwords; 0 when both are empty."""
    a, b = set(words1) - STOPWORDS, set(words2) - STOPWORDS
    return len(a & b) / len(a | b) if a | b else 0.0


def band_score(x, band):
    """Trapezoid score in [0, 1] of x, or None (stop) when x is outside the band's zero edges."""
    zero_lo, one_lo, one_hi, zero_hi = band
    if not zero_lo <= x <= zero_hi:
        return None
    if x < one_lo:
        return (x - zero_lo) / (one_lo - zero_lo)
    if x <= one_hi:
        return 1.0
    return (zero_hi - x) / (zero_hi - one_hi)


def _ratio(denominator, numerator):
    return numerator / denominator if denominator else 0.0


def writing_reward(text1, text2, spec):
    """The leveled writing reward of two outputs under spec's numbers (Sec. 5); gated: the
    first failed level ends the sum, the levels before it keep what they earned."""
    t1, t2 = _clean(text1).strip(), _clean(text2).strip()
    r = WritingReward(tokens=(len(t1.split()), len(t2.split())), length_ratio=_ratio(len(t1), len(t2)))
    w_tokens, w_length, w_vocab, w_style = spec.weights
    lo, hi = spec.tokens
    if not all(lo <= n <= hi for n in r.tokens):
        return r  # the other diagnostics only for texts of bounded size: cheap on any input
    w1, w2 = words(t1), words(t2)
    found = transition_categories(t2)
    if spec.transitions_in == "both":
        found |= transition_categories(t1)
    r.unique_ratio, r.jaccard = _ratio(len(set(w1)), len(set(w2))), jaccard(w1, w2)
    r.categories, r.transition = len(found), transition_score(len(found))
    r.levels["structure"] = w_tokens
    for name, x, band, weight in (("length", r.length_ratio, spec.length_band, w_length),
                                  ("vocabulary", r.unique_ratio, spec.unique_band, w_vocab)):
        score = band_score(x, band)
        if score is None:
            return r
        r.levels[name] = weight * score
    j = min(r.jaccard, spec.jaccard_cap) / spec.jaccard_cap
    r.levels["style"] = w_style * (spec.style[0] * r.transition + spec.style[1] * j)
    return r


def tldr_reward(summary, detailed):
    """TLDR (Sec. 5): agent 1's concise summary, agent 2's detailed one. Max 3.0."""
    return writing_reward(summary, detailed, TLDR)


def arxiv_reward(background, methods):
    """arXiv introduction expansion (Sec. 5): agent 1's background, agent 2's methods. Max 3.0."""
    return writing_reward(background, methods, ARXIV)
