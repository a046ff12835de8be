"""
Eq. 1's group mean against the learned critics (--advantage critic) on the CPU demo, one seed: per run
the mean reward of the first and the last 10% of steps, their ratio, the critic's explained variance
(mean of the last 10% of steps), the share of the returns' variance that lies between states (the
explained variance that V(s) = each state's own mean return would reach, on the same rows), the reward
every 15 steps (the curve) and the run's time. The table of docs/critic.md. Not a test (pytest does not
collect bench_*.py).

    python tests/bench_critic.py                        # 4 single-turn runs + 3 two-turn runs, 150 steps
    python tests/bench_critic.py --runs mean,central --steps 60
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train  # noqa: E402

RUNS = {"mean": [], "central": ["--advantage", "critic"],
        "per-agent": ["--advantage", "critic", "--critic", "per-agent"],
        "central-G1": ["--advantage", "critic", "--num-generations", "1"],
        "mean-2turn": ["--num-turns", "2"], "central-2turn": ["--advantage", "critic", "--num-turns", "2"],
        "per-agent-2turn": ["--advantage", "critic", "--critic", "per-agent", "--num-turns", "2"]}


def run(flags, seed, steps):
    """-> (metrics rows, completions rows, seconds) of one demo run."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        train.train(train.parse_args(flags + ["--seed", str(seed), "--steps", str(steps), "--out", out,
                                              "--save-every", "0"]))
        seconds = time.perf_counter() - t0
        read = lambda name: [json.loads(line) for line in open(Path(out) / name)]  # noqa: E731
        return read("metrics.jsonl"), read("completions.jsonl"), seconds


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
        explained = mean(r.get("critic_explained_variance") for r in rows[-tenth:])
        between = mean(between_states(completions, r["step"]) for r in rows[-tenth:])
        curve = " ".join(f"{r['reward_mean']:.2f}" for r in rows[::15])
        lines.append(f"| {name} | {first:.2f} | {last:.2f} | {last / first:.2f} | {explained:.2f} | "
                     f"{between:.2f} | {curve} | {seconds:.0f} |")
    print(f"\ndemo, seed {args.seed}, {args.steps} steps; reward_mean (turn 1's); explained variance: "
          "the last 10% of steps' mean")
    print("| run | first 10% | last 10% | ratio | explained variance | between states "
          "| reward every 15 steps | s |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
