"""
The shared rewards of the paper's collaboration tasks: one number R(a_1, a_2) per joint action.

Paper: arXiv 2508.04652. The rewards are *leveled*: each level scores one aspect, and a failure
that leaves the later levels nothing to measure ends the reward there, so an early failure gives a
small, informative reward. Writing: each level gates the next. Code: a main function must be there
for the syntax level, and the program must parse for the tests; the structure level (each function
defined with a return) gates nothing, so a program without it still earns syntax and tests. Ours pays
aux's part of it (0.4) with the bonus, once every test passed; the authors' before any test.

    code  (Sec. 4, max 4.0)  structure -> syntax -> tests -> cooperation bonus     code_reward
    TLDR  (Sec. 5, max 2.98) tokens -> length ratio -> vocabulary -> style         tldr_reward
    arXiv (Sec. 5, max 2.98) same levels, other numbers                             arxiv_reward
    single-agent writing: split_single_output(text) -> the two parts to score

Model code runs only in sandbox.py; the text levels never raise on model output (empty, prose,
broken unicode, NUL bytes, megabytes). The authors' first release, replicated exactly, is authors.py
(--authors-rewards); it shares this module's levels (_score_code, _score_writing).

Try it: python -c "import rewards; print(float(rewards.code_reward('def aux(x): return 2 * x',
    'def f(x): return aux(x) + 1', 'f', 'def check(candidate): assert candidate(1) == 3')))"
"""
import ast
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
# Extraction (Sec. 4), from free-form model output to the one function we keep

_FENCE_RE = re.compile(r"^[ \t]*```", re.MULTILINE)


def strip_fences(text):
    """The code inside the markdown fences of (cleaned) text, all blocks joined; text without
    fences comes back unchanged."""
    if not _FENCE_RE.search(text):
        return text
    inside, keep = False, []
    for line in text.split("\n"):
        if _FENCE_RE.match(line):
            inside = not inside
        elif inside:
            # An unclosed block (the token limit cut the answer) keeps everything after its fence.
            keep.append(line)
    return "\n".join(keep)


def prompt_imports(prompt):
    """The import lines of a HumanEval prompt: all of it the paper's program keeps (Sec. 4)."""
    out, in_parens = [], False
    for line in _clean(prompt).split("\n"):
        # Only top-level lines, as an import inside the function's body belongs to that body.
        if in_parens or re.match(r"import\s+\w|from\s+[\w.]+\s+import\b", line):
            out.append(line)
            # A parenthesised import continues until its closing parenthesis.
            in_parens = (in_parens or "(" in line) and ")" not in line
    return "\n".join(out)


def prompt_parts(ex):
    """A HumanEval problem `ex` as (context, stub): what precedes the entry's def (imports, helpers), and
    that def; a task in prose: (its imports, None). The prompts show both, the program joins them."""
    prompt, entry = ex["prompt"], ex["entry_point"]
    starts = [match.start() for match in re.finditer(rf"^def {re.escape(entry)}\s*\(", prompt, re.M)]
    # A prompt without the entry's def (a task in prose) keeps only its imports as code.
    if not starts:
        return prompt_imports(prompt), None
    # The last def of the entry is the stub to complete, and what comes before it is context (imports,
    # the helpers that HumanEval/10, 32, 38 and 50 define and test).
    return prompt[:starts[-1]].strip("\n"), prompt[starts[-1]:]


def _body(lines, indent):
    """The leading lines that are blank or indented deeper than `indent` columns: a def's body."""
    for line in lines:
        if line.strip() and len(line) - len(line.lstrip(" \t")) <= indent:
            return
        yield line


def _cut_function(text, name, pattern):
    """A top-level `def name` cut out of text: by the parse tree where text parses (exact, even with
    odd docstrings), else as the paper cuts, from the outermost `def name(` line (`pattern`) on."""
    lines, tree = text.split("\n"), _parse(text)
    for node in tree.body if tree else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            # From the `def` line on, as decorators would need imports the program does not have.
            return "\n".join(lines[node.lineno - 1:node.end_lineno])
    # Each `def name(` line as (indentation, line number). The least indented is the real one (a
    # `def name` nested in another function is not), and on a tie the first of those.
    starts = [(len(line) - len(line.lstrip(" \t")), number) for number, line in enumerate(lines)
              if pattern.match(line)]
    indent, start = min(starts)
    return textwrap.dedent("\n".join([lines[start], *_body(lines[start + 1:], indent)]).rstrip())


def extract_function(text, name, signature=None):
    """The source of function `name` in a model output, or None, as the paper keeps it (Sec. 4);
    with `signature` (its `def` line and docstring) a body-only output is completed."""
    text = _clean(text)
    pattern = re.compile(rf"^([ \t]*)(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", re.MULTILINE)
    # Fenced code is searched first, then the raw text; dict.fromkeys drops a repeat, keeping order.
    for candidate in dict.fromkeys((strip_fences(text), text)):
        lines = candidate.split("\n")
        first = next((line for line in lines if line.strip()), "")
        # A base model continuing the stub writes the body alone, indented and with no `def` line.
        if signature and first.startswith((" ", "\t")) and not pattern.match(first):
            return _clean(signature).rstrip() + "\n" + "\n".join(_body(lines, 0)).rstrip()
        # Only text with a `def name(` line is parsed; parsing costs 0.5 s on a megabyte of prose.
        if pattern.search(candidate):
            return _cut_function(candidate, name, pattern)
    return None

# -----------------------------------------------------------------------------
# The code reward (Sec. 4): structure -> syntax -> tests -> cooperation bonus


@dataclass
class CodeReward:
    """One joint action's code reward by level, with what the levels looked at (for logs and
    multi-turn feedback); float(r) is the trainer's scalar."""
    structure: float = 0.0     # L1 is 0.6 entry function defined with a return, + 0.4 aux likewise
    # (ours: aux's 0.4 once every test passed, as the bonus, so that an aux earns nothing over an answer
    # that passes more tests; theirs: before any test, as the paper. docs/rewards.md)
    syntax: float = 0.0        # L2 is 0.5 if imports + aux + main parse
    tests: float = 0.0         # L3 is passed / n_tests
    # What the levels looked at, from which the multi-turn feedback (envs.py) tells each agent.
    passed: int = 0
    n_tests: int = 0
    has_aux: bool = False
    has_main: bool = False
    aux_returns: bool = False  # ours: aux is defined with a return, for L1's 0.4 once every test passed
    calls_aux: bool = False    # ours: aux's results change main's answers (measured); theirs: `aux(` in main
    wrapper: bool = False      # ours: main's answers are aux's (measured); theirs: main's text wraps aux
    discards_aux: bool = False
    authors: bool = False      # the bonus is the authors' rule (--authors-rewards), else ours
    syntax_error: str = ""
    sandbox_error: str | None = None  # no verdict, as the tests could not run (not the program's fault)
    program: str = field(default="", repr=False)   # what was (or would have been) run
    report: object = field(default=None, repr=False)  # sandbox's TestReport, when tests ran

    def bonus_steps(self):
        """The cooperation bonus (Sec. 4) as the steps that make it up, in the authors' order."""
        # Only for a helper that main really uses. The authors pay it once a test passed (Sec. 4); we
        # pay it once every test passed, so that no answer that passes fewer tests outscores one that
        # passes more (the bonus, 1.5, is worth more than all the tests: docs/rewards.md).
        paid = self.passed > 0 if self.authors else 0 < self.passed == self.n_tests
        if not paid or not self.has_aux or not self.calls_aux:
            return []
        return [0.5] + ([] if self.wrapper else [1.0]) + ([-0.5] if self.discards_aux else [])

    @property
    def coop(self):  # the bonus: +0.5 uses aux, +1.0 not a wrapper, -0.5 discards a result
        return float(sum(self.bonus_steps()))

    @property
    def total(self):
        # The bonus goes step by step, as the authors' loop adds it; float sums depend on the order.
        return reduce(add, self.bonus_steps(), self.structure + self.syntax + self.tests)

    @property
    def levels(self):
        return dict(structure=self.structure, syntax=self.syntax, tests=self.tests, cooperation=self.coop)

    def __float__(self):  # NaN where the sandbox failed: no verdict, never 0 tests (magrpo.group_advantages)
        return float("nan") if self.sandbox_error is not None else float(self.total)


def _has_return(func):
    """A `return` anywhere in func; on the text when it does not parse (L1 comes before L2)."""
    tree = _parse(func)
    if tree is None:
        return re.search(r"\breturn\b", func) is not None
    return any(isinstance(node, ast.Return) for node in ast.walk(tree))


def _discards_aux(main_func, name):
    """Main function `name` calls aux as a whole statement (`aux(x)`), throwing its result away."""
    tree = _parse(main_func)
    mains = [node for node in (tree.body if tree else []) if getattr(node, "name", None) == name]
    nodes = list(ast.walk(mains[0])) if mains else []
    # A `def aux` nested in main shadows the helper, so its calls are to main's own function.
    if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "aux"
           for node in nodes):
        return False
    # Only a call of the name `aux` itself counts: not `x.aux(...)`, nor a call of something aux returned.
    calls = [node.value for node in nodes if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)]
    return any(isinstance(call.func, ast.Name) and call.func.id == "aux" for call in calls)


def _judge_text(item):
    """L1 structure and L2 syntax, no code run: (reward, the test to run), or (reward, None) when
    the program stops before the tests."""
    # L1 structure checks that each agent's function is there and returns something.
    aux_fn = extract_function(item.get("aux"), "aux") or ""
    main_fn = extract_function(item["main"], item["entry_point"], item.get("signature")) or ""
    # Main's 0.6 is paid now; aux's 0.4 only once every test passed (_score_code), as the bonus, so
    # that defining an aux never outscores an answer that passes more tests (docs/rewards.md).
    reward = CodeReward(structure=0.6 * _has_return(main_fn), has_aux=bool(aux_fn), has_main=bool(main_fn),
                        aux_returns=_has_return(aux_fn))
    if not reward.has_main:
        return reward, None
    # L2 syntax checks that the program (the prompt's context, i.e. its imports and helpers, then
    # aux, then main) compiles. One that does not stops here, before any code runs.
    parts = [_clean(item.get("imports")).strip(), aux_fn, main_fn]
    reward.program = "\n\n\n".join(part for part in parts if part) + "\n"
    try:
        compile(reward.program, "<program>", "exec", dont_inherit=True)
    except Exception as e:  # the same failures as _parse
        reward.syntax_error = f"{type(e).__name__}: {e}"
        return reward, None
    reward.syntax = 0.5
    # Whether main uses aux is measured by the tests (_score_code); a discarded result is read here.
    reward.discards_aux = reward.has_aux and _discards_aux(main_fn, item["entry_point"])
    # The test runs in its own process, apart from the program (sandbox.py). The problem's own code
    # that the test calls (HumanEval/32's poly) goes with it, never the model's version of it.
    setup = _clean(item.get("imports") if item.get("test_setup") is None else item["test_setup"])
    return reward, (f"{setup}\n\n\n{item['test']}" if setup.strip() else item["test"])


def _score_code(items, judge, sandbox_options):
    """Every item's text levels by `judge`, one sandbox.run_tests_many call for all the programs that
    reach the tests (G x batch joint actions in parallel), then L3 and the bonus; ours and theirs."""
    judged = [judge(item) for item in items]  # (reward, the test to run or None) per item
    todo = [i for i, (_, test) in enumerate(judged) if test is not None]
    if todo:
        import sandbox  # imported here, as the writing rewards need no sandbox
        jobs = [(judged[i][0].program, judged[i][1], items[i]["entry_point"]) for i in todo]
        for i, report in zip(todo, sandbox.run_tests_many(jobs, **sandbox_options)):
            reward = judged[i][0]
            # L3 is the share of the problem's assertions that pass, each run on its own.
            reward.report, reward.passed, reward.n_tests = report, int(report.passed), int(report.total)
            # A sandbox that failed (not the program) gives no verdict, and the trainer is told so.
            reward.sandbox_error = getattr(report, "infra_error", None)
            reward.tests = reward.passed / reward.n_tests if reward.n_tests > 0 else 0.0
            # Ours: main uses aux where the sandbox measured that aux's results change main's answers
            # (run_tests' helper_use), and is a wrapper where they change only into aux's own. What
            # main's text says, or any count the program could keep, earns nothing (docs/rewards.md).
            if not reward.authors:
                reward.calls_aux = report.helper_use in ("used", "wrapped")
                reward.wrapper = report.helper_use == "wrapped"
            # Ours: L1's 0.4 for an aux with a return once every test passed (0.4 + 0.6 is the sum it was).
            if not reward.authors and reward.aux_returns and 0 < reward.passed == reward.n_tests:
                reward.structure = 0.4 + reward.structure
    return [reward for reward, _ in judged]


# Seconds per sandbox test: the authors' signal.alarm(10), for code_reward and the coding env alike.
TEST_TIMEOUT = 10.0


def code_reward(aux, main, entry_point, test, imports="", signature=None, timeout=TEST_TIMEOUT,
                test_setup=None):
    """The shared code reward of one joint action (Sec. 4): max 4.0, 2.1 with an empty aux. aux, main:
    raw outputs; test: `def check(candidate): ...`; imports: code before aux; signature: main's
    header, for a body-only output; timeout: per test; test_setup: code the test needs (None: imports)."""
    return code_reward_many([dict(aux=aux, main=main, entry_point=entry_point, test=test, imports=imports,
                                  signature=signature, test_setup=test_setup)], timeout=timeout)[0]


def code_reward_many(items, timeout=TEST_TIMEOUT, isolation=None):
    """code_reward for a batch; items: dicts of code_reward's arguments. timeout: seconds per test;
    isolation: the sandbox's level (None: sandbox.isolation_level())."""
    # The sandbox measures whether main's answers depend on aux's results (helper_use), for the bonus.
    return _score_code(items, _judge_text, dict(helper="aux", isolation=isolation, timeout=timeout))

# -----------------------------------------------------------------------------
# The writing rewards (Sec. 5): tokens -> length ratio -> vocabulary -> style. TRANSITIONS holds
# the authors' 12 categories and phrase lists (OpenMLRL/LLM_Collab_Writing rewards/tldr_rewards.py,
# first release), used by both modes. A phrase may be in two ("indeed" in explanation and emphasis).

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

# The function words that Jaccard drops, the usual English list (the authors' own is at the end).
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had
has have having he her here hers herself him himself his how i if in into is it its itself just
me more most my myself no nor not now of off on once only or other our ours ourselves out over own
same she should so some such than that the their theirs them themselves then there these they
this those through to too under until up very was we were what when where which while who whom
why will with would you your yours yourself yourselves
""".split())


@dataclass(frozen=True)
class WritingLevels:
    """The numbers of one leveled writing reward (its levels weigh 0.5, 1.0, 0.5 and 1.0 in both tasks, but
    the style level's T tops out at 0.95: WRITING_MAX); a band is (zero_lo, one_lo, one_hi, zero_hi)."""
    tokens: tuple          # L1 wants (min, max) whitespace tokens in both outputs
    length_band: tuple     # L2 bands the character-length ratio c2 / c1
    unique_band: tuple     # L3 bands the unique-word ratio u2 / u1
    jaccard_cap: float     # in L4, Jaccard at or above the cap scores 1
    transitions_in: str    # L4 counts connectives in the "second" output or in "both"


# The paper's numbers (Sec. 5). TLDR wants 8..256 tokens each, the detailed summary 1.6 to 3.2 times
# as long with at least twice the distinct words, and a little shared vocabulary (3%) is enough.
TLDR = WritingLevels(tokens=(8, 256), length_band=(1.1, 1.6, 3.2, 5.0), jaccard_cap=0.03,
                     unique_band=(1.3, 2.0, float("inf"), float("inf")), transitions_in="second")
# The paper states no L4 weights for arXiv, so they are TLDR's, as in the authors' code. Connectives
# count in both texts.
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
        # Level by level, as the authors' `reward += level`, because sum() rounds otherwise from
        # Python 3.12, and the authors' mode must equal their values to the last bit.
        return reduce(add, self.levels.values(), 0.0)

    def __float__(self):
        return float(self.total)


def words(text):
    """The lowercased words of text: runs of letters and digits, inner apostrophes kept ("don't")."""
    return re.findall(r"[^\W_]+(?:'[^\W_]+)*", text.lower())


def _categories_in(text, pad):
    """The connective categories with a phrase in text, each phrase padded with `pad` both sides."""
    found = set()
    for category, phrases in TRANSITIONS.items():
        if any(f"{pad}{phrase}{pad}" in text for phrase in phrases):
            found.add(category)
    return found


def transition_categories(text):
    """The connective categories (of 12) in text; a phrase matches whole words only."""
    # The words joined by single spaces and padded, so that " so " is the word, never part of "also".
    return _categories_in(f" {' '.join(words(text))} ", pad=" ")


def transition_score(n_categories):
    """T: 0 without connectives, else 0.4 + 0.05 per category beyond the first (0.95 for 12)."""
    return 0.0 if n_categories == 0 else min(1.0, 0.4 + 0.05 * (n_categories - 1))


# The best a writing pair can score (Sec. 5): every level full, all 12 connective categories, so
# 0.4 * 0.95 + 0.6 at L4, added level by level as WritingReward.total adds them (2.98, not 3.0).
WRITING_MAX = reduce(add, (0.5, 1.0, 0.5, 0.4 * transition_score(len(TRANSITIONS)) + 0.6 * 1.0), 0.0)


def jaccard(words1, words2, stopwords=STOPWORDS, if_empty=0.0):
    """|A & B| / |A | B| over the two word sets without stopwords; if_empty when neither has a word left."""
    set1, set2 = set(words1) - stopwords, set(words2) - stopwords
    if not set1 | set2:
        return if_empty
    return len(set1 & set2) / len(set1 | set2)


def band_score(x, band):
    """1 on [one_lo, one_hi], linear ramps to 0 at zero_lo and zero_hi, None (stop the reward)
    outside them. The ramps are written as the authors' are: both modes agree to the last bit."""
    zero_lo, one_lo, one_hi, zero_hi = band
    # Outside the zero points the texts are no longer doing their parts, so the reward stops here.
    if not zero_lo <= x <= zero_hi:
        return None
    if x < one_lo:
        return (x - zero_lo) / (one_lo - zero_lo)
    if x <= one_hi:
        return 1.0
    # Written 1 - (x - one_hi) / width as theirs; (zero_hi - x) / width differs in the last bit.
    return 1.0 - (x - one_hi) / (zero_hi - one_hi)


def _score_writing(first, second, spec, measure):
    """The four levels of Sec. 5 on two texts, each gating the next. measure(first, second, the texts
    to find connectives in) -> (words1, words2, categories, Jaccard): where ours and theirs differ."""
    reward = WritingReward(tokens=(len(first.split()), len(second.split())))
    reward.length_ratio = len(second) / len(first) if first else 0.0
    low, high = spec.tokens
    # L1 comes first, so that the word-level measures below only ever see texts of bounded size, and
    # a megabyte of output costs nothing.
    if not all(low <= count <= high for count in reward.tokens):
        return reward
    # TLDR looks for connectives in the detailed summary only; arXiv in both halves of the intro.
    connective_texts = (second,) if spec.transitions_in == "second" else (first, second)
    words1, words2, found, reward.jaccard = measure(first, second, connective_texts)
    reward.unique_ratio = len(set(words2)) / len(set(words1)) if words1 else 0.0
    reward.categories, reward.transition = len(found), transition_score(len(found))
    reward.levels["structure"] = 0.5
    # L2 coordination (the second text's length relative to the first's), then L3 vocabulary (how
    # many more distinct words it uses). A ratio outside its band's zero points ends the reward.
    for level, ratio, band, weight in (("coordination", reward.length_ratio, spec.length_band, 1.0),
                                       ("vocabulary", reward.unique_ratio, spec.unique_band, 0.5)):
        score = band_score(ratio, band)
        if score is None:
            return reward
        reward.levels[level] = weight * score
    # L4 style is 0.4 T + 0.6 J, for connectives and for shared words, capped. A little overlap
    # shows that the two texts are about the same thing and earns it all, so copying the partner
    # earns nothing more.
    capped = min(reward.jaccard, spec.jaccard_cap) / spec.jaccard_cap
    reward.levels["style"] = 0.4 * reward.transition + 0.6 * capped
    return reward


def _our_measures(first, second, connective_texts):
    """Our words, whole-word connectives (a phrase never spans two texts) and Jaccard."""
    words1, words2 = words(first), words(second)
    found = set().union(*map(transition_categories, connective_texts))
    return words1, words2, found, jaccard(words1, words2)


def writing_reward(text1, text2, spec):
    """The leveled writing reward of two outputs under spec's numbers (Sec. 5): the first failed
    level ends the sum."""
    # Stripped, because whitespace around a text is no part of its length.
    return _score_writing(_clean(text1).strip(), _clean(text2).strip(), spec, _our_measures)


def tldr_reward(summary, detailed):
    """TLDR (Sec. 5): agent 1's concise summary, agent 2's detailed one. Max 2.98."""
    return writing_reward(summary, detailed, TLDR)


def arxiv_reward(background, methods):
    """arXiv introduction expansion (Sec. 5): agent 1's background, agent 2's methods. Max 2.98."""
    return writing_reward(background, methods, ARXIV)

# -----------------------------------------------------------------------------
# Single-agent writing (the GRPO baseline of Sec. 5), one output cut into the two parts to score

_MARK = re.compile(re.escape("[PARAGRAPH_SPLIT]"))  # the authors' single-agent delimiter
_PARA2 = re.compile(r"Paragraph 2:\s*", re.IGNORECASE)
_DASH_LINE = re.compile(r"\n[ \t]*-{3,}[ \t]*\n")


def _two_parts(text, markers, cut):
    """text cut at the first of `markers` found (tried in order), else after `cut` characters; the
    "Paragraph 1:" and "Paragraph 2:" labels the prompt asks for are removed."""
    found = [marker for marker in markers if marker.search(text)]
    first, second = found[0].split(text, maxsplit=1) if found else (text[:cut], text[cut:])
    return (re.sub(r"^Paragraph 1:\s*", "", first.strip(), flags=re.IGNORECASE),
            re.sub(r"^Paragraph 2:\s*", "", second.strip(), flags=re.IGNORECASE))


def split_single_output(text):
    """The two parts of one model's output, cut as the authors cut (LLM_Collab_Writing train_grpo.py)
    at [PARAGRAPH_SPLIT], else at "Paragraph 2:"; we also accept a line of ---."""
    text = _raw(text).strip()
    # No marker, no second part, so L1 fails (a guessed cut would reward a layout nobody asked for).
    return _two_parts(text, (_MARK, _DASH_LINE, _PARA2), cut=len(text))
