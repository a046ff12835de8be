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
Both agents as LoRA adapters on one shared frozen base, on one GPU:
    python train.py --env coding --model Qwen/Qwen2.5-Coder-3B --dtype bfloat16 --lora-r 16
Data parallel on one node (each process samples and scores its share of every step's prompts):
    torchrun --nproc-per-node 8 train.py --env coding --model Qwen/Qwen2.5-Coder-3B --lora-r 16 --batch-size 8

Writes OUT/metrics.jsonl (one JSON object per step), OUT/curve.svg (the learning curve), OUT/args.json,
OUT/checkpoint-<step>/ (resume with --resume) and at the end OUT/agent_0, OUT/agent_1, ... which load
back with transformers' from_pretrained. Flags are named like TRL's GRPOConfig.
"""
import argparse
import contextlib
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
import magrpo

# Defaults that depend on the model: the tiny demo model learns from scratch (high lr, short
# outputs, big groups); real models use the paper's settings (Sec. 2: G=4, lr 1e-5, 256 tokens).
# A checkpoint every 50 steps: if a step of two 3B agents takes ~15 s on an H100 (our estimate), a
# crash costs at most ~12 minutes, and writing ~14 bytes per parameter per agent every 50 steps costs a few percent.
# With a real model the env's own defaults (the authors' configs: sampling, and the writing lr) come
# first: envs.CodingEnv.defaults, envs.WritingEnv.defaults. Tests run in the sandbox 10 s each as
# the authors' (3 s with the tiny model, which never writes code that runs long).
TINY_DEFAULTS = dict(num_generations=8, max_new_tokens=24, learning_rate=3e-3, steps=150, batch_size=2,
                     save_every=50, temperature=1.0, top_p=1.0, test_timeout=3.0)
PAPER_DEFAULTS = dict(num_generations=4, max_new_tokens=256, learning_rate=1e-5, steps=1000, batch_size=1,
                      save_every=50, temperature=1.0, top_p=1.0, test_timeout=10.0)
# Flags that do not change what a resumed run computes: the rest must match the checkpoint's.
RESUMABLE = {"steps", "resume", "out", "device", "micro_batch_size", "save_every", "save_total_limit",
             "eval_every", "eval_split", "eval_limit", "world_size", "save_merged"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    envs.add_env_flags(p)
    magrpo.add_agent_flags(p)
    p.add_argument("--lora-r", type=int, default=0, help="train a rank-R LoRA adapter per agent on one "
                   "shared frozen base instead of the whole model (0: full fine-tuning)")
    p.add_argument("--lora-alpha", type=float, help="the adapter's update is scaled by alpha / r (default 2r)")
    p.add_argument("--lora-target-modules", help="comma list of the linear layers that get adapters "
                   f"(default: the attention and MLP projections, {','.join(magrpo.LORA_TARGETS)}; "
                   f"GPT-2: {','.join(magrpo.LORA_TARGETS_BY_MODEL_TYPE['gpt2'])})")
    p.add_argument("--save-merged", action="store_true", help="LoRA: also write each final agent as a full "
                   "HF model (the adapter folded into the weights) in OUT/agent_i/merged")
    magrpo.add_sampling_flags(p, temperature=None, top_p=None)
    p.add_argument("--num-generations", type=int, help="G, completions per agent per prompt (>= 2)")
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--loss-type", default="seq_sum", help=f"one of {', '.join(magrpo.LOSS_TYPES)}")
    p.add_argument("--advantage", default="mean", help="mean (Eq. 1), rloo or std")
    p.add_argument("--joint", default="aligned", help="joint actions: aligned (G of them) or cross (G^n)")
    magrpo.add_turn_flags(p)
    p.add_argument("--expand", default="best", help="multi-turn: revise the best joint answer of each "
                   "group (the paper's 2-turn runs) or all of them (G^t nodes at turn t)")
    p.add_argument("--discount", type=float, default=0.9, help="gamma, with --expand all: a node's return "
                   "is its reward plus gamma times its children's mean return (best: each turn's rewards)")
    p.add_argument("--turn-weights", help="comma list, one loss weight per turn (e.g. 1.2,0.8)")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="prompts per step")
    p.add_argument("--micro-batch-size", type=int, default=8, help="rows per log-prob forward/backward")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out", help="directory for metrics.jsonl, checkpoints and the trained agents")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest complete "
                   "checkpoint (from step 0 if it has none)")
    p.add_argument("--save-every", type=int, help="a checkpoint every N steps (default 50; 0: only at the end "
                   "and on a signal)")
    p.add_argument("--save-total-limit", type=int, default=2, help="keep the newest N checkpoints")
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


def lora_from_flags(args):
    """The magrpo.LoRAConfig of --lora-r/--lora-alpha/--lora-target-modules, or None without --lora-r."""
    r, alpha, targets = args.lora_r, args.lora_alpha, args.lora_target_modules
    if r < 0:
        raise ValueError(f"--lora-r: must be >= 1 (0: full fine-tuning), got {r}")
    if not r:
        if alpha is not None or targets:
            raise ValueError(f"{'--lora-alpha' if alpha is not None else '--lora-target-modules'}: only with --lora-r")
        return None
    if alpha is not None and not alpha > 0:
        raise ValueError(f"--lora-alpha: must be > 0, got {alpha}")
    names = tuple(t.strip() for t in (targets or "").split(",") if t.strip())
    if targets is not None and not names:
        raise ValueError("--lora-target-modules: want a comma list of layer names, got an empty one")
    return magrpo.LoRAConfig(r, alpha, names or None)


def resolve_flags(args):
    """Fill the defaults (the tiny model's, or the paper's and the env's for a real model), build
    the env and check every flag that needs no model: (env, the step's Config). args then holds
    the resolved values (args.json records them). Raises ValueError("--flag: what is wrong")."""
    tiny = all(m == magrpo.TINY for m in magrpo.model_names(args))
    defaults = TINY_DEFAULTS if tiny else PAPER_DEFAULTS
    if args.test_timeout is None:
        args.test_timeout = defaults["test_timeout"]
    env = envs.env_from_flags(args)
    for key, value in {**defaults, **({} if tiny else env.defaults)}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.num_generations < 2:
        raise ValueError(f"--num-generations: must be >= 2 for group-relative advantages, got {args.num_generations}")
    for flag in ("steps", "batch_size", "eval_limit", "save_total_limit"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")
    if args.save_every < 0:
        raise ValueError(f"--save-every: must be >= 0, got {args.save_every}")
    args.world_size = torch.distributed.get_world_size() if magrpo.data_parallel() else 1
    if args.batch_size < args.world_size:
        raise ValueError(f"--batch-size: {args.batch_size} prompts per step cannot be shared by "
                         f"{args.world_size} processes: give at least one each")
    if args.dtype in ("float16", "fp16"):  # fp16 gradients overflow without loss scaling, which we skip
        raise ValueError("--dtype: float16 training needs loss scaling, which this trainer does not do: use bfloat16")
    if args.learning_rate <= 0:
        raise ValueError(f"--learning-rate: must be > 0, got {args.learning_rate}")
    turn_weights = parse_weights(args.turn_weights) if args.turn_weights else None
    return env, magrpo.config_from_flags(args, turn_weights=turn_weights)


def build(args, env, checkpoint=None, local_rank=0, local_world=1):
    """(agents, expert): the agents from --model, or from a checkpoint's agent_i when resuming
    (weights and optimizer state); under torchrun on this process's GPUs. With --lora-r every agent
    is base + its own adapter, and the agents on one base and device share one frozen copy of it
    (so --device auto puts them all on one GPU: the process's first)."""
    lora, bases = lora_from_flags(args), {}
    if lora and args.device == "auto":
        devices = magrpo.agent_devices("auto", 1, local_rank, local_world) * env.num_agents
    else:
        devices = magrpo.agent_devices(args.device, env.num_agents, local_rank, local_world)
    names = magrpo.per_agent(magrpo.model_names(args), env.num_agents, "--model")
    if checkpoint is not None:
        names = [os.path.join(checkpoint[1], f"agent_{i}") for i in range(env.num_agents)]
    expert = magrpo.load_expert(args, devices[0])
    agents = []
    for i, (name, device) in enumerate(zip(names, devices)):
        agent = magrpo.load_agent(name, device, args.dtype, args.seed + i, chat_template=args.chat_template,
                                  lora=lora, bases=bases, base_seed=args.seed if lora else None)
        agent.optimizer = magrpo.make_optimizer(agent.model, args.learning_rate, args.weight_decay)
        if checkpoint is not None:
            agent.optimizer.load_state_dict(torch.load(os.path.join(name, "optimizer.pt"), map_location=device,
                                                       weights_only=True))
        agents.append(agent)
    return agents, expert


def resolve(args):
    """The flags checked and the team built for a new run: (env, agents, cfg, expert)."""
    env, cfg = resolve_flags(args)
    agents, expert = build(args, env)
    return env, agents, cfg, expert

# -----------------------------------------------------------------------------
# The run directory: refuse to clobber a run, resume one, write checkpoints atomically


def holds_a_run(out):
    return os.path.isdir(out) and any(
        name in ("args.json", "metrics.jsonl", "final.json") or name.startswith(("checkpoint-", "agent_"))
        for name in os.listdir(out))


def prepare_out(args):
    """Where the run starts: None (step 0) or the (step, path) of the checkpoint to resume from.
    A new run refuses an --out that holds a run; --resume refuses flags that would change the run."""
    if not args.resume:
        if holds_a_run(args.out):
            raise ValueError(f"--out: {args.out!r} already holds a run: continue it with --resume, or pick another --out")
        return None
    for leftover in os.listdir(args.out) if os.path.isdir(args.out) else []:
        if leftover.startswith((".tmp-", ".trash-")):  # a save or a rotation a kill interrupted
            shutil.rmtree(os.path.join(args.out, leftover), ignore_errors=True)
    checkpoint = magrpo.latest_checkpoint(args.out)
    if checkpoint is None:
        return None
    with open(os.path.join(checkpoint[1], magrpo.CHECKPOINT_STATE)) as f:
        saved = json.load(f)["args"]
    changed = [k for k in saved if k not in RESUMABLE and saved[k] != vars(args).get(k)]
    if changed:
        k = changed[0]
        raise ValueError(f"--{k.replace('_', '-')}: the run in {args.out!r} used {saved[k]!r}, not {vars(args).get(k)!r}; "
                         "resume with the same flags (only --steps and the save/eval/device flags may change)")
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


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path):
    """Everything under `path` on disk, directories included, before it is renamed into place."""
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            fsync_path(os.path.join(root, name))
    fsync_path(path)


class SaveFailed(Exception):
    """A checkpoint or the final agents could not be written (a full disk); nothing half written is left."""


@contextlib.contextmanager
def saving(out, what, *tmps):
    """Any failure of a save (on a full disk os raises OSError, safetensors SafetensorError, torch.save
    RuntimeError, the tokenizers library a bare Exception) as SaveFailed naming its cause and the newest
    complete checkpoint, the partial copies `tmps` removed (to free the disk; no --resume takes them)."""
    try:
        yield
    except Exception as e:
        free = shutil.disk_usage(out).free / 2**20  # before the partial copies go: what the save left
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)
        latest = magrpo.latest_checkpoint(out)
        where = (f"{latest[1]} is the newest complete checkpoint (--resume continues from it)" if latest
                 else "there is no complete checkpoint (--resume starts at step 0)")
        raise SaveFailed(f"could not save {what} ({type(e).__name__}: {e}; {free:.1f} MB left on the disk); "
                         + where) from None


def save_checkpoint(out, step, agents, args, log=None):
    """OUT/checkpoint-<step> (named as HF Trainer does): each agent's weights (HF format) and
    optimizer state, the RNG states, the step and the args. Written to a temporary directory,
    fsync'd and renamed into place, so a kill at any instant leaves the previous complete
    checkpoint or the new one; only once `log` (metrics.jsonl) holds every row before it. Keeps
    the newest --save-total-limit complete ones. Raises SaveFailed (a full disk), keeping the earlier ones."""
    final = os.path.join(out, f"checkpoint-{step}")
    tmp = os.path.join(out, f".tmp-checkpoint-{step}")
    if os.path.isdir(final) and magrpo.checkpoint_problem(final) is None:
        return  # saved already (a signal right after a periodic save)
    with saving(out, f"checkpoint-{step}", tmp):
        if log is not None:
            log.sync()
        shutil.rmtree(tmp, ignore_errors=True)
        for i, agent in enumerate(agents):
            magrpo.save_agent(agent, os.path.join(tmp, f"agent_{i}"))
            torch.save(agent.optimizer.state_dict(), os.path.join(tmp, f"agent_{i}", "optimizer.pt"))
        torch.save({"python": random.getstate(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
                   os.path.join(tmp, "rng_state.pt"))
        files = {os.path.relpath(os.path.join(root, f), tmp): os.path.getsize(os.path.join(root, f))
                 for root, _, names in os.walk(tmp) for f in names}
        # the data position is the step: batch_at derives step k's examples from (seed, k) alone
        state = {"step": step, "data_position": step * args.batch_size, "args": vars(args), "files": files}
        with open(os.path.join(tmp, magrpo.CHECKPOINT_STATE), "w") as f:
            json.dump(state, f, indent=1)
        fsync_tree(tmp)
        if os.path.exists(final):  # a broken checkpoint of this step, from before a resume
            os.rename(final, os.path.join(out, f".trash-checkpoint-{step}"))
        os.rename(tmp, final)
        fsync_path(out)
    complete = [c for c in magrpo.checkpoints(out) if magrpo.checkpoint_problem(c[1]) is None]
    keep = {path for _, path in complete[:args.save_total_limit]}
    for _, old in magrpo.checkpoints(out):
        if old in keep:
            continue  # the newest --save-total-limit complete ones; broken ones go too
        trash = os.path.join(out, ".trash-" + os.path.basename(old))
        with contextlib.suppress(OSError):
            os.rename(old, trash)  # out of sight at once; a kill during the delete leaves only trash
        shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(os.path.join(out, f".trash-checkpoint-{step}"), ignore_errors=True)


def save_final(out, step, agents, merged=False):
    """OUT/agent_i, the trained agents (what eval.py --agents OUT and --model OUT/agent_0 read),
    then OUT/final.json: agents without final.json are not final. The files are hard links to the
    last checkpoint's where it can (no second copy on disk). With `merged` (--save-merged), a LoRA
    agent also as a full HF model in OUT/agent_i/merged. Raises SaveFailed (a full disk)."""
    source = os.path.join(out, f"checkpoint-{step}")
    tmps = [os.path.join(out, f".tmp-agent_{i}") for i in range(len(agents))]
    with saving(out, f"the trained agents in {out}", *tmps):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, "final.json"))  # an earlier end's, about to be replaced
        for i, (agent, tmp) in enumerate(zip(agents, tmps)):
            dest = os.path.join(out, f"agent_{i}")
            shutil.rmtree(tmp, ignore_errors=True)
            if magrpo.checkpoint_problem(source) is None:
                shutil.copytree(os.path.join(source, f"agent_{i}"), tmp, copy_function=link_or_copy,
                                ignore=shutil.ignore_patterns("optimizer.pt"))
            else:
                magrpo.save_agent(agent, tmp)
            if merged and magrpo.is_lora(agent.model):
                magrpo.save_merged(agent, os.path.join(tmp, "merged"))
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


def restore_rng(checkpoint):
    path = os.path.join(checkpoint[1], "rng_state.pt")
    state = torch.load(path, weights_only=False)
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def cut_metrics(path, step):
    """metrics.jsonl without the rows of steps >= `step` (they are about to be run again), nor a
    last line that a full disk or a kill cut short."""
    if not os.path.exists(path):
        return
    rows = []
    with open(path) as f:
        for line in f:
            with contextlib.suppress(ValueError):  # json's error for a line cut short
                if json.loads(line)["step"] < step:
                    rows.append(line.rstrip("\n") + "\n")
    write_atomic(path, "".join(rows))


class RunFile:
    """A file the run writes as it goes (metrics.jsonl, curve.svg): a write that fails (a full disk)
    warns once and the run goes on. Lines appended in vain are kept and written with the next ones,
    over what the failure left half written, so the file catches up once the disk has room."""

    def __init__(self, path):
        self.path, self.pending, self.warned = path, "", False
        self.size = os.path.getsize(path) if os.path.exists(path) else 0

    def write(self, writer, *args):
        """writer(*args), which writes this file; if it fails, a warning (the first time) and no more."""
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
        """The lines not written yet, over what a failed write left half written; with `fsync` on
        disk too (a checkpoint needs every row before it). Raises OSError."""
        with open(self.path, "a") as f:
            f.truncate(self.size)
            f.write(self.pending)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        self.size, self.pending = os.path.getsize(self.path), ""

# -----------------------------------------------------------------------------
# Signals: SIGTERM (a preempted job), SIGHUP, SIGINT (Ctrl-C) end the run with a checkpoint


class Stop(Exception):
    """Raised by the signal handler while the step can be abandoned (sampling and scoring)."""


class Signals:
    """While sampling, a signal abandons the step (nothing has changed yet); during the update it
    waits for the step to finish, so the agents never hold half an update. Either way the run saves
    a checkpoint and exits with 128 + the signal's number."""
    NAMES = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __init__(self):
        self.received, self.abandonable = None, False
        self.previous = {s: signal.signal(s, self.handle) for s in self.NAMES}

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

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)

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


def train(args):
    """A whole run: check the flags, prepare --out (refuse, or resume), then the steps. A bad flag
    ends it with one line naming the flag; a signal with a checkpoint and exit status 128 + signum.
    Under torchrun every process runs this; process 0 alone logs and saves."""
    local_rank, local_world = start_processes()
    main = rank() == 0
    try:
        env, cfg = resolve_flags(args)
        checkpoint = prepare_out(args)
        agents, expert = build(args, env, checkpoint, local_rank, local_world)
        eval_env = envs.env_from_flags(args, split=args.eval_split, flag="--eval-split") if args.eval_every > 0 else None
    except ValueError as e:
        sys.exit(f"train.py: error: {e}")
    barrier()  # every process has read --out before process 0 writes into it
    start = 0 if checkpoint is None else checkpoint[0]
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    log_path = os.path.join(args.out, "metrics.jsonl")
    if checkpoint is not None:
        restore_rng(checkpoint)
    if main:
        if checkpoint is not None:
            print(f"resuming {args.out} at step {start} from {checkpoint[1]}", file=sys.stderr)
        try:
            os.makedirs(args.out, exist_ok=True)
            cut_metrics(log_path, start)
            write_atomic(os.path.join(args.out, "args.json"), json.dumps(vars(args), indent=1))  # for eval.py
        except OSError as e:
            sys.exit(f"train.py: error: --out: cannot write in {args.out!r} ({e})")
    log, signals = RunFile(log_path) if main else None, Signals()
    try:
        step, signum, error = run_steps(args, cfg, env, agents, expert, eval_env, start, log, signals)
    finally:
        signals.restore()
    check_ranks_agree(agents)
    failed = False
    try:
        if main:
            save_checkpoint(args.out, step, agents, args, log)
        if main and signum is None and error is None:
            save_final(args.out, step, agents, merged=args.save_merged)
            print(f"wrote {log_path} and {len(agents)} agents under {args.out}/agent_*")
    except SaveFailed as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        failed = True
    barrier()  # torchrun stops every process when one exits: not before process 0 has saved
    if signum is not None or error or failed:
        sys.exit(128 + signum if signum is not None else error or 1)
    return log_path


def run_steps(args, cfg, env, agents, expert, eval_env, start, log, signals):
    """Steps start .. --steps - 1, a checkpoint every --save-every, curve.svg every 10 steps. Returns
    (the number of steps done, the signal that stopped the run or None, the error that did or None).
    Under torchrun each process samples and scores its share of the step's prompts, the update sums
    over all (magrpo.update_team), and the processes decide together to stop."""
    main, recent, last_turn = log is not None, [], f"reward_mean_turn{cfg.num_turns}"
    curve = RunFile(os.path.join(args.out, "curve.svg"))
    history = [json.loads(line) for line in open(log.path)] if main and log.size else []  # cut_metrics' rows
    bar = tqdm(range(start, args.steps), desc=f"magrpo {env.name}", dynamic_ncols=True, initial=start,
               total=args.steps, disable=not main)
    for step in bar:
        batch = batch_at(env, args.seed, step, args.batch_size)
        seeds = [magrpo.mix_seed(args.seed, step, j) for j in range(len(batch))]  # seeded per prompt
        batch, seeds = my_share(batch), my_share(seeds)
        t0 = time.time()
        try:
            with signals.abandon_on_signal():  # sampling and scoring change nothing: a signal drops the step
                turns = magrpo.rollout_team(agents, env, batch, cfg, seeds, expert)
        except Stop:
            turns = None
        votes = gather((signals.received, turns is None))  # the processes stop together, or not at all
        signum = next((s for s, _ in votes if s is not None), None)
        if any(abandoned for _, abandoned in votes):
            return step, signum, None
        summary = magrpo.merge_summaries(gather(magrpo.episode_summary(turns)))
        m = {"step": step, **magrpo.episode_metrics(None, cfg.num_turns, summary)}
        error = warn_scoring(m, step, sum(len(t["rewards"]) for t in summary))
        if error:  # the same on every process (the summary is merged): stop before this step's update
            return step, None, error
        m.update(magrpo.update_team(agents, turns, cfg))
        m["seconds"] = round(time.time() - t0, 4)
        last = step == args.steps - 1
        if main and eval_env is not None and (step % args.eval_every == 0 or last):
            rewards = eval_rewards(agents, eval_env, cfg, args.eval_limit, expert)
            m["eval_reward_mean"] = rewards[0]
            m.update({f"eval_reward_mean_turn{t}": r for t, r in enumerate(rewards, 1)})
            tqdm.write(f"step {step:5d} eval reward {' -> '.join(f'{r:.3f}' for r in rewards)} "
                       f"({eval_env.name}, {args.eval_split})")
        signum = next((s for s in gather(signals.received) if s is not None), None)
        if args.save_every and (step + 1) % args.save_every == 0:
            check_ranks_agree(agents)
        if not main:
            if signum is not None:
                return step + 1, signum, None
            continue
        log.append(json.dumps(m) + "\n")
        history.append(m)
        if step % 10 == 9 or last or signum is not None:
            curve.write(write_curve, curve.path, history)
        if args.save_every and (step + 1) % args.save_every == 0 and not last:
            try:
                save_checkpoint(args.out, step + 1, agents, args, log)
            except SaveFailed as e:
                warnings.warn(f"{e}; the run goes on")
        shown = m[last_turn] if m[last_turn] is not None else m["reward_mean"]
        recent = (recent + [shown])[-20:]
        bar.set_postfix(reward=f"{sum(recent) / len(recent):.3f}", zero_adv=m["zero_adv_groups"])
        if step % max(1, args.steps // 10) == 0 or last:
            tqdm.write(f"step {step:5d} reward " +
                       " -> ".join(f"{m[f'reward_mean_turn{t}'] or 0:.3f}" for t in range(1, cfg.num_turns + 1)) +
                       " | " + " | ".join(repr(s[:60]) for s in turns[-1].outputs[0]))
        if signum is not None:
            return step + 1, signum, None
    return args.steps, None, None

# -----------------------------------------------------------------------------
# Data parallelism: torchrun --nproc-per-node N train.py ... (gloo on the CPU, NCCL on GPUs)


def start_processes():
    """Under torchrun (it sets WORLD_SIZE, RANK, LOCAL_RANK): join the process group. Returns
    (local rank, processes on this node); (0, 1) alone."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def rank():
    return torch.distributed.get_rank() if magrpo.data_parallel() else 0


def barrier():
    if magrpo.data_parallel():
        torch.distributed.barrier()


def gather(obj):
    """obj from every process, in process order ([obj] alone)."""
    if not magrpo.data_parallel():
        return [obj]
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def weights_digest(agents):
    """Per agent, the sum and the sum of squares of all its weights, in float64."""
    return [(sum(p.double().sum().item() for p in a.model.parameters()),
             sum(p.double().square().sum().item() for p in a.model.parameters())) for a in agents]


def check_ranks_agree(agents):
    """Data parallelism must keep every process's agents identical (the same summed gradients, the
    same optimizer step): compare their weights' digests at every checkpoint; a difference is a
    bug, and the run stops rather than save either copy."""
    digests = gather(weights_digest(agents))
    if any(d != digests[0] for d in digests):
        raise RuntimeError(f"the processes' agents differ: {digests}")


def my_share(items):
    """This process's contiguous share of a step's items (all of them alone): with the prompts'
    own seeds, N processes sample exactly what one process samples for the same global batch."""
    if not magrpo.data_parallel():
        return items
    r, w = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return items[r * len(items) // w:(r + 1) * len(items) // w]


COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def curve_series(rows):
    """What curve.svg draws, per key: the first turn's reward and each of its levels, the last
    turn's reward (multi-turn) and the in-training eval reward."""
    keys = [k for k in rows[0] if k == "reward_mean" or (k.startswith("level_") and "_turn" not in k)]
    last = max((int(k.removeprefix("reward_mean_turn")) for k in rows[0] if k.startswith("reward_mean_turn")), default=1)
    keys += [f"reward_mean_turn{last}"] if last > 1 else []
    keys += ["eval_reward_mean"] if any("eval_reward_mean" in r for r in rows) else []
    return {k: [(r["step"], r[k]) for r in rows if r.get(k) is not None] for k in keys}


def write_curve(path, rows, width=760, height=400, pad=50, legend=190):
    """The learning curve as a small hand-written SVG (no plotting library): each series of
    curve_series over the steps, smoothed by a running mean over 1/30 of the run."""
    series = {k: v for k, v in curve_series(rows).items() if v} if rows else {}
    if not series:
        return
    steps = [s for v in series.values() for s, _ in v]
    top = max(max(y for _, y in v) for v in series.values()) or 1.0
    x0, x1 = min(steps), max(max(steps), min(steps) + 1)
    right = width - legend  # the plot's right edge; the legend stands beyond it
    X = lambda s: pad + (s - x0) / (x1 - x0) * (right - pad)  # noqa: E731
    Y = lambda y: height - pad - max(0.0, y) / top * (height - 2 * pad)  # noqa: E731
    w = max(1, len(rows) // 30)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
             f'<path d="M{pad},{pad}V{height - pad}H{right}" stroke="black" fill="none"/>',
             f'<text x="{pad - 5}" y="{Y(top) + 4:.1f}" text-anchor="end">{top:.3g}</text>',
             f'<text x="{pad - 5}" y="{Y(0) + 4:.1f}" text-anchor="end">0</text>',
             f'<text x="{pad}" y="{height - pad + 16}">step {x0}</text>',
             f'<text x="{right}" y="{height - pad + 16}" text-anchor="end">step {x1}</text>']
    for n, (key, points) in enumerate(series.items()):
        ys = [y for _, y in points]
        smooth = [sum(ys[max(0, i - w + 1):i + 1]) / len(ys[max(0, i - w + 1):i + 1]) for i in range(len(ys))]
        color = COLORS[n % len(COLORS)]
        line = " ".join(f"{X(s):.1f},{Y(y):.1f}" for (s, _), y in zip(points, smooth))
        parts += [f'<polyline points="{line}" stroke="{color}" fill="none" stroke-width="1.5"/>',
                  f'<text x="{right + 10}" y="{pad + 16 * n}" fill="{color}">{key}</text>']
    write_atomic(path, "\n".join(parts + ["</svg>\n"]))


def warn_scoring(m, step, total):
    """Joint answers that could not be scored count as 0: say so at every step it happens. Returns,
    when nothing could be scored (the sandbox or the env is broken, not the agents), the error that
    stops the run."""
    bad = m["sandbox_errors"] + m["score_errors"]
    if bad == total:
        return (f"train.py: error: step {step}: none of the {total} joint answers could be scored "
                f"({m['sandbox_errors']} sandbox failures, {m['score_errors']} scoring errors)")
    if bad:
        tqdm.write(f"warning: step {step}: {bad} of {total} joint answers could not be scored and count as 0 "
                   f"({m['sandbox_errors']} sandbox failures, {m['score_errors']} scoring errors)", file=sys.stderr)


if __name__ == "__main__":
    train(parse_args())
