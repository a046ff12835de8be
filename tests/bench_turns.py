"""
What a second turn costs: seconds per training step of the CPU demo at T = 1 and T = 2 (and any
other settings), measured in one run on the same machine. Not a test (pytest does not collect
bench_*.py).

    python tests/bench_turns.py                       # demo, 20 steps each at T = 1 and T = 2
    python tests/bench_turns.py --steps 50 --expand all
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import magrpo  # noqa: E402
import sampler  # noqa: E402
import train  # noqa: E402


def seconds_per_step(num_turns, steps, expand):
    args = train.parse_args(["--num-turns", str(num_turns), "--expand", expand, "--steps", str(steps)])
    env, cfg = train.resolve_flags(args)
    agents = train.build(args, env)
    times = []
    for step in range(steps):
        batch = [env.examples[i] for i in train.batch_at(len(env.examples), args.seed, step, args.batch_size)]
        t0 = time.perf_counter()
        magrpo.train_step(agents, env, batch, cfg, [sampler.mix_seed(args.seed, step, j) for j in range(len(batch))])
        times.append(time.perf_counter() - t0)
    return sum(times[1:]) / (len(times) - 1)  # the first step pays one-off costs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--expand", default="best")
    args = p.parse_args()
    one = seconds_per_step(1, args.steps, args.expand)
    two = seconds_per_step(2, args.steps, args.expand)
    print(f"demo, tiny agents, {args.steps} steps each, --expand {args.expand}")
    print(f"T = 1: {one:.3f} s/step")
    print(f"T = 2: {two:.3f} s/step ({two / one:.2f}x)")


if __name__ == "__main__":
    main()
