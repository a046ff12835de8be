"""
Eq. 1's group mean against the learned critics (--advantage critic) on the CPU demo, one seed: per run
the mean reward of the first and the last 10% of steps, their ratio, the critic's explained variance
over the last 10% of steps' rows together (and per step: the mean and median of those steps'), the
share of the returns' variance that lies between states (the explained variance that V(s) = each
state's own mean return would reach, on the same rows), the reward every 15 steps (the curve) and the
run's time. The same runs on AskedRatioEnv, the demo whose examples ask their own ratio (a new env,
registered here as docs/envs.md shows), are named asked-<run>; after each, its last 10% of steps'
reward by ask. The table of docs/critic.md. Not a test (pytest does not collect bench_*.py).

    python tests/bench_critic.py                        # every run of RUNS, 150 steps each
    python tests/bench_critic.py --runs asked-mean,asked-central --steps 60
"""
import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import envs  # noqa: E402
import train  # noqa: E402


class AskedRatioEnv(envs.DemoEnv):
    """The demo where each example asks its own length ratio, "a body k to 2k times as long as the
    headline", and the ratio's band follows the ask (0 at k/2 and 3k), as the demo's (k = 2). Written
    in 24 characters, a headline with 6 distinct letters leaves room for 4x at most: the higher asks
    trade the headline's variety for the ratio, and keep their states' values apart to the end."""
    name = "demo-asked-ratio"
    asks = (1, 2, 4, 8, 16)

    def __init__(self, num_examples=64, seed=0, split=None, default_split="train"):
        super().__init__(num_examples, seed, split, default_split)
        for ex in self.examples:  # the asks in turn, the topics at random: a step's pair mixes them
            ex["times"] = self.asks[ex["id"] % len(self.asks)]

    def asked(self, ex):
        """This env with the band of the example's ask, for the demo's reward and feedback."""
        env, k = copy.copy(self), ex["times"]
        env.band = (k / 2, k, 2 * k, 3 * k)
        return env

    def prompts(self, ex):
        k, topic = ex["times"], ex["topic"]
        return [f"Topic: {topic}. Headline, letters a to m, for a body {k} to {2 * k}x as long:\n",
                f"Topic: {topic}. Body, letters n to z, {k} to {2 * k}x as long as the headline:\n"]

    def reward(self, ex, outputs):
        return envs.DemoEnv.reward(self.asked(ex), ex, outputs)

    def diagnose(self, ex, outputs, reward, i):
        return envs.DemoEnv.diagnose(self.asked(ex), ex, outputs, reward, i)

    def task_text(self, ex):
        k = ex["times"]
        return envs.DemoEnv.task_text(self, ex).replace("2 to 4 times", f"{k} to {2 * k} times")


envs.ENVS[AskedRatioEnv.name] = AskedRatioEnv

RUNS = {"mean": [], "central": ["--advantage", "critic"],
        "per-agent": ["--advantage", "critic", "--critic", "per-agent"],
        "central-G1": ["--advantage", "critic", "--num-generations", "1"],
        "mean-2turn": ["--num-turns", "2"], "central-2turn": ["--advantage", "critic", "--num-turns", "2"],
        "per-agent-2turn": ["--advantage", "critic", "--critic", "per-agent", "--num-turns", "2"]}
# The same runs on the demo whose examples ask their own ratio (AskedRatioEnv), named asked-<run>.
RUNS.update({f"asked-{name}": ["--env", AskedRatioEnv.name] + flags for name, flags in list(RUNS.items())})
RUNS["asked-central-lr1e-2"] = RUNS["asked-central"] + ["--critic-learning-rate", "1e-2"]


def run(flags, seed, steps):
    """-> (metrics rows, completions rows, seconds) of one demo run."""
    with tempfile.TemporaryDirectory() as out:
        args = train.parse_args(flags + ["--seed", str(seed), "--steps", str(steps), "--out", out,
                                         "--save-every", "0"])
        t0 = time.perf_counter()
        train.train(args)
        seconds = time.perf_counter() - t0
        read = lambda name: [json.loads(line) for line in open(Path(out) / name)]  # noqa: E731
        return read("metrics.jsonl"), read("completions.jsonl"), seconds


def window_explained(rows, completions):
    """The critic's explained variance over the rows of `rows`' steps together: 1 - (their mean squared
    error R - V, the mean of the steps' critic_loss, each step the same number of rows) / (the variance of
    their returns: with one turn, or two with --expand best, the rewards of every completion row)."""
    steps = {r["step"] for r in rows}
    returns = [row["reward"] for row in completions if row["step"] in steps]
    spread = statistics.pvariance(returns)
    return 1 - mean(r["critic_loss"] for r in rows) / spread if spread > 1e-12 else None


def between_states(completions, step):
    """1 - (variance within each state's group) / (variance of all the step's returns): at most what a
    value of the state can explain (a state: one example at one turn; with --expand best, one group)."""
    groups = {}
    for row in completions:
        if row["step"] == step:
            groups.setdefault((row["turn"], row["example"]), []).append(row["reward"])
    rewards = [r for group in groups.values() for r in group]
    total = sum((r - sum(rewards) / len(rewards)) ** 2 for r in rewards)
    within = sum((r - sum(group) / len(group)) ** 2 for group in groups.values() for r in group)
    return 1 - within / total if total > 1e-12 else None


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=150)
    args = p.parse_args()
    lines = []
    for name in args.runs.split(","):
        rows, completions, seconds = run(RUNS[name], args.seed, args.steps)
        tenth = max(1, len(rows) // 10)
        first = mean(r["reward_mean"] for r in rows[:tenth])
        last = mean(r["reward_mean"] for r in rows[-tenth:])
        explained = [r.get("critic_explained_variance") for r in rows[-tenth:]]
        explained = [x for x in explained if x is not None]
        per_step = f"{mean(explained):.2f} ({statistics.median(explained):.2f})" if explained else "-"
        window = f"{window_explained(rows[-tenth:], completions):.2f}" if explained else "-"
        between = mean(between_states(completions, r["step"]) for r in rows[-tenth:])
        curve = " ".join(f"{r['reward_mean']:.2f}" for r in rows[::15])
        lines.append(f"| {name} | {first:.2f} | {last:.2f} | {last / first:.1f}x | {window} | {per_step} | "
                     f"{between:.2f} | {curve} | {seconds:.0f} |")
        if name.startswith("asked"):  # the last 10% of steps' turn-1 reward of each ask
            asks = {}
            for row in completions:
                if row["step"] >= rows[-tenth]["step"] and row["turn"] == 1:
                    ask = AskedRatioEnv().examples[row["example"]]["times"]
                    asks.setdefault(ask, []).append(row["reward"])
            lines[-1] += " " + " ".join(f"{k}x: {mean(asks[k]):.2f}" for k in sorted(asks))
    print(f"\ndemo, seed {args.seed}, {args.steps} steps; reward_mean (turn 1's); explained variance: over "
          "the last 10% of steps' rows together, and per step: the mean (median) of those steps'")
    print("| run | first 10% | last 10% | ratio | explained variance, last 10% | per step | between states "
          "| reward every 15 steps | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
