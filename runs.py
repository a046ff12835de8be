"""
What a run needs besides the algorithm, for train.py and eval.py: Config's flags, the run directory
(checkpoints written atomically, logs that survive a full disk), signals, and torchrun's processes.
magrpo.py knows nothing of these; train.py's loop calls them.

    python -m pytest tests/test_train.py -k "resume or signal or disk"   # what guards a run
"""
import contextlib
import dataclasses
import datetime
import json
import os
import shutil
import signal
import sys
import warnings

import torch
from tqdm import tqdm

import magrpo
import models

# -----------------------------------------------------------------------------
# Config's fields as flags: each field of magrpo.Config is a flag of train.py and eval.py.

# Flags that do not change what a resumed run computes: the rest must match the checkpoint's, since
# a run resumed with another learning rate or G would be neither the old run nor a new one.
RESUMABLE = {"steps", "resume", "out", "device", "micro_batch_size", "save_every", "save_total_limit",
             "eval_every", "eval_split", "eval_limit", "world_size", "save_merged", "log_completions_every",
             "wandb", "compile", "cpu_threads"}
# The flags that args.json holds resolved (train.fill_resolved); an earlier version saved them None.
FILLED = {"model", "num_agents", "dataset", "split", "termination_threshold", "turn_weights", "lora_alpha"}

def add_config_flags(parser, names=None):
    """--flag-name for Config's fields (all, or `names`), default None so that train.py and eval.py
    can tell a flag the user gave from one they fill in."""
    for f in dataclasses.fields(magrpo.Config):
        if names is None or f.name in names:
            text = f"{f.metadata['help']} (default {f.default})".replace("%", "%%")  # argparse formats %
            flag = f"--{f.name.replace('_', '-')}"
            if f.type is bool:  # a switch, None when not given, like the others
                parser.add_argument(flag, action="store_true", default=None, help=text)
            else:
                parser.add_argument(flag, type=f.type if f.type in (int, float) else str, help=text)


def config_from_flags(args, **overrides):
    """A Config from the flags that name its fields and were given (the others: Config's defaults)."""
    values = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(magrpo.Config)}
    given = {name: value for name, value in values.items() if value is not None}
    return magrpo.Config(**{**given, **overrides})

# -----------------------------------------------------------------------------
# The run directory: refuse to clobber a run, resume one, write checkpoints atomically. A run is
# hours of compute: a kill, a signal or a full disk at any moment leaves a checkpoint to resume from.


def prepare_out(args):
    """None (step 0) or the (step, path) of the checkpoint to resume. A new run refuses an --out that
    holds a run; --resume refuses flags that would change it."""
    problem = out_problem(args.out)
    if problem:
        raise ValueError(f"--out: {problem}")
    names = os.listdir(args.out) if os.path.isdir(args.out) else []
    if not args.resume:
        for name in names:
            ours = name in ("args.json", "metrics.jsonl", "final.json")
            if ours or name.startswith(("checkpoint-", "agent_")):  # writing over a run would lose it
                raise ValueError(f"--out: {args.out!r} already holds a run: continue it with --resume, or "
                                 "pick another --out")
        return None
    # With --resume, what a kill left half done goes, and the newest complete checkpoint is the start.
    for leftover in names:
        if leftover.startswith((".tmp-", ".trash-")):  # a save or a rotation a kill interrupted
            shutil.rmtree(os.path.join(args.out, leftover), ignore_errors=True)
    checkpoint = models.latest_checkpoint(args.out)  # a broken one (a kill mid-save) is skipped
    if checkpoint is None:
        return None
    saved = models.checkpoint_state(checkpoint[1])["args"]
    for name, value in saved.items():
        # An earlier version saved None for the flags fill_resolved fills now: the same run.
        if value is None and name in FILLED:
            continue
        if name not in RESUMABLE and value != vars(args).get(name):
            raise ValueError(f"--{name.replace('_', '-')}: the run in {args.out!r} used {value!r}, not "
                             f"{vars(args).get(name)!r}; resume with the same flags (only --steps and the "
                             "save/eval/device flags may change)")
    if args.steps < checkpoint[0]:  # A larger --steps continues a finished run, which is allowed.
        raise ValueError(f"--steps: the run in {args.out!r} is already at step {checkpoint[0]}")
    return checkpoint


def out_problem(out):
    """Why --out cannot hold a run (a file in its place, a directory that cannot be written), or None.
    Asked before any model loads: a typo costs a second, not a model load."""
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{out!r} is a file, not a directory"
    # The nearest directory that exists is the one the run writes in (or makes --out in).
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"{path!r} is a file, not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"cannot write in {path!r}"
    return None


def start_out(args, start):
    """Process 0, every input checked: --out made, its logs cut back to `start` (a resumed run logs its
    later steps again), args.json written. -> whether --out was made here."""
    made = not os.path.isdir(args.out)
    try:
        os.makedirs(args.out, exist_ok=True)
        # Rows of steps at or after the checkpoint's would be logged twice, as the resumed run redoes them.
        for name in ("metrics.jsonl", "completions.jsonl"):
            cut_metrics(os.path.join(args.out, name), start)
        write_atomic(os.path.join(args.out, "args.json"), json.dumps(vars(args), indent=1))
    except OSError as e:
        raise ValueError(f"--out: cannot write in {args.out!r} ({e})") from None
    return made


def undo_start(out, made):
    """A run that failed before its first step leaves --out as it found it: the files of a start go
    (a run that never stepped is no work to keep), and --out too if this run made it."""
    if models.checkpoints(out):  # A checkpoint-0 of an earlier, stopped start is its run, kept whole.
        return
    for name in ("args.json", "metrics.jsonl", "completions.jsonl", "curve.svg"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, name))
    if made:
        with contextlib.suppress(OSError):  # A directory not empty (another program's files) stays.
            os.rmdir(out)


def write_atomic(path, text):
    """`text` as the file `path`, whole or not at all: written aside, fsync'd, renamed into place."""
    # A rename is atomic, so a reader (or a resume after a kill) sees the old file or the new one.
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_tree(path):
    """Everything under `path` on disk, directories included (before it is renamed into place)."""
    for root, _, files in os.walk(path):
        for name in [os.curdir] + files:  # the directory itself, then its files
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
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
        free = shutil.disk_usage(out).free / 2**20  # Measured before the partial copies go.
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)
        latest = models.latest_checkpoint(out)
        where = "there is no complete checkpoint (--resume starts at step 0)"
        if latest:
            where = f"{latest[1]} is the newest complete checkpoint (--resume continues from it)"
        raise SaveFailed(f"could not save {what} ({type(e).__name__}: {e}; {free:.1f} MB left on the disk); "
                         + where) from None


def save_checkpoint(out, step, agents, args, logs=()):
    """OUT/checkpoint-<step> (models.write_checkpoint), once the `logs` hold every row before it.
    Written aside, fsync'd, renamed: a kill leaves the last complete checkpoint or this one. Keeps the
    newest --save-total-limit."""
    final = os.path.join(out, f"checkpoint-{step}")
    tmp = os.path.join(out, f".tmp-checkpoint-{step}")  # A hidden name is never taken for a checkpoint.
    if os.path.isdir(final) and models.checkpoint_problem(final) is None:
        return  # saved already (a signal right after a periodic save)
    with saving(out, f"checkpoint-{step}", tmp):
        # The logs go first, since a checkpoint of step k must never lack the rows of the steps before k.
        for log in logs:
            log.sync()
        shutil.rmtree(tmp, ignore_errors=True)
        # The data position is the step, since batch_at derives step k's examples from (seed, k) alone.
        models.write_checkpoint(tmp, agents, {"step": step, "data_position": step * args.batch_size,
                                              "args": vars(args)})
        # On disk before the rename, and the rename on disk after it, so that after a power loss the name
        # checkpoint-<step> never points at data that was still in the page cache.
        fsync_tree(tmp)
        if os.path.exists(final):  # a broken checkpoint of this step, from before a resume
            os.rename(final, os.path.join(out, f".trash-checkpoint-{step}"))
        os.rename(tmp, final)
        fsync_tree(out)
    # Rotation comes only after the new checkpoint is complete, so a full disk never costs the old ones.
    complete = [path for _, path in models.checkpoints(out) if models.checkpoint_problem(path) is None]
    keep = complete[:args.save_total_limit]  # the newest complete ones; broken ones go too
    for _, old in models.checkpoints(out):
        if old not in keep:
            trash = os.path.join(out, ".trash-" + os.path.basename(old))
            with contextlib.suppress(OSError):
                os.rename(old, trash)  # out of sight at once; a kill during the delete leaves only trash
            shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(os.path.join(out, f".trash-checkpoint-{step}"), ignore_errors=True)


def save_final(out, step, agents, merged=False):
    """OUT/agent_i, hard links to checkpoint-<step>'s files where it can, then OUT/final.json;
    `merged`: a LoRA agent also as a full model in OUT/agent_i/merged."""
    tmps = [os.path.join(out, f".tmp-agent_{i}") for i in range(len(agents))]
    # final.json is written last and removed first: it says that every OUT/agent_i is whole, which
    # eval.py --agents checks before it trusts them (else it takes the latest checkpoint).
    with saving(out, f"the trained agents in {out}", *tmps):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, "final.json"))  # an earlier end's, about to be replaced
        for i, (agent, tmp) in enumerate(zip(agents, tmps)):
            dest = os.path.join(out, f"agent_{i}")
            shutil.rmtree(tmp, ignore_errors=True)
            source = os.path.join(out, f"checkpoint-{step}", f"agent_{i}")
            no_optimizer = shutil.ignore_patterns(models.OPTIMIZER_STATE)  # only a checkpoint needs it
            shutil.copytree(source, tmp, copy_function=link_or_copy, ignore=no_optimizer)
            if merged and models.is_lora(agent.model):
                models.save_agent(agent, os.path.join(tmp, "merged"), merged=True)
            fsync_tree(tmp)
            if os.path.exists(dest):
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        write_atomic(os.path.join(out, "final.json"), json.dumps({"step": step, "agents": len(agents)}))


def link_or_copy(src, dst):
    """A hard link (no second copy of a 3B model's weights on the disk), else a copy."""
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
        # The length of what is written whole; a write the disk cut short is truncated back to it.
        self.size = os.path.getsize(path) if os.path.exists(path) else 0

    def write(self, writer, *args):
        try:
            writer(*args)
        except OSError as e:
            if not self.warned:
                warnings.warn(f"could not write {self.path} ({e}); the run goes on (docs/runs.md)")
            self.warned = True

    def append(self, line):
        # Not fsync'd, since a row per step need not cost a disk flush; a checkpoint syncs the log first.
        self.pending += line
        self.write(self.sync, False)

    def sync(self, fsync=True):
        """Write the pending lines (fsync: a checkpoint needs every row before it)."""
        with open(self.path, "a") as f:
            f.truncate(self.size)  # a write that failed halfway is cut back, then written whole
            f.write(self.pending)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        self.size, self.pending = os.path.getsize(self.path), ""

# -----------------------------------------------------------------------------
# Signals: SIGTERM (a preempted job), SIGHUP, SIGINT (Ctrl-C) end the run with a checkpoint


class Stop(Exception):
    """Raised by the signal handler into a step that samples: its work is thrown away, not saved."""


class Signals:
    """A signal abandons the step while it samples, else waits for its update to end (no agent holds
    half an update); then a checkpoint, exit 128 + the signal."""

    def __init__(self):
        # The first signal counts (a second ^C does not interrupt the checkpoint); the previous
        # handlers come back at the run's end (restore).
        self.received, self.abandonable = None, False
        self.previous = {signum: signal.signal(signum, self.handle)
                         for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}

    def handle(self, signum, frame):
        # Python runs a handler between two bytecodes of the main thread, so raising Stop here ends the
        # sampling at once (a sandbox batch included: its runs are killed), never an optimizer step.
        if self.received is None:
            self.received = signum
            tqdm.write(f"{signal.Signals(signum).name}: saving a checkpoint, then exiting", file=sys.stderr)
        if self.abandonable:
            self.abandonable = False
            raise Stop()

    @contextlib.contextmanager
    def abandon_on_signal(self):
        """While the block runs, a signal raises Stop in it (a signal already received: at once)."""
        if self.received is not None:
            raise Stop()
        self.abandonable = True
        try:
            yield
        finally:
            self.abandonable = False

    def restore(self):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

# -----------------------------------------------------------------------------
# Data parallelism: torchrun --nproc-per-node N train.py ... (gloo on the CPU, NCCL on GPUs). Every
# process runs the same loop on its share of each step's prompts (my_share); train_step sums the loss
# counts and the gradients through train.py's hooks (all_sum, sum_gradients), and the collectives here
# keep the processes in step (gather).

# Process 0 saves while the others wait in a collective; NCCL's default timeout (10 minutes) would
# kill a run whose save of a large agent and its optimizer state takes longer on a slow disk.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)


def start_processes():
    """Under torchrun, join the process group -> (local rank, local size). Alone (no WORLD_SIZE), no
    group is made, and every collective below is a no-op: one code path for both."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        # gloo for CPU tensors (gather's pickles), NCCL for the gradients on GPUs
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def gather(obj):
    """obj from every process, in process order ([obj] alone)."""
    out = [obj] * world()[1]
    if data_parallel():
        torch.distributed.all_gather_object(out, obj)
    return out


def weights_digest(agents):
    """Per agent, the sum and the sum of squares of all its weights, in float64: cheap to send, and a
    weight that differs anywhere changes it."""
    digests = []
    for agent in agents:
        params = list(agent.model.parameters())
        digests.append((sum(p.double().sum().item() for p in params),
                        sum(p.double().square().sum().item() for p in params)))
    return digests


def check_ranks_agree(agents):
    """Every process's agents must stay identical: a difference is a bug: stop rather than save.
    Checked before every save, so that no checkpoint holds one process's diverged agents."""
    digests = gather(weights_digest(agents))
    if any(d != digests[0] for d in digests):
        raise RuntimeError(f"the processes' agents differ: {digests}")


def world():
    """(this process's rank, the number of processes); (0, 1) alone. Rank 0 is process 0, the one
    that writes the run's files."""
    if data_parallel():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def my_share(items):
    """This process's contiguous share of a step's items (N processes sample what one samples)."""
    # Contiguous shares keep each prompt's seed with it, so sampling does not depend on the split.
    rank, size = world()
    return items[rank * len(items) // size:(rank + 1) * len(items) // size]


def data_parallel():
    """Whether this process is one of torchrun's; alone, every collective here is a no-op."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def all_sum(values, device="cpu"):
    """The element-wise sum of a list of numbers over the processes (float64: a count or a sum of
    losses loses nothing on the way)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if data_parallel():
        torch.distributed.all_reduce(t)
    return t.tolist()


def all_max(values):
    """The element-wise maximum of a list of numbers over the processes."""
    t = torch.tensor(values, dtype=torch.float64)
    if data_parallel():
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return t.tolist()


@torch.no_grad()
def sum_gradients(model):
    """Each gradient summed over the processes (each loss is already divided by the whole batch's
    count). A gradient no process has stays None."""
    if not data_parallel():
        return
    params = [p for p in model.parameters() if p.requires_grad]
    has_grad = all_sum([float(p.grad is not None) for p in params], params[0].device)
    for p, processes_with_grad in zip(params, has_grad):
        if processes_with_grad:
            p.grad = p.grad if p.grad is not None else torch.zeros_like(p)  # another process has one
            torch.distributed.all_reduce(p.grad)
