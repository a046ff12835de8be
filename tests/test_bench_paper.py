"""The paper-comparison benchmark's smoke run (tests/bench_paper.py) with the tiny model, one step: it
trains both settings, evaluates them beside the four baselines on the same held-out rows and prints
the table; a second invocation reuses every finished run instead of running it again. The numbers
are the benchmark's business (docs/results.md), not a test's."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bench_paper_smoke_runs_to_its_table_and_reuses_finished_runs(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": f"Passage {i}: the river rose, so the town built a wall "
                                        "and then the farmers moved their fields uphill."}) + "\n"
                            for i in range(6)))
    out = tmp_path / "paper"
    cmd = [sys.executable, "tests/bench_paper.py", "--model", "tiny", "--no-chat-template", "--dataset",
           str(data), "--train-split", ":4", "--eval-split", "4:", "--eval-rows", "2", "--eval-samples", "2",
           "--steps", "1", "--seeds", "0", "--max-new-tokens", "6", "--lora-r", "4", "--out", str(out),
           "--curves", str(tmp_path / "curves")]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    # Every run's command is printed as it starts, and every row as it is measured.
    for what in ("eval baselines: python eval.py", "train magrpo-s0: python train.py",
                 "train grpo-s0: python train.py", "eval magrpo-s0: python eval.py", "row grpo-s0 (trained)"):
        assert what in first.stdout, f"no {what!r} in:\n{first.stdout}"
    for label in ("| single (untrained) |", "| discussion (untrained) |",
                  "| MAGRPO, 2 agents (trained) | 1 |", "| GRPO, 1 agent (trained) | 1 |"):
        assert label in first.stdout, f"no {label!r} in:\n{first.stdout}"
    # The trained runs were scored on the baselines' rows, with one writer and two.
    reports = {name: json.loads((out / "eval" / f"{name}.json").read_text())
               for name in ("baselines", "magrpo-s0", "grpo-s0")}
    assert {r["config"]["split"] for r in reports.values()} == {"4:"}
    assert reports["grpo-s0"]["config"]["num_agents"] == 1
    assert reports["magrpo-s0"]["config"]["num_agents"] == 2
    for name in ("magrpo-s0", "grpo-s0"):  # each run's learning curve, drawn from its metrics.jsonl
        assert (tmp_path / "curves" / f"{name}.svg").read_text().startswith("<svg")
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "python train.py" not in again.stdout and "python eval.py" not in again.stdout, again.stdout
    assert first.stdout.split("| method |")[1] == again.stdout.split("| method |")[1]
