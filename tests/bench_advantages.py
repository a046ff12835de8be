"""
The baseline family on the CPU demo: each --advantage mode (none: REINFORCE, mean: Eq. 1, rloo, std,
remax: the greedy joint answer's reward) trains the demo for a few seeds; prints, per mode, the final
reward (mean reward_mean of the last 10% of steps) and the steps until the reward, averaged over the
last 10 steps, first reaches 2.0. Not a test (pytest does not collect bench_*.py).

    python tests/bench_advantages.py                  # 5 modes x 3 seeds x 150 steps, ~15 minutes
    python tests/bench_advantages.py --seeds 0 --steps 60
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import magrpo  # noqa: E402
import runs  # noqa: E402
import train  # noqa: E402

# Every group baseline of --advantage (magrpo.Config.CHOICES, its one list), with its other names
# (std); the critic, a learned baseline, has its own benchmark (tests/bench_critic.py).
MODES = tuple(mode for mode in magrpo.Config.CHOICES["advantage"] if mode != "critic") + tuple(
    spelling for owner, spelling in runs.SPELLINGS if owner == "advantage")


def run(mode, seed, steps, target):
    """-> (final reward, steps to reach `target` or None, seconds) of one demo run."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        train.train(train.parse_args(["--advantage", mode, "--seed", str(seed), "--steps", str(steps),
                                      "--log-completions-every", "0", "--save-every", "0", "--out", out]))
        seconds = time.perf_counter() - t0
        rewards = [json.loads(line)["reward_mean"] for line in open(Path(out) / "metrics.jsonl")]
    return final_reward(rewards), steps_to_reach(rewards, target), seconds


def final_reward(rewards):
    """The mean reward of the last 10% of the steps (at least one)."""
    return float(np.mean(rewards[-max(1, len(rewards) // 10):]))


def steps_to_reach(rewards, target, window=10):
    """The steps until the mean reward of the last `window` steps first reaches target (None: never)."""
    means = np.convolve(rewards, np.ones(window), mode="valid") / window  # means[k]: steps k .. k + window - 1
    hits = np.flatnonzero(means >= target)
    return int(hits[0]) + window if hits.size else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--target", type=float, default=2.0)
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {m: [run(m, s, args.steps, args.target) for s in seeds] for m in MODES}
    print(f"\ndemo, tiny agents, {args.steps} steps, seeds {args.seeds}; final = mean reward of the last 10% "
          f"of steps; reached = steps until the 10-step mean reward reaches {args.target:g}")
    print(f"{'mode':8} {'final (each seed)':28} {'mean':>6} {'reached (each seed)':24} {'s/run':>6}")
    for m, rs in results.items():
        finals = " ".join(f"{f:.2f}" for f, _, _ in rs)
        reached = " ".join(str(r) if r is not None else "never" for _, r, _ in rs)
        print(f"{m:8} {finals:28} {np.mean([f for f, _, _ in rs]):6.2f} {reached:24} "
              f"{np.mean([s for _, _, s in rs]):6.1f}")


if __name__ == "__main__":
    main()
