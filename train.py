"""
Train n cooperating agents with MAGRPO (arXiv 2508.04652, Sec. 2).

CPU demo, two tiny random-init agents on the offline demo env (about a minute, no downloads):
    python train.py
The paper's coding setup on a GPU (helper writes aux, main writes the function):
    python train.py --env coding --dataset humaneval --model Qwen/Qwen2.5-Coder-3B --out runs/code
One model per agent (a heterogeneous team), each on its own GPU (--device auto, the default,
spreads the agents over the visible GPUs):
    python train.py --env coding --model Qwen/Qwen2.5-Coder-1.5B,Qwen/Qwen2.5-Coder-3B --device cuda:0,cuda:1

Writes OUT/metrics.jsonl (one JSON object per step) and OUT/agent_0, OUT/agent_1, ... which load
back with transformers' from_pretrained. Flags are named like TRL's GRPOConfig where one applies.
"""
import argparse
import json
import os
import random
import sys
import time

import torch
from tqdm import tqdm

import envs
import magrpo

# Defaults that depend on the model: the tiny demo model learns from scratch (high lr, short
# outputs, big groups); real models use the paper's settings (Sec. 2: G=4, lr 1e-5, 256 tokens).
TINY_DEFAULTS = dict(num_generations=8, max_new_tokens=24, learning_rate=3e-3, steps=150, batch_size=2)
PAPER_DEFAULTS = dict(num_generations=4, max_new_tokens=256, learning_rate=1e-5, steps=1000, batch_size=1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", help="hub name or local path; 'tiny' (default) is the "
                   "built-in random-init model; repeat or give a comma list for one model per agent")
    p.add_argument("--num-agents", type=int, help="number of agents (default: the env's)")
    p.add_argument("--env", default="demo", help=f"one of {', '.join(sorted(envs.ENVS))}")
    p.add_argument("--dataset", help="the env's data: a name it knows or a JSONL path")
    p.add_argument("--split", help="named split (train, eval, test) or a slice like 33:133")
    p.add_argument("--text-field", help="writing envs: the JSONL field holding the text")
    p.add_argument("--chat-template", action="store_true", help="wrap prompts in the tokenizer's chat template")
    p.add_argument("--num-generations", type=int, help="G, completions per agent per prompt (>= 2)")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--loss-type", default="seq_sum", help=f"one of {', '.join(magrpo.LOSS_TYPES)}")
    p.add_argument("--advantage", default="mean", help="mean (Eq. 1), rloo or std")
    p.add_argument("--joint", default="aligned", help="joint actions: aligned (G of them) or cross (G^n)")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="prompts per step")
    p.add_argument("--micro-batch-size", type=int, default=8, help="rows per log-prob forward/backward")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ...; a comma list for one per "
                   "agent; auto: agent i on GPU i mod the GPU count, else the CPU")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(magrpo.DTYPES)}")
    p.add_argument("--out", default="out", help="directory for metrics.jsonl and the trained agents")
    p.add_argument("--save-every", type=int, default=0, help="also save the agents every N steps (0: only at the end)")
    p.add_argument("--eval-every", type=int, default=0, help="every N steps, the greedy joint reward on "
                   "--eval-split, logged as eval_reward_mean (0: off)")
    p.add_argument("--eval-split", default="eval", help="the in-training eval split (HumanEval: [:32])")
    p.add_argument("--eval-limit", type=int, default=32, help="at most this many eval examples")
    return p.parse_args(argv)


def fail(flag, message, prog="train.py"):
    """One clear line naming the flag, not a traceback."""
    sys.exit(f"{prog}: error: {flag}: {message}")


def per_agent(values, n, flag, prog="train.py"):
    """Expand a flag given once or as a comma list into one value per agent."""
    if len(values) == 1:
        return values * n
    if len(values) != n:
        fail(flag, f"gave {len(values)} values for {n} agents", prog)
    return values


def build_env(args, prog="train.py", split=None, flag=None):
    """The env of --env with the data flags (or another `split` of the same data, named by `flag`);
    a bad value ends with one line naming the flag."""
    options = {k: getattr(args, k) for k in ("dataset", "split", "text_field") if getattr(args, k)}
    if args.num_agents is not None:
        options["num_agents"] = args.num_agents
    if split is not None:
        options["split"] = split
    try:
        return envs.make_env(args.env, **options)
    except (ValueError, OSError, TypeError) as e:
        fail(flag or ("--env" if args.env not in envs.ENVS else "--dataset/--split/--num-agents"), str(e), prog)


def model_names(args):
    """--model given repeated and/or as comma lists, flattened; the tiny model by default."""
    return [m.strip() for spec in (args.model or [magrpo.TINY]) for m in spec.split(",") if m.strip()]


def agent_devices(args, n, prog="train.py"):
    """One device per agent from --device; "auto" puts agent i on GPU i mod the GPU count (two 3B
    agents with their optimizers do not fit on one 80 GB GPU), else on the CPU."""
    gpus = torch.cuda.device_count()
    devices = [d.strip() for d in args.device.split(",") if d.strip()]
    if devices == ["auto"]:
        return [f"cuda:{i % gpus}" if gpus else "cpu" for i in range(n)]
    return per_agent(devices, n, "--device", prog)


def check_sampling_and_dtype(args, prog="train.py"):
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        fail("--temperature/--top-p", "need temperature >= 0 and 0 < top_p <= 1", prog)
    if args.dtype not in magrpo.DTYPES:
        fail("--dtype", f"unknown {args.dtype!r}: use one of {', '.join(magrpo.DTYPES)}", prog)


def resolve(args):
    """Fill defaults and check every flag; returns (env, agents)."""
    models = model_names(args)
    defaults = TINY_DEFAULTS if all(m == magrpo.TINY for m in models) else PAPER_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.num_generations < 2:
        fail("--num-generations", f"must be >= 2 for group-relative advantages, got {args.num_generations}")
    for flag, value in (("--steps", args.steps), ("--batch-size", args.batch_size), ("--eval-limit", args.eval_limit),
                        ("--max-new-tokens", args.max_new_tokens), ("--micro-batch-size", args.micro_batch_size)):
        if value < 1:
            fail(flag, f"must be >= 1, got {value}")
    check_sampling_and_dtype(args)
    if args.dtype in ("float16", "fp16"):  # fp16 gradients overflow without loss scaling, which we skip
        fail("--dtype", "float16 training needs loss scaling, which this trainer does not do: use bfloat16")
    if args.learning_rate <= 0:
        fail("--learning-rate", f"must be > 0, got {args.learning_rate}")
    if args.loss_type not in magrpo.LOSS_TYPES:
        fail("--loss-type", f"unknown {args.loss_type!r}: use one of {', '.join(magrpo.LOSS_TYPES)}")
    if args.advantage not in magrpo.ADVANTAGE_MODES:
        fail("--advantage", f"unknown {args.advantage!r}: use one of {', '.join(magrpo.ADVANTAGE_MODES)}")
    if args.joint not in magrpo.JOINT_MODES:
        fail("--joint", f"unknown {args.joint!r}: use one of {', '.join(magrpo.JOINT_MODES)}")
    env = build_env(args)
    n = env.num_agents
    devices = agent_devices(args, n)
    models = per_agent(models, n, "--model")
    agents = []
    for i, (name, device) in enumerate(zip(models, devices)):
        try:
            model, tok = magrpo.load_agent_model(name, device, args.dtype, seed=args.seed + i)
        except (ValueError, RuntimeError) as e:
            fail("--model", str(e))
        if args.chat_template and tok.chat_template is None:
            fail("--chat-template", f"the tokenizer of {name!r} has no chat template")
        agents.append(magrpo.Agent(model, tok, magrpo.make_optimizer(model, args.learning_rate, args.weight_decay),
                                   chat_template=args.chat_template))
    return env, agents


def eval_reward(agents, env, max_new_tokens, limit, batch_size=8):
    """Mean shared reward of greedy joint outputs on the first `limit` examples of `env`:
    decentralised execution (Sec. 1), each agent decoding alone from its own prompt."""
    examples, total = env.examples[:limit], 0.0
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        rollouts = magrpo.sample_agents(agents, env, batch, 1, max_new_tokens, temperature=0)
        joint = [tuple(r.texts[b][0] for r in rollouts) for b in range(len(batch))]
        total += sum(float(r) for r in env.rewards(batch, joint))
    return total / len(examples)


def save_agents(agents, out):
    for i, agent in enumerate(agents):
        agent.model.save_pretrained(os.path.join(out, f"agent_{i}"))
        agent.tokenizer.save_pretrained(os.path.join(out, f"agent_{i}"))


def train(args):
    env, agents = resolve(args)
    eval_env = build_env(args, split=args.eval_split, flag="--eval-split") if args.eval_every > 0 else None
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "args.json"), "w") as f:  # eval.py --agents reads it back
        json.dump(vars(args), f, indent=1)
    order = []  # examples are drawn in shuffled epochs, so every one is seen before any repeats
    log_path = os.path.join(args.out, "metrics.jsonl")
    recent = []
    bar = tqdm(range(args.steps), desc=f"magrpo {env.name}", dynamic_ncols=True)
    try:
        with open(log_path, "w") as log:
            for step in bar:
                batch = []
                while len(batch) < args.batch_size:
                    if not order:
                        order = random.sample(range(len(env.examples)), len(env.examples))
                    batch.append(env.examples[order.pop()])
                t0 = time.time()
                m = magrpo.train_step(agents, env, batch, args.num_generations, args.max_new_tokens,
                                      args.temperature, args.top_p, args.loss_type, args.advantage,
                                      args.micro_batch_size, seed=args.seed * 100003 + step * 101,
                                      joint_mode=args.joint)
                m = {"step": step, **m, "seconds": round(time.time() - t0, 4)}
                samples = m.pop("samples")
                last = step == args.steps - 1
                if eval_env is not None and (step % args.eval_every == 0 or last):
                    m["eval_reward_mean"] = eval_reward(agents, eval_env, args.max_new_tokens, args.eval_limit)
                    tqdm.write(f"step {step:5d} eval reward {m['eval_reward_mean']:.3f} ({eval_env.name}, {args.eval_split})")
                if args.save_every > 0 and step > 0 and step % args.save_every == 0:
                    save_agents(agents, args.out)
                log.write(json.dumps(m) + "\n")
                log.flush()
                recent = (recent + [m["reward_mean"]])[-20:]
                bar.set_postfix(reward=f"{sum(recent) / len(recent):.3f}", zero_adv=m["zero_adv_groups"])
                if step % max(1, args.steps // 10) == 0 or last:
                    tqdm.write(f"step {step:5d} reward {m['reward_mean']:.3f} | " +
                               " | ".join(repr(s[:60]) for s in samples))
    except KeyboardInterrupt:
        print("interrupted: saving the agents before exiting", file=sys.stderr)
    finally:
        save_agents(agents, args.out)  # never lose the work done so far
    print(f"wrote {log_path} and {len(agents)} agents under {args.out}/agent_*")
    return log_path


if __name__ == "__main__":
    train(parse_args())
