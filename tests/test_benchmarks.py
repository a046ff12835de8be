"""The GPU benchmark's smoke run on the CPU (tests/bench_gpu.py --small): the script runs to its table,
and the sampler it times agrees with transformers' greedy decoding. Speed is the benchmark's business,
not a test's."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_gpu_small_runs_to_its_table():
    p = subprocess.run([sys.executable, "tests/bench_gpu.py", "--small", "--device", "cpu"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "greedy equal to model.generate: True" in p.stdout, p.stdout
    for title in ("| decoding,", "| log-prob pass,", "| one train_step,", "full fine-tuning, bytes per parameter"):
        assert title in p.stdout, f"no {title!r} in:\n{p.stdout}"
