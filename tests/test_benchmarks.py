"""The GPU benchmark's smoke run on the CPU (tests/bench_gpu.py --small): the script runs to its table,
and the sampler it times agrees with transformers' greedy decoding. Speed is the benchmark's business,
not a test's."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_advantages_statistics_by_hand():
    """bench_advantages.py's numbers (numpy's): the final reward and the steps to reach a target."""
    sys.path.insert(0, str(ROOT / "tests"))
    import bench_advantages as bench
    rewards = [0.1 * s for s in range(30)]  # the mean of steps k..k+9 is 0.1 k + 0.45
    assert bench.final_reward(rewards) == sum(rewards[-3:]) / 3
    assert bench.steps_to_reach(rewards, 1.0) == 16  # k = 6 (1.05): the 10 steps end at step 15, the 16th
    assert bench.steps_to_reach(rewards, 9.0) is None and bench.steps_to_reach([2.0] * 10, 2.0) == 10


def test_bench_gpu_small_runs_to_its_table():
    p = subprocess.run([sys.executable, "tests/bench_gpu.py", "--small", "--device", "cpu"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "greedy equal to model.generate: True" in p.stdout, p.stdout
    for title in ("| decoding,", "| log-prob pass,", "| one train_step,", "full fine-tuning, bytes per parameter"):
        assert title in p.stdout, f"no {title!r} in:\n{p.stdout}"


def test_bench_team_small_runs_to_its_table():
    """tests/bench_team.py --small (n = 1, 2, the paper's setting, 8 new tokens, 2 repeats) runs to both
    of its tables on the CPU, with the batched team's row in each."""
    p = subprocess.run([sys.executable, "tests/bench_team.py", "--small", "--device", "cpu"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    for title in ("| step seconds, paper: B=1 G=4 8 new tokens", "| ops dispatched, paper: B=1 G=4",
                  "| 2 agents, batched |", "peak memory: printed on CUDA only"):
        assert title in p.stdout, f"no {title!r} in:\n{p.stdout}"
