"""
Train n cooperating agents with MAGRPO (arXiv 2508.04652, Sec. 2; multi-turn: Sec. 3).

    python train.py                     # CPU demo: two tiny random-init agents, offline, ~30 s
    python train.py --num-turns 2       # with a revision turn: feedback on the joint answer, revise
    python train.py --env coding --dataset humaneval --model Qwen/Qwen2.5-Coder-3B --out runs/code
    python train.py --env coding --model Qwen/Qwen2.5-Coder-3B --dtype bfloat16 --lora-r 16  # 1 GPU
    torchrun --nproc-per-node 8 train.py --env coding --model Qwen/Qwen2.5-Coder-3B --lora-r 16 --batch-size 8

Writes OUT/metrics.jsonl (a row per step), OUT/curve.svg, OUT/args.json, OUT/checkpoint-<step>/
(--resume continues from the newest) and OUT/agent_i. Flags are named like TRL's GRPOConfig.
README: "Runs that survive" (checkpoints, signals, a full disk), "Scale" (LoRA, torchrun).
"""
import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import sys
import time
import warnings

import torch
from tqdm import tqdm

import envs
import eval as evaluation
import magrpo
import models

# Real models: the env's defaults (the authors' configs), else the paper's (Sec. 2); tiny: its own.
PAPER_DEFAULTS = dict(num_generations=4, max_new_tokens=256, learning_rate=1e-5, steps=1000, batch_size=1,
                      temperature=1.0, top_p=1.0, test_timeout=10.0)
# Flags that do not change what a resumed run computes: the rest must match the checkpoint's.
RESUMABLE = {"steps", "resume", "out", "device", "micro_batch_size", "save_every", "save_total_limit",
             "eval_every", "eval_split", "eval_limit", "world_size", "save_merged", "log_completions_every"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    envs.add_env_flags(p)
    models.add_model_flags(p)
    models.add_lora_flags(p)
    magrpo.add_config_flags(p)
    p.add_argument("--learning-rate", type=float, help="each agent's AdamW (default 1e-5, the paper's)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="prompts per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out", help="directory for metrics.jsonl, checkpoints and the agents")
    p.add_argument("--resume", action="store_true", help="continue from --out's newest complete checkpoint")
    p.add_argument("--save-every", type=int, default=50, help="a checkpoint every N steps (0: at the end)")
    p.add_argument("--save-total-limit", type=int, default=2, help="keep the newest N checkpoints")
    p.add_argument("--eval-every", type=int, default=0, help="every N steps: eval_reward_mean (0: off)")
    p.add_argument("--eval-split", default="eval", help="the in-training eval split (HumanEval: [:32])")
    p.add_argument("--eval-limit", type=int, default=32, help="at most this many eval examples")
    p.add_argument("--log-completions-every", type=int, default=1, help="OUT/completions.jsonl every N steps")
    return p.parse_args(argv)


def resolve_flags(args):
    """Defaults filled, the env built, every flag that needs no model checked -> (env, Config)."""
    tiny = all(m == models.TINY for m in models.model_names(args))
    if args.test_timeout is None:  # (the env needs it)
        args.test_timeout = (models.TINY_DEFAULTS if tiny else PAPER_DEFAULTS)["test_timeout"]
    env = envs.env_from_flags(args)
    for key, value in (models.TINY_DEFAULTS if tiny else {**PAPER_DEFAULTS, **env.defaults}).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.world_size = world()[1]
    least = dict(num_generations=2, steps=1, batch_size=args.world_size, eval_limit=1, save_total_limit=1,
                 save_every=0, log_completions_every=0)  # G >= 2: a group has a baseline; a prompt a process
    for flag, least in least.items():
        if getattr(args, flag) < least:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= {least}, got {getattr(args, flag)}")
    if args.dtype in ("float16", "fp16"):
        raise ValueError("--dtype: float16 training needs loss scaling, which we skip: use bfloat16")
    if args.learning_rate <= 0:
        raise ValueError(f"--learning-rate: must be > 0, got {args.learning_rate}")
    cfg = magrpo.config_from_flags(args)
    vars(args).update({k: v for k, v in dataclasses.asdict(cfg).items() if getattr(args, k) is None})
    return env, cfg


def build(args, env, checkpoint=None, local_rank=0, local_world=1):
    """(agents, expert): the agents of --model or a checkpoint, on this process's devices; LoRA
    agents on one base share its frozen copy."""
    lora, bases = models.lora_from_flags(args), {}
    n = 1 if lora and args.device == "auto" else env.num_agents
    devices = models.agent_devices(args.device, n, local_rank, local_world) * (env.num_agents // n)
    names = models.per_agent(models.model_names(args), env.num_agents, "--model")
    if checkpoint is not None:
        names = [os.path.join(checkpoint[1], f"agent_{i}") for i in range(env.num_agents)]
    agents = []
    for i, (name, device) in enumerate(zip(names, devices)):
        agent = models.load_agent(name, device, args.dtype, args.seed + i, chat_template=args.chat_template,
                                  lora=lora, bases=bases, base_seed=args.seed if lora else None)
        agent.optimizer = magrpo.make_optimizer(agent.model, args.learning_rate, args.weight_decay)
        if checkpoint is not None:
            state = torch.load(os.path.join(name, "optimizer.pt"), map_location=device, weights_only=True)
            agent.optimizer.load_state_dict(state)
        agents.append(agent)
    return agents, models.load_expert(args, devices[0])

# -----------------------------------------------------------------------------
# The run: one loop from the first step to the last, under torchrun on every process


def train(args):
    """A whole run. A bad flag ends it in one line, before anything is written; a signal with a
    checkpoint and exit status 128 + signum; process 0 alone logs and saves."""
    local_rank, local_world = start_processes()
    main = world()[0] == 0
    try:
        env, cfg = resolve_flags(args)
        checkpoint = prepare_out(args)
        agents, expert = build(args, env, checkpoint, local_rank, local_world)
        eval_env = args.eval_every and envs.env_from_flags(args, split=args.eval_split, flag="--eval-split")
        start = done = 0 if checkpoint is None else checkpoint[0]
        if main:  # only now, every input checked
            try:
                os.makedirs(args.out, exist_ok=True)
                for name in ("metrics.jsonl", "completions.jsonl"):
                    cut_metrics(os.path.join(args.out, name), start)
                write_atomic(os.path.join(args.out, "args.json"), json.dumps(vars(args), indent=1))
            except OSError as e:
                raise ValueError(f"--out: cannot write in {args.out!r} ({e})") from None
    except ValueError as e:
        sys.exit(f"train.py: error: {e}")
    gather(None)  # every process has read --out before process 0 writes into it
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if checkpoint is not None:
        print(f"resuming {args.out} at step {start} from {checkpoint[1]}", file=sys.stderr)
        rng = torch.load(os.path.join(checkpoint[1], "rng_state.pt"), weights_only=False)
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    log, curve, completions = (RunFile(os.path.join(args.out, f))
                               for f in ("metrics.jsonl", "curve.svg", "completions.jsonl"))
    history = [json.loads(line) for line in open(log.path)] if main and log.size else []  # cut_metrics' rows
    signals, signum, error, recent = Signals(), None, None, []
    bar = tqdm(range(start, args.steps), desc=f"magrpo {env.name}", dynamic_ncols=True, initial=start,
               total=args.steps, disable=not main)
    try:
        for step in bar:
            indices = my_share(batch_at(len(env.examples), args.seed, step, args.batch_size))
            seeds = my_share([magrpo.mix_seed(args.seed, step, j) for j in range(args.batch_size)])
            batch, t0, turns = [env.examples[i] for i in indices], time.time(), None
            with contextlib.suppress(Stop), signals.abandon_on_signal():  # a signal drops the step here
                turns = magrpo.rollout_team(agents, env, batch, cfg, seeds, expert)
            votes = gather((signals.received, turns is None))  # the processes stop together, or not at all
            signum = next((s for s, _ in votes if s is not None), None)
            if any(abandoned for _, abandoned in votes):
                break
            summaries = gather(episode_summary(turns))
            summary = [{k: sum((s[t][k] for s in summaries if t < len(s)), [] if isinstance(v, list) else 0)
                        for k, v in summaries[0][0].items()} for t in range(max(map(len, summaries)))]
            m = {"step": step, **episode_metrics(summary, cfg.num_turns)}
            bad, total = m["sandbox_errors"] + m["score_errors"], sum(len(t["rewards"]) for t in summary)
            why = f"({m['sandbox_errors']} sandbox failures, {m['score_errors']} scoring errors)"
            if bad == total:  # the sandbox or the env is broken, not the agents: stop before the update
                error = (f"train.py: error: step {step}: none of the {total} joint answers could be "
                         f"scored {why}")
                break  # (the same on every process: the summary is merged)
            if bad:
                tqdm.write(f"warning: step {step}: {bad} of {total} joint answers could not be scored and "
                           f"count as 0 {why}", file=sys.stderr)
            m.update(magrpo.update_team(agents, turns, cfg), seconds=round(time.time() - t0, 4))
            if args.log_completions_every and step % args.log_completions_every == 0:
                rows = [row for rows in gather(completion_rows(step, indices, turns)) for row in rows]
                if main:  # every process's rows, once
                    completions.append("".join(json.dumps(row) + "\n" for row in rows))
            done, last = step + 1, step == args.steps - 1
            if main and eval_env and (step % args.eval_every == 0 or last):
                rewards = evaluation.team_rewards(agents, eval_env, cfg, args.eval_limit, expert)
                m["eval_reward_mean"] = rewards[0]
                m.update({f"eval_reward_mean_turn{t}": r for t, r in enumerate(rewards, 1)})
                tqdm.write(f"step {step:5d} eval reward {' -> '.join(f'{r:.3f}' for r in rewards)} "
                           f"({eval_env.name}, {args.eval_split})")
            signum = next((s for s in gather(signals.received) if s is not None), None)
            if args.save_every and done % args.save_every == 0:
                check_ranks_agree(agents)
            if main:
                log.append(json.dumps(m) + "\n")
                history.append(m)
                if step % 10 == 9 or last or signum is not None:
                    curve.write(write_curve, curve.path, history)
                if args.save_every and done % args.save_every == 0 and not last:
                    try:
                        save_checkpoint(args.out, done, agents, args, (log, completions))
                    except SaveFailed as e:
                        warnings.warn(f"{e}; the run goes on")
                shown = m[f"reward_mean_turn{cfg.num_turns}"]
                recent = (recent + [m["reward_mean"] if shown is None else shown])[-20:]
                bar.set_postfix(reward=f"{sum(recent) / len(recent):.3f}", zero_adv=m["zero_adv_groups"])
                if step % max(1, args.steps // 10) == 0 or last:
                    rewards = [m[f"reward_mean_turn{t}"] or 0 for t in range(1, cfg.num_turns + 1)]
                    tqdm.write(f"step {step:5d} reward {' -> '.join(f'{r:.3f}' for r in rewards)} | " +
                               " | ".join(repr(s[:60]) for s in turns[-1].outputs[0]))
            if signum is not None:
                break
    finally:
        for s, handler in signals.previous.items():
            signal.signal(s, handler)
    check_ranks_agree(agents)
    try:
        if main:
            save_checkpoint(args.out, done, agents, args, (log, completions))
            if signum is None and error is None:
                save_final(args.out, done, agents, merged=args.save_merged)
                print(f"wrote {log.path} and {len(agents)} agents under {args.out}/agent_*")
    except SaveFailed as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        error = error or 1
    gather(None)  # torchrun stops every process when one exits: not before process 0 has saved
    if signum is not None or error:
        sys.exit(128 + signum if signum is not None else error)
    return log.path


def batch_at(n, seed, step, batch_size):
    """A step's examples, indices among n: shuffled epochs, each epoch's order from (seed, epoch) alone."""
    return [random.Random(magrpo.mix_seed(seed, pos // n)).sample(range(n), n)[pos % n]
            for pos in range(step * batch_size, (step + 1) * batch_size)]


def completion_rows(step, indices, turns):
    """OUT/completions.jsonl's rows: each joint action of the step, its reward, each agent's advantage."""
    rows = []
    for t, turn in enumerate(turns, 1):
        for n, (outputs, reward) in enumerate(zip(turn.outputs, turn.rewards)):
            k, j = divmod(n, len(turn.joint))
            advantages = [a[k * turn.size + g].item() for a, g in zip(turn.advantages, turn.joint[j])]
            rows.append({"step": step, "example": indices[turn.groups[k].example], "turn": t,
                         "completions": list(outputs), "reward": float(reward),
                         "levels": getattr(reward, "levels", None) or None, "advantages": advantages})
    return rows

# -----------------------------------------------------------------------------
# What a step scored (metrics.jsonl; README "Multi-turn" for the per-turn keys)


def episode_summary(turns):
    """Per turn, plain lists (gathered under torchrun): each node's reward, levels, solved flag; each
    revised group's gain over its parent."""
    out = []
    for t, turn in enumerate(turns):
        values, rewards = turn.values(), turn.rewards
        gains = [(values[k].mean() - float(turns[t - 1].rewards[g.parent])).item()
                 for k, g in enumerate(turn.groups)] if t else []
        out.append({"rewards": values.view(-1).tolist(), "gains": gains, "terminated": list(turn.terminated),
                    "levels": [dict(getattr(r, "levels", None) or {}) for r in rewards],
                    "sandbox_errors": sum(getattr(r, "sandbox_error", None) is not None for r in rewards),
                    "score_errors": sum(isinstance(r, magrpo.ScoreError) for r in rewards)})
    return out


def episode_metrics(summary, num_turns):
    """A step's row of metrics.jsonl from its (merged) summary; None for a turn no node reached."""
    def level_means(levels, suffix=""):  # a level a reward lacks (gated off) counts 0
        names = dict.fromkeys(k for lv in levels for k in lv)
        return {f"level_{k}{suffix}": sum(float(lv.get(k, 0.0)) for lv in levels) / len(levels)
                for k in names}
    first = torch.tensor(summary[0]["rewards"])
    m = {"reward_mean": first.mean().item(), "reward_std": first.std().item() if len(first) > 1 else 0.0,
         "reward_max": first.max().item(), **level_means(summary[0]["levels"])}
    for t in range(1, num_turns + 1):
        keys = [f"reward_mean_turn{t}", f"reward_max_turn{t}", f"terminated_turn{t}"] + \
               ([f"improvement_turn{t}"] if t > 1 else [])
        if t > len(summary):
            m.update(dict.fromkeys(keys))
            continue
        turn = summary[t - 1]
        values = torch.tensor(turn["rewards"])
        m.update(zip(keys, [values.mean().item(), values.max().item(), sum(turn["terminated"]) / len(values),
                            sum(turn["gains"]) / len(turn["gains"]) if t > 1 else None]))
        m.update(level_means(turn["levels"], f"_turn{t}"))
    m["sandbox_errors"] = sum(turn["sandbox_errors"] for turn in summary)
    m["score_errors"] = sum(turn["score_errors"] for turn in summary)
    return m


# -----------------------------------------------------------------------------
# The run directory: refuse to clobber a run, resume one, write checkpoints atomically


def prepare_out(args):
    """None (step 0) or the (step, path) of the checkpoint to resume. A new run refuses an --out that
    holds a run; --resume refuses flags that would change it."""
    if not args.resume:
        names = os.listdir(args.out) if os.path.isdir(args.out) else []
        if any(n in ("args.json", "metrics.jsonl", "final.json") or n.startswith(("checkpoint-", "agent_"))
               for n in names):
            raise ValueError(f"--out: {args.out!r} already holds a run: continue it with --resume, or pick "
                             "another --out")
        return None
    for leftover in os.listdir(args.out) if os.path.isdir(args.out) else []:
        if leftover.startswith((".tmp-", ".trash-")):  # a save or a rotation a kill interrupted
            shutil.rmtree(os.path.join(args.out, leftover), ignore_errors=True)
    checkpoint = models.latest_checkpoint(args.out)
    if checkpoint is None:
        return None
    with open(os.path.join(checkpoint[1], models.CHECKPOINT_STATE)) as f:
        saved = json.load(f)["args"]
    for k in (k for k in saved if k not in RESUMABLE and saved[k] != vars(args).get(k)):
        raise ValueError(f"--{k.replace('_', '-')}: the run in {args.out!r} used {saved[k]!r}, not "
                         f"{vars(args).get(k)!r}; resume with the same flags (only --steps and the "
                         "save/eval/device flags may change)")
    if args.steps < checkpoint[0]:
        raise ValueError(f"--steps: the run in {args.out!r} is already at step {checkpoint[0]}")
    return checkpoint


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_tree(path):
    """Everything under `path` on disk, directories included (before it is renamed into place)."""
    for p in [os.path.join(root, n) for root, dirs, files in os.walk(path) for n in files + dirs] + [path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class SaveFailed(Exception):
    """A checkpoint or the final agents could not be written (a full disk); nothing half written is left."""


@contextlib.contextmanager
def saving(out, what, *tmps):
    """Any failure of a save (a full disk raises OSError, SafetensorError, RuntimeError...) as
    SaveFailed naming it and the newest complete checkpoint; `tmps` removed."""
    try:
        yield
    except Exception as e:
        free = shutil.disk_usage(out).free / 2**20  # before the partial copies go: what the save left
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)
        latest = models.latest_checkpoint(out)
        where = (f"{latest[1]} is the newest complete checkpoint (--resume continues from it)" if latest
                 else "there is no complete checkpoint (--resume starts at step 0)")
        raise SaveFailed(f"could not save {what} ({type(e).__name__}: {e}; {free:.1f} MB left on the disk); "
                         + where) from None


def save_checkpoint(out, step, agents, args, logs=()):
    """OUT/checkpoint-<step>: each agent's weights and optimizer state, the RNG states, the step and
    args, once the `logs` hold every row before it. Written aside, fsync'd, renamed: a kill leaves the
    last complete checkpoint or this one. Keeps --save-total-limit."""
    final = os.path.join(out, f"checkpoint-{step}")
    tmp = os.path.join(out, f".tmp-checkpoint-{step}")
    if os.path.isdir(final) and models.checkpoint_problem(final) is None:
        return  # saved already (a signal right after a periodic save)
    with saving(out, f"checkpoint-{step}", tmp):
        for log in logs:
            log.sync()
        shutil.rmtree(tmp, ignore_errors=True)
        for i, agent in enumerate(agents):
            models.save_agent(agent, os.path.join(tmp, f"agent_{i}"))
            torch.save(agent.optimizer.state_dict(), os.path.join(tmp, f"agent_{i}", "optimizer.pt"))
        torch.save({"python": random.getstate(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
                   os.path.join(tmp, "rng_state.pt"))
        files = {os.path.relpath(os.path.join(root, f), tmp): os.path.getsize(os.path.join(root, f))
                 for root, _, names in os.walk(tmp) for f in names}
        # the data position is the step: batch_at derives step k's examples from (seed, k) alone
        state = {"step": step, "data_position": step * args.batch_size, "args": vars(args), "files": files}
        with open(os.path.join(tmp, models.CHECKPOINT_STATE), "w") as f:
            json.dump(state, f, indent=1)
        fsync_tree(tmp)
        if os.path.exists(final):  # a broken checkpoint of this step, from before a resume
            os.rename(final, os.path.join(out, f".trash-checkpoint-{step}"))
        os.rename(tmp, final)
        fsync_tree(out)
    complete = [c for c in models.checkpoints(out) if models.checkpoint_problem(c[1]) is None]
    keep = {path for _, path in complete[:args.save_total_limit]}  # the newest; broken ones go too
    for old in [path for _, path in models.checkpoints(out) if path not in keep]:
        trash = os.path.join(out, ".trash-" + os.path.basename(old))
        with contextlib.suppress(OSError):
            os.rename(old, trash)  # out of sight at once; a kill during the delete leaves only trash
        shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(os.path.join(out, f".trash-checkpoint-{step}"), ignore_errors=True)


def save_final(out, step, agents, merged=False):
    """OUT/agent_i, hard links to checkpoint-<step>'s files where it can, then OUT/final.json;
    `merged`: a LoRA agent also as a full model in OUT/agent_i/merged."""
    tmps = [os.path.join(out, f".tmp-agent_{i}") for i in range(len(agents))]
    with saving(out, f"the trained agents in {out}", *tmps):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, "final.json"))  # an earlier end's, about to be replaced
        for i, (agent, tmp) in enumerate(zip(agents, tmps)):
            dest = os.path.join(out, f"agent_{i}")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(os.path.join(out, f"checkpoint-{step}", f"agent_{i}"), tmp,
                            copy_function=link_or_copy, ignore=shutil.ignore_patterns("optimizer.pt"))
            if merged and models.is_lora(agent.model):
                models.save_agent(agent, os.path.join(tmp, "merged"), merged=True)
            fsync_tree(tmp)
            if os.path.exists(dest):
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        write_atomic(os.path.join(out, "final.json"), json.dumps({"step": step, "agents": len(agents)}))


def link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def cut_metrics(path, step):
    """A log (metrics.jsonl) without the rows of steps >= `step` (to be run again) or a line cut short."""
    def kept(line):
        try:
            return json.loads(line)["step"] < step
        except ValueError:  # a line cut short
            return False
    if os.path.exists(path):
        with open(path) as f:
            write_atomic(path, "".join(line.rstrip("\n") + "\n" for line in f if kept(line)))


class RunFile:
    """A file the run writes as it goes: a failed write (a full disk) warns once and the run goes on;
    unwritten lines go with the next ones, so the file catches up once there is room."""

    def __init__(self, path):
        self.path, self.pending, self.warned = path, "", False
        self.size = os.path.getsize(path) if os.path.exists(path) else 0

    def write(self, writer, *args):
        try:
            writer(*args)
        except OSError as e:
            if not self.warned:
                warnings.warn(f"could not write {self.path} ({e}); the run goes on (README: a full disk)")
            self.warned = True

    def append(self, line):
        self.pending += line
        self.write(self.sync, False)

    def sync(self, fsync=True):
        """Write the pending lines (fsync: a checkpoint needs every row before it)."""
        with open(self.path, "a") as f:
            f.truncate(self.size)
            f.write(self.pending)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        self.size, self.pending = os.path.getsize(self.path), ""

# -----------------------------------------------------------------------------
# Signals: SIGTERM (a preempted job), SIGHUP, SIGINT (Ctrl-C) end the run with a checkpoint


class Stop(Exception):  # the signal handler's, while a step samples
    pass


class Signals:
    """A signal abandons the step while it samples, else waits for its update to end (no agent holds
    half an update); then a checkpoint, exit 128 + the signal."""

    def __init__(self):
        self.received, self.abandonable = None, False
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGTERM, signal.SIGHUP,
                                                                   signal.SIGINT)}

    def handle(self, signum, frame):
        if self.received is None:
            self.received = signum
            tqdm.write(f"{signal.Signals(signum).name}: saving a checkpoint, then exiting", file=sys.stderr)
        if self.abandonable:
            self.abandonable = False
            raise Stop()

    @contextlib.contextmanager
    def abandon_on_signal(self):
        if self.received is not None:
            raise Stop()
        self.abandonable = True
        try:
            yield
        finally:
            self.abandonable = False

# -----------------------------------------------------------------------------
# Data parallelism: torchrun --nproc-per-node N train.py ... (gloo on the CPU, NCCL on GPUs)


def start_processes():
    """Under torchrun, join the process group -> (local rank, local size)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def gather(obj):
    """obj from every process, in process order ([obj] alone)."""
    out = [obj] * (torch.distributed.get_world_size() if magrpo.data_parallel() else 1)
    if magrpo.data_parallel():
        torch.distributed.all_gather_object(out, obj)
    return out


def weights_digest(agents):
    """Per agent, the sum and the sum of squares of all its weights, in float64."""
    return [(sum(p.double().sum().item() for p in a.model.parameters()),
             sum(p.double().square().sum().item() for p in a.model.parameters())) for a in agents]


def check_ranks_agree(agents):
    """Every process's agents must stay identical: a difference is a bug: stop rather than save."""
    digests = gather(weights_digest(agents))
    if any(d != digests[0] for d in digests):
        raise RuntimeError(f"the processes' agents differ: {digests}")


def world():
    """(this process's rank, the number of processes); (0, 1) alone."""
    dp = magrpo.data_parallel()
    return (torch.distributed.get_rank(), torch.distributed.get_world_size()) if dp else (0, 1)


def my_share(items):
    """This process's contiguous share of a step's items (N processes sample what one samples)."""
    r, w = world()
    return items[r * len(items) // w:(r + 1) * len(items) // w]

# -----------------------------------------------------------------------------
# The learning curve, OUT/curve.svg

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def write_curve(path, rows, width=760, height=400, pad=50, legend=190):
    """The learning curve as a small SVG: turn 1's reward and levels, the last turn's, the eval's."""
    last = max(int(k[len("reward_mean_turn"):]) for k in rows[0] if k.startswith("reward_mean_turn"))
    keys = [k for k in rows[0] if k == "reward_mean" or (k.startswith("level_") and "_turn" not in k)]
    keys += [f"reward_mean_turn{last}"] * (last > 1) + ["eval_reward_mean"]
    series = {k: v for k in keys if (v := [(r["step"], r[k]) for r in rows if r.get(k) is not None])}
    steps = [s for v in series.values() for s, _ in v]
    top = max(y for v in series.values() for _, y in v) or 1.0
    x0, x1 = min(steps), max(max(steps), min(steps) + 1)
    right, w = width - legend, max(1, len(rows) // 30)  # the plot's right edge (the legend beyond); smoothing

    def at(s, y):  # a point's SVG coordinates
        x = pad + (s - x0) / (x1 - x0) * (right - pad)
        return f"{x:.1f},{height - pad - max(0.0, y) / top * (height - 2 * pad):.1f}"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>',
             f'<path d="M{pad},{pad}V{height - pad}H{right}" stroke="black" fill="none"/>',
             f'<text x="{pad - 5}" y="{pad + 4}" text-anchor="end">{top:.3g}</text>',
             f'<text x="{pad - 5}" y="{height - pad + 4}" text-anchor="end">0</text>',
             f'<text x="{pad}" y="{height - pad + 16}">step {x0}</text>',
             f'<text x="{right}" y="{height - pad + 16}" text-anchor="end">step {x1}</text>']
    for n, (key, points) in enumerate(series.items()):
        ys, color = [y for _, y in points], COLORS[n % len(COLORS)]
        line = " ".join(at(s, sum(ys[max(0, i - w + 1):i + 1]) / len(ys[max(0, i - w + 1):i + 1]))
                        for i, (s, _) in enumerate(points))
        parts += [f'<polyline points="{line}" stroke="{color}" fill="none" stroke-width="1.5"/>',
                  f'<text x="{right + 10}" y="{pad + 16 * n}" fill="{color}">{key}</text>']
    write_atomic(path, "\n".join(parts + ["</svg>\n"]))


if __name__ == "__main__":
    try:
        train(parse_args())
        status = 0
    except SystemExit as e:
        status = e.code
    if torch.distributed.is_initialized():  # torchrun: the interpreter's teardown, where gloo's threads
        torch.distributed.destroy_process_group()  # can abort the process (SIGABRT), is skipped
        if isinstance(status, str):
            print(status, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if isinstance(status, str) else status or 0)
    sys.exit(status)
