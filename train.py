"""
Train n cooperating agents with MAGRPO (arXiv 2508.04652, Sec. 2; multi-turn: Sec. 3).

CPU demo, two tiny random-init agents on the offline demo env (about a minute, no downloads):
    python train.py
The same with a second turn: the env's feedback on the joint answer, then each agent revises:
    python train.py --num-turns 2
The paper's coding setup on a GPU (helper writes aux, main writes the function):
    python train.py --env coding --dataset humaneval --model Qwen/Qwen2.5-Coder-3B --out runs/code
Its 2-turn variant, starting from the single-turn agents (the paper's curriculum):
    python train.py --env coding --dataset humaneval --model runs/code/agent_0,runs/code/agent_1 \
        --num-turns 2 --feedback level --out runs/code2
One model per agent (a heterogeneous team), each on its own GPU (--device auto, the default,
spreads the agents over the visible GPUs):
    python train.py --env coding --model Qwen/Qwen2.5-Coder-1.5B,Qwen/Qwen2.5-Coder-3B --device cuda:0,cuda:1

Writes OUT/metrics.jsonl (one JSON object per step), OUT/args.json and OUT/agent_0, OUT/agent_1, ...
which load back with transformers' from_pretrained. Flags are named like TRL's GRPOConfig.
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
    envs.add_env_flags(p)
    magrpo.add_agent_flags(p)
    magrpo.add_sampling_flags(p, temperature=1.0, top_p=1.0)
    p.add_argument("--num-generations", type=int, help="G, completions per agent per prompt (>= 2)")
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--loss-type", default="seq_sum", help=f"one of {', '.join(magrpo.LOSS_TYPES)}")
    p.add_argument("--advantage", default="mean", help="mean (Eq. 1), rloo or std")
    p.add_argument("--joint", default="aligned", help="joint actions: aligned (G of them) or cross (G^n)")
    magrpo.add_turn_flags(p)
    p.add_argument("--expand", default="best", help="multi-turn: revise the best joint answer of each "
                   "group (the paper's 2-turn runs) or all of them (G^t nodes at turn t)")
    p.add_argument("--discount", type=float, default=0.9, help="gamma: a node's return is its reward "
                   "plus gamma times its children's mean return")
    p.add_argument("--turn-weights", help="comma list, one loss weight per turn (e.g. 1.2,0.8)")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="prompts per step")
    p.add_argument("--micro-batch-size", type=int, default=8, help="rows per log-prob forward/backward")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out", help="directory for metrics.jsonl and the trained agents")
    p.add_argument("--save-every", type=int, default=0, help="also save the agents every N steps (0: only at the end)")
    p.add_argument("--eval-every", type=int, default=0, help="every N steps, the greedy joint reward on "
                   "--eval-split, logged as eval_reward_mean (0: off)")
    p.add_argument("--eval-split", default="eval", help="the in-training eval split (HumanEval: [:32])")
    p.add_argument("--eval-limit", type=int, default=32, help="at most this many eval examples")
    return p.parse_args(argv)


def parse_weights(text):
    try:
        return tuple(float(w) for w in text.split(","))
    except ValueError:
        raise ValueError(f"--turn-weights: want a comma list of numbers, got {text!r}") from None


def resolve(args):
    """Fill the defaults and check every flag, then build what the run needs:
    (env, agents, cfg, expert). A bad flag ends the program with one line naming it."""
    try:
        return _resolve(args)
    except ValueError as e:
        sys.exit(f"train.py: error: {e}")


def _resolve(args):
    models = magrpo.model_names(args)
    defaults = TINY_DEFAULTS if all(m == magrpo.TINY for m in models) else PAPER_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.num_generations < 2:
        raise ValueError(f"--num-generations: must be >= 2 for group-relative advantages, got {args.num_generations}")
    for flag in ("steps", "batch_size", "eval_limit"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")
    if args.dtype in ("float16", "fp16"):  # fp16 gradients overflow without loss scaling, which we skip
        raise ValueError("--dtype: float16 training needs loss scaling, which this trainer does not do: use bfloat16")
    if args.learning_rate <= 0:
        raise ValueError(f"--learning-rate: must be > 0, got {args.learning_rate}")
    turn_weights = parse_weights(args.turn_weights) if args.turn_weights else None
    cfg = magrpo.config_from_flags(args, turn_weights=turn_weights)
    env = envs.env_from_flags(args)
    devices = magrpo.agent_devices(args.device, env.num_agents)
    names = magrpo.per_agent(models, env.num_agents, "--model")
    expert = magrpo.load_expert(args, devices[0])
    agents = []
    for i, (name, device) in enumerate(zip(names, devices)):
        agent = magrpo.load_agent(name, device, args.dtype, args.seed + i, chat_template=args.chat_template)
        agent.optimizer = magrpo.make_optimizer(agent.model, args.learning_rate, args.weight_decay)
        agents.append(agent)
    return env, agents, cfg, expert


def batch_at(env, seed, step, batch_size):
    """The examples of a step: shuffled epochs (every example is seen once before any repeats),
    each epoch's order from (seed, epoch) alone, so step k's batch needs no state of earlier steps."""
    n, batch = len(env.examples), []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        order = random.Random(magrpo.mix_seed(seed, pos // n)).sample(range(n), n)
        batch.append(env.examples[order[pos % n]])
    return batch


def eval_rewards(agents, env, cfg, limit, expert=None, batch_size=8):
    """The greedy joint reward on the first `limit` examples of `env`, per turn: decentralised
    execution (Sec. 1), each agent decoding alone from its own prompt; at a later turn each answer
    is revised once after its feedback (one that reached the threshold stays as it is)."""
    greedy = magrpo.dataclasses.replace(cfg, num_generations=1, temperature=0.0, expand="all")
    examples, totals = env.examples[:limit], [0.0] * cfg.num_turns
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        turns = magrpo.rollout_team(agents, env, batch, greedy, [0] * len(batch), expert, children=1)
        for path in magrpo.chains(turns, cfg.num_turns):
            for t, (turn, node) in enumerate(path):
                totals[t] += float(turns[turn].rewards[node])
    return [total / len(examples) for total in totals]


def save_agents(agents, out):
    for i, agent in enumerate(agents):
        agent.model.save_pretrained(os.path.join(out, f"agent_{i}"))
        agent.tokenizer.save_pretrained(os.path.join(out, f"agent_{i}"))


def train(args):
    env, agents, cfg, expert = resolve(args)
    eval_env = None
    if args.eval_every > 0:
        try:
            eval_env = envs.env_from_flags(args, split=args.eval_split, flag="--eval-split")
        except ValueError as e:
            sys.exit(f"train.py: error: {e}")
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "args.json"), "w") as f:  # eval.py --agents reads it back
        json.dump(vars(args), f, indent=1)
    log_path = os.path.join(args.out, "metrics.jsonl")
    recent, last_turn = [], f"reward_mean_turn{cfg.num_turns}"
    bar = tqdm(range(args.steps), desc=f"magrpo {env.name}", dynamic_ncols=True)
    try:
        with open(log_path, "w") as log:
            for step in bar:
                batch = batch_at(env, args.seed, step, args.batch_size)
                seeds = [magrpo.mix_seed(args.seed, step, j) for j in range(len(batch))]
                t0 = time.time()
                m = magrpo.train_step(agents, env, batch, cfg, seeds, expert)
                m = {"step": step, **m, "seconds": round(time.time() - t0, 4)}
                samples = m.pop("samples")
                last = step == args.steps - 1
                if m["sandbox_errors"]:
                    tqdm.write(f"warning: step {step}: {m['sandbox_errors']} joint answers could not be scored "
                               "(the sandbox failed, not the program)", file=sys.stderr)
                if eval_env is not None and (step % args.eval_every == 0 or last):
                    rewards = eval_rewards(agents, eval_env, cfg, args.eval_limit, expert)
                    m["eval_reward_mean"] = rewards[0]
                    m.update({f"eval_reward_mean_turn{t}": r for t, r in enumerate(rewards, 1)})
                    tqdm.write(f"step {step:5d} eval reward {' -> '.join(f'{r:.3f}' for r in rewards)} "
                               f"({eval_env.name}, {args.eval_split})")
                if args.save_every > 0 and step > 0 and step % args.save_every == 0:
                    save_agents(agents, args.out)
                log.write(json.dumps(m) + "\n")
                log.flush()
                shown = m[last_turn] if m[last_turn] is not None else m["reward_mean"]
                recent = (recent + [shown])[-20:]
                bar.set_postfix(reward=f"{sum(recent) / len(recent):.3f}", zero_adv=m["zero_adv_groups"])
                if step % max(1, args.steps // 10) == 0 or last:
                    tqdm.write(f"step {step:5d} reward " +
                               " -> ".join(f"{m[f'reward_mean_turn{t}'] or 0:.3f}" for t in range(1, cfg.num_turns + 1)) +
                               " | " + " | ".join(repr(s[:60]) for s in samples))
    except KeyboardInterrupt:
        print("interrupted: saving the agents before exiting", file=sys.stderr)
    finally:
        save_agents(agents, args.out)  # never lose the work done so far
    print(f"wrote {log_path} and {len(agents)} agents under {args.out}/agent_*")
    return log_path


if __name__ == "__main__":
    train(parse_args())
