"""
The paper's writing comparison (arXiv 2508.04652, Sec. 5, TLDR) end to end, measured by this code: a
2-agent MAGRPO team and a 1-agent GRPO writer (one model writing both parts, trained the same way: not
in the paper, the ablation that tells what training does from what the team does), each trained for
the same steps over several seeds, then evaluated with eval.py on the same held-out rows beside the
untrained baselines (single, concat, sequential, discussion). Each run is a train.py or eval.py
command line, printed before it runs, so that any row can be made again by hand; its output is kept
under --out, and a rerun reuses what is finished and continues a train run that was stopped
(train.py --resume). docs/results.md holds the table and what it shows. Not a test (pytest does not
collect bench_*.py).

    ../shared/tools/smollm2.sh runs/smollm2                            # SmolLM2-135M-Instruct, offline
    python tests/bench_paper.py --model runs/smollm2 --out runs/paper  # the CPU table (docs/results.md)
    python tests/bench_paper.py --model runs/smollm2 --out runs/paper --jobs 3 --cpu-threads 1  # 3 at once
    # the paper's scale on a GPU: Qwen3-1.7B, the authors' TLDR rows (hub), their lr and lengths
    python tests/bench_paper.py --model Qwen/Qwen3-1.7B --single-model Qwen/Qwen3-4B --dataset tldr \
        --steps 1000 --learning-rate 5e-6 --lora-r 0 --max-new-tokens 256 --eval-rows 1000 --eval-samples 15 \
        --top-p 0.99 --no-chat-template --out runs/paper-qwen3
"""
import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import eval as evaluation  # noqa: E402
SETTINGS = {"magrpo": 2, "grpo": 1}  # the trained settings and their number of agents
BASELINES = ("single", "concat", "sequential", "discussion")
# What the reward saw, from eval.py's details: how often L1 (both parts 8..256 words) and L2 (the length
# ratio's band) were earned, each part's words, and the two ratios the levels score (rewards.WritingReward).
DETAILS = (("earned/structure", "L1 earned"), ("earned/coordination", "L2 earned"), ("tokens_0", "words 1"),
           ("tokens_1", "words 2"), ("length_ratio", "length ratio"), ("unique_ratio", "unique ratio"))
# The writing reward's levels (rewards.tldr_reward, Sec. 5) with the column names of docs/results.md.
LEVELS = (("level_structure", "structure"), ("level_coordination", "length ratio"),
          ("level_vocabulary", "unique words"), ("level_style", "transitions"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the base model of every agent and baseline")
    p.add_argument("--single-model", help="the single baseline's model (the paper's: a larger one, Qwen3-4B)")
    p.add_argument("--out", default="runs/paper", help="run dirs, reports, logs; reused by a rerun")
    p.add_argument("--seeds", default="0,1,2", help="training seeds of each trained setting")
    p.add_argument("--settings", default="magrpo,grpo", help="which trained settings to run")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64, help="per agent, in training and in eval")
    p.add_argument("--learning-rate", type=float, default=2e-4)
    p.add_argument("--lora-r", type=int, default=16, help="0: full fine-tuning")
    p.add_argument("--dataset", default=None, help="the tldr env's data (default: the built-in corpus)")
    p.add_argument("--train-split", default="train")
    p.add_argument("--eval-split", default="test", help="the held-out rows every method is scored on")
    p.add_argument("--eval-rows", type=int, default=4, help="the first N rows of --eval-split")
    p.add_argument("--eval-samples", type=int, default=4, help="joint samples per row (paper: 15)")
    p.add_argument("--eval-batch-size", type=int, default=4, help="eval.py --batch-size (rows per call)")
    p.add_argument("--eval-seed", type=int, default=0, help="eval.py --seed: the same for every method")
    p.add_argument("--top-p", type=float, help="train.py's --top-p (Qwen: 0.99)")
    p.add_argument("--chat-template", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap prompts in the model's chat template, so that an instruct model's "
                        "summary can end (raw prompts run to --max-new-tokens)")
    p.add_argument("--save-every", type=int, default=5, help="train.py's checkpoints, for --resume")
    p.add_argument("--cpu-threads", type=int, help="per job (with --jobs 2 on 2 cores: 1)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once")
    p.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True,
                   help="also evaluate the untrained baselines (off: the trained settings only)")
    p.add_argument("--curves", help="write each trained run's learning curve into this folder (NAME.svg)")
    p.add_argument("--python", default=sys.executable)
    return p.parse_args(argv)


def shared_flags(args):
    """The flags train.py and eval.py both take, as this benchmark sets them."""
    flags = ["--env", "tldr", "--model", args.model, "--max-new-tokens", str(args.max_new_tokens)]
    if args.dataset:
        flags += ["--dataset", args.dataset]
    if args.chat_template:
        flags += ["--chat-template"]
    if args.cpu_threads:
        flags += ["--cpu-threads", str(args.cpu_threads)]
    return flags


def train_command(args, setting, seed):
    out = Path(args.out, "train", f"{setting}-s{seed}")
    cmd = [args.python, "train.py", *shared_flags(args), "--num-agents", str(SETTINGS[setting]),
           "--split", args.train_split, "--num-generations", str(args.num_generations),
           "--learning-rate", str(args.learning_rate), "--batch-size", "1", "--steps", str(args.steps),
           "--seed", str(seed), "--save-every", str(args.save_every), "--out", str(out)]
    if args.top_p is not None:  # for training: eval.py keeps the paper's sampling (T 0.8, top-p 0.95)
        cmd += ["--top-p", str(args.top_p)]
    if args.lora_r:
        cmd += ["--lora-r", str(args.lora_r)]
    return cmd, out


def eval_command(args, name, methods, agents=None):
    """eval.py on the held-out rows; a trained run's flags come from its args.json (--agents)."""
    report = Path(args.out, "eval", f"{name}.json")
    cmd = [args.python, "eval.py", *shared_flags(args), "--split", args.eval_split,
           "--limit", str(args.eval_rows),
           "--num-samples", str(args.eval_samples), "--batch-size", str(args.eval_batch_size),
           "--latency-problems", "0", "--seed", str(args.eval_seed), "--methods", ",".join(methods),
           "--out", str(report)]
    if agents is None and args.single_model:
        cmd += ["--single-model", args.single_model]
    if agents is not None:
        cmd += ["--agents", str(agents), "--num-agents", str(SETTINGS[name.split("-")[0]])]
    return cmd, report


def shown(cmd):
    """A command as a user types it from the repository root."""
    return " ".join(("python" if c == sys.executable else c) for c in cmd)


def run_logged(cmd, log, what):
    """One command, its output to `log`; -> its wall seconds. A failure stops the benchmark, with the log."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}: {shown(cmd)}", flush=True)
    t0 = time.time()
    with open(log, "a") as f:
        status = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if status:
        raise SystemExit(f"bench_paper.py: {what} failed with status {status}; see {log}")
    return time.time() - t0


def finished_report(path, methods):
    """The report at `path` if eval.py finished each of `methods` (a ^C writes those it finished)."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    return report if all(m in report["methods"] for m in methods) else None


def record_time(args, name, seconds):
    with open(Path(args.out, "times.jsonl"), "a") as f:
        f.write(json.dumps({"run": name, "seconds": round(seconds, 1)}) + "\n")


def train_summary(out, steps):
    """A train run's numbers from its metrics.jsonl: the mean reward of its first and last fifth of steps,
    the summed step seconds, and each agent's mean completion tokens over the last fifth."""
    rows = [json.loads(line) for line in open(Path(out, "metrics.jsonl"))][:steps]
    fifth = max(1, len(rows) // 5)
    first, last = rows[:fifth], rows[-fifth:]
    tokens = [np.mean([r[k] for r in last]) for k in sorted(last[0]) if k.startswith("completion_len_")]
    return {"reward_first": np.mean([r["reward_mean"] for r in first]),
            "reward_last": np.mean([r["reward_mean"] for r in last]),
            "zero_adv_groups": sum(r["zero_adv_groups"] for r in rows),
            "step_seconds": sum(r["seconds"] for r in rows), "tokens_last": tokens}


def chain(args, setting, seed):
    """One trained run, then its eval: -> (name, the magrpo method's metrics). Finished parts are reused."""
    name = f"{setting}-s{seed}"
    cmd, out = train_command(args, setting, seed)
    log = Path(args.out, "logs", f"{name}.log")
    if not Path(out, "final.json").is_file():
        resume = ["--resume"] if Path(out, "args.json").is_file() else []
        record_time(args, f"train {name}", run_logged(cmd + resume, log, f"train {name}"))
    s = train_summary(out, args.steps)
    print(f"train {name}: reward {s['reward_first']:.3f} (first fifth) -> {s['reward_last']:.3f} "
          f"(last fifth), "
          f"{s['zero_adv_groups']} zero-advantage groups, {s['step_seconds'] / 60:.1f} min of steps, "
          f"tokens per agent (last fifth) {', '.join(f'{t:.0f}' for t in s['tokens_last'])}", flush=True)
    cmd, report_path = eval_command(args, name, ["magrpo"], agents=out)
    report = finished_report(report_path, ["magrpo"])
    if report is None:
        record_time(args, f"eval {name}", run_logged(cmd, log, f"eval {name}"))
        report = finished_report(report_path, ["magrpo"])
    print_row(f"{name} (trained)", report["methods"]["magrpo"])
    return name, report["methods"]["magrpo"]


def baselines(args):
    """The untrained baselines of eval.py on the same rows: -> {method: metrics}."""
    cmd, report_path = eval_command(args, "baselines", BASELINES)
    report = finished_report(report_path, BASELINES)
    if report is None:
        seconds = run_logged(cmd, Path(args.out, "logs", "baselines.log"), "eval baselines")
        record_time(args, "eval baselines", seconds)
        report = finished_report(report_path, BASELINES)
    for method in BASELINES:
        print_row(f"{method} (untrained)", report["methods"][method])
    return report["methods"]


def columns(metrics):
    return [metrics["reward"], metrics["reward_std"]] + [metrics.get(key, 0.0) for key, _ in LEVELS] + \
        [metrics["tokens_per_sample"]]


def print_row(label, metrics):
    cells = " ".join(f"{v:.3f}" for v in columns(metrics)[:-1])
    print(f"row {label}: reward, sample std, {', '.join(n for _, n in LEVELS)}: {cells}; "
          f"tokens {metrics['tokens_per_sample']:.1f}", flush=True)


def table(args, base, trained):
    """The markdown table: each baseline's row, each trained setting's mean ± std over its seeds."""
    head = ["method", "seeds", "reward", "reward std (samples)", *(n for _, n in LEVELS), "tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in BASELINES if base else ():
        cells = [f"{v:.3f}" for v in columns(base[method])[:-1]] + [f"{columns(base[method])[-1]:.0f}"]
        lines.append(f"| {method} (untrained) | - | " + " | ".join(cells) + " |")
    for setting in args.settings:
        rows = np.array([columns(metrics) for name, metrics in trained if name.startswith(setting + "-")])
        if not len(rows):
            continue
        mean, std = rows.mean(0), rows.std(0, ddof=1) if len(rows) > 1 else np.zeros(rows.shape[1])
        cells = [f"{m:.3f} ± {s:.3f}" for m, s in zip(mean[:-1], std[:-1])] + [f"{mean[-1]:.0f}"]
        label = "MAGRPO, 2 agents" if setting == "magrpo" else "GRPO, 1 agent"
        lines.append(f"| {label} (trained) | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(base, details):
    """What the reward saw: each baseline's details, each trained setting's mean over its seeds."""
    head = ["method", *(n for _, n in DETAILS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = [(f"{m} (untrained)", [base[m]]) for m in BASELINES if base]
    for setting in SETTINGS:
        runs = [d for name, d in details if name.startswith(setting + "-")]
        if runs:
            rows.append((f"{setting} (trained, {len(runs)} seeds)", runs))
    for label, runs in rows:
        cells = [np.mean([d.get(key, 0.0) for d in runs]) for key, _ in DETAILS]
        lines.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in cells) + " |")
    return "\n".join(lines)


def curve_table(args):
    """Each trained setting's reward per step, mean (and min, max) over its seeds, from metrics.jsonl."""
    lines = ["| step | " + " | ".join(f"{s} reward (min, max)" for s in args.settings) + " |",
             "|" + "---|" * (len(args.settings) + 1)]
    for step in range(args.steps):
        cells = []
        for setting in args.settings:
            values = []
            for seed in args.seeds:
                path = Path(args.out, "train", f"{setting}-s{seed}", "metrics.jsonl")
                rows = [json.loads(line) for line in open(path)] if path.is_file() else []
                values += [r["reward_mean"] for r in rows if r["step"] == step]
            cells.append(f"{np.mean(values):.2f} ({min(values):.2f}, {max(values):.2f})" if values else "-")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        raise SystemExit(f"bench_paper.py: --settings: unknown {', '.join(unknown)}; "
                         f"use {', '.join(SETTINGS)}")
    for sub in ("train", "eval", "logs"):
        Path(args.out, sub).mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    # Seed 0 of every setting first, so that a run stopped early holds comparable rows.
    chains = [(setting, seed) for seed in args.seeds for setting in args.settings]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        base = pool.submit(baselines, args) if args.baselines else None
        trained = [pool.submit(chain, args, setting, seed) for setting, seed in chains]
        base, trained = base and base.result(), [f.result() for f in trained]
    print(f"\nheld-out rows: the first {args.eval_rows} of --eval-split {args.eval_split}, "
          f"{args.eval_samples} samples each; {args.steps} steps per trained run; "
          f"this invocation took {(time.time() - t0) / 60:.1f} min\n")
    print(table(args, base, trained))
    details = []
    for setting, seed in chains:
        name = f"{setting}-s{seed}"
        report = finished_report(Path(args.out, "eval", f"{name}.json"), ["magrpo"])
        details.append((name, report["details"]["magrpo"]))
        if args.curves:  # drawn from metrics.jsonl as train.py draws curve.svg, which a resumed run may lack
            Path(args.curves).mkdir(parents=True, exist_ok=True)
            rows = [json.loads(line) for line in open(Path(args.out, "train", name, "metrics.jsonl"))]
            Path(args.curves, f"{name}.svg").write_text(evaluation.curve_svg(rows[:args.steps]))
    base_details = None
    if args.baselines:
        base_details = finished_report(Path(args.out, "eval", "baselines.json"), BASELINES)["details"]
    print("\nwhat the reward saw (eval.py's details; words 1, 2: each part's words)\n")
    print(detail_table(base_details, details))
    print("\nthe training reward per step, mean over seeds (min, max)\n")
    print(curve_table(args))


if __name__ == "__main__":
    main()
