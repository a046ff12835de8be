"""
n LoRA agents on one shared frozen base, one MAGRPO step two ways: one agent at a time (a plain
list: a generate call and an update per agent) against batched (models.Team: one generate call and
one forward/backward per micro-batch for all of them), for n = 1, 2, 4. Not a test (pytest does not
collect bench_*.py).

    python tests/bench_team.py                                    # the tiny model, the CPU, ~1 minute
    python tests/bench_team.py --settings paper --repeats 9
    bash ../shared/tools/smollm2.sh /tmp/smollm2                  # SmolLM2-135M-Instruct, a real model
    python tests/bench_team.py --model /tmp/smollm2 --max-new-tokens 16 --repeats 3
    python tests/bench_team.py --device cuda                      # bf16 on a GPU (--dtype auto)
    python tests/bench_team.py --small                            # the smoke run (tests/test_benchmarks.py)

Settings: paper (B = 1 prompt, G = 4, 32 new tokens: the paper's) and demo (B = 2, G = 8, 24 tokens:
the demo env's); --batch-size, --num-generations and --max-new-tokens replace a setting's values.
For each setting and n it prints
  - seconds: magrpo.sample_team (the step's sampling) and magrpo.update_team (Eq. 2: the log-prob pass,
    backward, each agent's AdamW), the median of --repeats steps but the first (a warm-up), the two
    ways alternating (their order swapped each repeat) so that machine noise hits both; speed-up = one
    at a time / batched. Both ways start from the same weights and sample with the same seeds, so they
    make the same tokens and updates (tests/test_lora.py holds this).
  - ops: the operations torch dispatches (a TorchDispatchMode) in one decode step of every agent's
    B * G rows, and in the log-prob pass (forward + backward) of every agent's rollout; a GPU launches
    about one kernel per op, which bounds eager decoding of small models. ratio: to one agent's.
  - peak memory (CUDA only): torch.cuda.max_memory_allocated during a step, above what was allocated
    at its start (the weights and AdamW's state: shared by both ways, so they are not counted).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import magrpo  # noqa: E402
import models  # noqa: E402
import sampler  # noqa: E402
from test_sampler import DispatchCount  # noqa: E402

SETTINGS = {"paper": (1, 4, 32), "demo": (2, 8, 24)}  # (B, G, new tokens)
MB = 2 ** 20


def make_agents(args, n):
    """n LoRA agents (r = --lora-r) on one base, agent i's adapter seeded i, each with AdamW."""
    bases = {}
    agents = [models.load_agent(args.model, args.device, args.dtype, i, lora=models.LoRAConfig(args.lora_r),
                                bases=bases, base_seed=0) for i in range(n)]
    for agent in agents:
        agent.optimizer = models.make_optimizer(agent.model, 1e-3)
    return agents


def prompts_of(n, B):
    return [[f"Agent {i}: write one sentence about topic number {b}." for b in range(B)] for i in range(n)]


def sync(args):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def step(agents, cfg, B, k, args):
    """Step k: sampling and update seconds, and (CUDA) the step's peak memory above its start."""
    n, G = len(agents), cfg.num_generations
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated() if args.device.startswith("cuda") else 0
    sync(args)
    t0 = time.perf_counter()
    rollouts = magrpo.sample_team(agents, prompts_of(n, B), G, cfg, [1000 * k + b for b in range(B)])
    sync(args)
    t1 = time.perf_counter()
    g = torch.Generator().manual_seed(k)
    parts = [[(r, r.completion_mask, torch.randn(B * G, generator=g).to(r.completion_mask.device), 1.0)]
             for r in rollouts]
    magrpo.update_team(agents, parts, cfg)
    sync(args)
    t2 = time.perf_counter()
    peak = torch.cuda.max_memory_allocated() - start if args.device.startswith("cuda") else None
    return t1 - t0, t2 - t1, peak


def decode_ops(model, rows, args, team=None):
    """Ops of one decode step of `rows` rows (a Team's: its agents' rows in equal blocks)."""
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, 200, (rows, 8), generator=g).to(args.device)
    prompt_mask = torch.ones_like(prompt_ids)
    if team is not None:
        team.select(torch.arange(len(team), device=args.device).repeat_interleave(rows // len(team)))
    length = 8 + 16
    logits, cache = sampler.prefill(model, prompt_ids, prompt_mask, torch.arange(rows, device=args.device), length)
    mask, positions, slot = sampler.decode_inputs(prompt_mask, length, model.dtype)
    with torch.no_grad(), sampler.attention(model, sampler.CACHED):
        sampler.decode_step(model, cache, logits.argmax(-1), mask, positions, slot)  # warm any caches
        with DispatchCount() as count:
            sampler.decode_step(model, cache, logits.argmax(-1), mask, positions + 1, slot + 1)
    return count.ops


def pass_ops(model, rollout):
    """Ops of the log-prob pass of Eq. 2 on a rollout's rows, forward and backward."""
    with DispatchCount() as count:
        magrpo.completion_logprobs(model, rollout).sum().backward()
    model.zero_grad(set_to_none=True)
    return count.ops


def ops_of(agents, cfg, B, batched, args):
    """(decode step ops, log-prob pass ops) of a step of every agent, one at a time or batched."""
    n, rows = len(agents), B * cfg.num_generations
    rollouts = magrpo.sample_team(agents, prompts_of(n, B), cfg.num_generations, cfg, list(range(B)))
    if batched:
        return (decode_ops(agents.model, rows * n, args, agents),
                pass_ops(agents.model, sampler.joined(rollouts, range(n))))
    return (sum(decode_ops(a.model, rows, args) for a in agents),
            sum(pass_ops(a.model, r) for a, r in zip(agents, rollouts)))


def run_setting(name, B, G, T, args):
    cfg = magrpo.Config(num_generations=G, max_new_tokens=T)
    cuda = args.device.startswith("cuda")
    times, ops = {}, {}
    for n in args.agents:
        ways = {"one at a time": make_agents(args, n)}
        if n > 1:
            ways["batched"] = models.Team(make_agents(args, n))
        runs = {way: [] for way in ways}
        for k in range(args.repeats):
            order = list(ways) if k % 2 == 0 else list(ways)[::-1]
            for way in order:
                runs[way].append(step(ways[way], cfg, B, k, args))
        for way, steps in runs.items():
            kept = steps[1:] or steps  # the first is a warm-up
            times[n, way] = (statistics.median(s for s, _, _ in kept), statistics.median(u for _, u, _ in kept),
                             statistics.median(s + u for s, u, _ in kept), max(p or 0 for _, _, p in kept) / MB)
            ops[n, way] = ops_of(ways[way], cfg, B, way == "batched", args)
    print(f"\n| step seconds, {name}: B={B} G={G} {T} new tokens, median of {max(args.repeats - 1, 1)} "
          f"| sampling | update | total | speed-up |" + (" step peak MiB |" if cuda else ""), flush=True)
    print("|---|---:|---:|---:|---:|" + ("---:|" if cuda else ""))
    for (n, way), (s, u, total, peak) in times.items():
        speedup = f"{times[n, 'one at a time'][2] / total:.2f}x" if way == "batched" else ""
        print(f"| {n} agent{'s' * (n > 1)}, {way} | {s:.3f} | {u:.3f} | {total:.3f} | {speedup} |"
              + (f" {peak:.0f} |" if cuda else ""), flush=True)
    one = ops[args.agents[0], "one at a time"] if args.agents[0] == 1 else None
    print(f"\n| ops dispatched, {name}: B={B} G={G} | decode step | ratio to one agent's "
          f"| log-prob pass, fwd + bwd | ratio to one agent's |")
    print("|---|---:|---:|---:|---:|")
    for (n, way), (dec, lp) in ops.items():
        ratios = [f"{x / y:.2f}" if one else "" for x, y in zip((dec, lp), one or (1, 1))]
        print(f"| {n} agent{'s' * (n > 1)}, {way} | {dec} | {ratios[0]} | {lp} | {ratios[1]} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny, or a model directory (e.g. SmolLM2's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on a GPU, float32 on the CPU")
    p.add_argument("--lora-r", type=int, default=4, help="the rank (4: as the README's try, python train.py --lora-r 4)")
    p.add_argument("--agents", default="1,2,4", help="the team sizes n, comma-separated")
    p.add_argument("--settings", default="paper,demo", help="paper (B=1 G=4 32 tokens), demo (B=2 G=8 24)")
    p.add_argument("--batch-size", type=int, help="B, prompts per agent: replaces every setting's")
    p.add_argument("--num-generations", type=int, help="G: replaces every setting's")
    p.add_argument("--max-new-tokens", type=int, help="replaces every setting's")
    p.add_argument("--repeats", type=int, default=5, help="steps each way; the first is a warm-up")
    p.add_argument("--cpu-threads", type=int, help="torch's threads on the CPU (default: train.py's, "
                   "models.cpu_threads: 1 for the tiny model, one per core for real ones)")
    p.add_argument("--small", action="store_true", help="the smoke run: n = 1, 2, the paper's setting, "
                   "8 new tokens, 2 repeats")
    args = p.parse_args()
    if args.small:
        args.agents, args.settings, args.max_new_tokens, args.repeats = "1,2", "paper", args.max_new_tokens or 8, 2
    args.agents = [int(n) for n in args.agents.split(",")]
    if args.device == "cpu":
        torch.set_num_threads(models.cpu_threads(args.cpu_threads, args.model == "tiny"))
    models.set_torch(torch.get_num_threads(), [args.device])
    torch.manual_seed(0)
    print(f"model={args.model} device={args.device} dtype={args.dtype} LoRA r={args.lora_r} "
          f"threads={torch.get_num_threads()} torch={torch.__version__}", flush=True)
    if not args.device.startswith("cuda"):
        print("peak memory: printed on CUDA only (on the CPU the process's peak RSS is not separable "
              "per configuration)", flush=True)
    for name in args.settings.split(","):
        B, G, T = SETTINGS[name]
        run_setting(name, args.batch_size or B, args.num_generations or G, args.max_new_tokens or T, args)


if __name__ == "__main__":
    main()
