"""
Eq. 1's group mean against the learned critics (--advantage critic) on the CPU demo, one seed: per run
the mean reward of the first and the last 10% of steps, their ratio, the critic's explained variance
(mean of the last 10% of steps), the reward every 15 steps (the curve) and the run's time. The table of
docs/critic.md. Not a test (pytest does not collect bench_*.py).

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
    """-> (metrics rows, seconds) of one demo run."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        train.train(train.parse_args(flags + ["--seed", str(seed), "--steps", str(steps), "--out", out,
                                              "--log-completions-every", "0", "--save-every", "0"]))
        seconds = time.perf_counter() - t0
        return [json.loads(line) for line in open(Path(out) / "metrics.jsonl")], seconds


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
        rows, seconds = run(RUNS[name], args.seed, args.steps)
        tenth = max(1, len(rows) // 10)
        first, last = mean(r["reward_mean"] for r in rows[:tenth]), mean(r["reward_mean"] for r in rows[-tenth:])
        explained = mean(r.get("critic_explained_variance") for r in rows[-tenth:])
        curve = " ".join(f"{r['reward_mean']:.2f}" for r in rows[::15])
        lines.append(f"| {name} | {first:.2f} | {last:.2f} | {last / first:.2f} | {explained:.2f} | {curve} | "
                     f"{seconds:.0f} |")
    print(f"\ndemo, seed {args.seed}, {args.steps} steps; reward_mean (turn 1's); explained variance: "
          "the last 10% of steps' mean")
    print("| run | first 10% | last 10% | ratio | explained variance | reward every 15 steps | s |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
