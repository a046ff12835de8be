"""
A run: its flags (Config's and the env's, for train.py and eval.py alike), its directory (checkpoints
vouched for by a manifest written last, logs that survive a full disk), signals, and torchrun's
processes. magrpo.py knows nothing of these; train.py's loop calls them.

    python -m pytest tests/test_train.py -k "resume or signal or disk"   # what guards a run
"""
import argparse
import contextlib
import dataclasses
import datetime
import inspect
import json
import os
import random
import shutil
import signal
import sys
import warnings
from pathlib import Path

import torch
from tqdm import tqdm

import envs
import magrpo
import models

# -----------------------------------------------------------------------------
# The flags of train.py and eval.py: each field of magrpo.Config is one, and the env's flags make the env.

# Flags that do not change what a resumed run computes: the rest must match the checkpoint's, since
# a run resumed with another learning rate or G would be neither the old run nor a new one.
RESUMABLE = {"steps", "resume", "out", "device", "micro_batch_size", "save_every", "save_total_limit",
             "eval_every", "eval_split", "eval_limit", "world_size", "save_merged", "log_completions_every",
             "wandb", "compile", "cpu_threads"}
# The flags that args.json holds resolved (train.resolve_flags); an earlier version saved them None.
FILLED = {"model", "num_agents", "dataset", "split", "termination_threshold", "turn_weights", "lora_alpha"}

# Each Config field's flag help (magrpo.Config holds the defaults, with a word on each).
CONFIG_HELP = {
    "num_generations": "G, completions per agent per prompt (Sec. 2 step 1)",
    "max_new_tokens": "tokens per completion at most",
    "temperature": "sampling temperature (0: greedy)",
    "top_p": "nucleus sampling: keep the most likely tokens up to this mass",
    "top_k": "sample among the k most likely tokens only (0: off)",
    "logprob": "Eq. 2's log-prob under top-k/top-p: cut (of the distribution that drew the token) or "
               "full (before the cut, as TRL and the authors)",
    "compile": "torch.compile the sampler's decode step (a CUDA graph on a GPU)",
    "joint": "joint actions: aligned (G of them, the paper) or cross (G^n)",
    "advantage": "Eq. 1's baseline: mean (the paper; TRL's scale_rewards=none), rloo, none (REINFORCE: no "
                 "baseline), remax or critic (R - V(s), a learned value: --critic); std: mean with "
                 "--scale-rewards group",
    "scale_rewards": "Eq. 1's advantages divided by the std + 1e-4 of their group (GRPO), of the turn's "
                     "whole batch, or none (the paper); as TRL's",
    "loss_type": "Eq. 2's normalisation: seq_sum (the paper), token_mean (TRL's dapo), seq_mean (grpo), "
                 "token_budget (dr_grpo); TRL's bnpo, a token mean per micro-batch, is token_mean here "
                 "(TRL's, one micro-batch)",
    "mask_truncated_completions": "completions that never reached EOS get no gradient",
    "max_grad_norm": "clip each agent's gradient norm to this (0: off, as the paper; TRL's default is 1.0)",
    "micro_batch_size": "rows per log-prob forward/backward (memory, not maths)",
    "num_turns": "T: answer, get feedback, revise (Sec. 3; 1: single turn)",
    "expand": "multi-turn: revise the best joint answer of each group, or all",
    "discount": "gamma of node_return, with --expand all (best: turn rewards)",
    "termination_threshold": "a joint answer whose reward reaches it is solved (None: env max)",
    "turn_weights": "comma list, each turn's loss weight (e.g. 1.2,0.8; None: all 1)",
    "feedback": "between turns: level, plain or expert",
    "feedback_max_new_tokens": "bound on the expert's review (--feedback expert)",
}
# Other names of these settings, each resolved here alone, to ours: TRL's GRPOConfig loss types
# (docs/flags.md compares the two trainers), and --advantage std, the original GRPO's z-score.
SPELLINGS = {("loss_type", "grpo"): {"loss_type": "seq_mean"},
             ("loss_type", "dapo"): {"loss_type": "token_mean"},
             ("loss_type", "bnpo"): {"loss_type": "token_mean"},
             ("loss_type", "dr_grpo"): {"loss_type": "token_budget"},
             ("advantage", "std"): {"advantage": "mean", "scale_rewards": "group"}}


def add_config_flags(parser, names=None):
    """--flag-name for Config's fields (all, or `names`), default None so that train.py and eval.py
    can tell a flag the user gave from one they fill in."""
    for f in [f for f in dataclasses.fields(magrpo.Config) if names is None or f.name in names]:
        text = CONFIG_HELP[f.name].replace("%", "%%")  # argparse formats %; show_defaults adds defaults
        flag = f"--{f.name.replace('_', '-')}"
        if f.type is bool:  # a switch, None when not given, like the others
            parser.add_argument(flag, action="store_true", default=None, help=text)
        else:
            parser.add_argument(flag, type=f.type if f.type in (int, float) else str, help=text)


def checked_config(**settings):
    """A magrpo.Config of flag values: the other names resolved to ours (SPELLINGS), every value checked,
    a bad one a ValueError that names its flag."""
    defaults = magrpo.Config()

    def given(name):
        return settings.get(name, getattr(defaults, name))

    def check(name, ok, why):
        if not ok:
            raise ValueError(f"--{name.replace('_', '-')}: {why}, got {given(name)!r}")
    # TRL's names and --advantage std become ours first, so that the checks below see only our values,
    # and a setting that a spelling makes must not contradict one given beside it.
    for (name, spelling), resolved in SPELLINGS.items():
        if given(name) == spelling:
            for key, value in resolved.items():  # another setting it makes must be left alone, or agree
                free = key == name or given(key) in (value, getattr(defaults, key))
                check(key, free, f"--{name.replace('_', '-')} {spelling} sets it to {value}")
                settings[key] = value
    for name, choices in magrpo.Config.CHOICES.items():
        names = choices + tuple(spelling for owner, spelling in SPELLINGS if owner == name)
        check(name, given(name) in choices, f"use one of {', '.join(names)}")
    # The flag gives a comma list, Python a tuple or a list: the step reads one form, a tuple of floats.
    weights = given("turn_weights")
    if weights is not None:
        try:
            settings["turn_weights"] = tuple(float(w) for w in (weights.split(",") if isinstance(weights, str)
                                                                else weights))
        except ValueError:
            raise ValueError(f"--turn-weights: want a comma list of numbers, got {weights!r}") from None
    cfg = magrpo.Config(**settings)
    for name in ("num_generations", "max_new_tokens", "micro_batch_size", "num_turns",
                 "feedback_max_new_tokens"):
        check(name, getattr(cfg, name) >= 1, "must be >= 1")
    check("temperature", cfg.temperature >= 0, "must be >= 0 (0 is greedy)")
    check("top_p", 0 < cfg.top_p <= 1, "must be in (0, 1]")
    check("top_k", cfg.top_k >= 0, "must be >= 0 (0: no top-k cut)")
    check("discount", 0 <= cfg.discount <= 1, "must be in [0, 1]")
    check("max_grad_norm", cfg.max_grad_norm >= 0, "must be >= 0 (0: no clipping)")
    # A critic's baseline is a learned value, not a group's mean, so there is no group std to divide by.
    check("scale_rewards", cfg.advantage != "critic" or cfg.scale_rewards == "none",
          "--advantage critic has no group to scale by: use none")
    one_per_turn = cfg.turn_weights is None or len(cfg.turn_weights) == cfg.num_turns
    check("turn_weights", one_per_turn, f"give one weight per turn ({cfg.num_turns})")
    return cfg


# The defaults that depend on the run, the one place they are set. Config's own are the paper's
# (magrpo.py, Sec. 2), and an env's own for training a real model are its `settings` (the authors').
RUN_DEFAULTS = {
    "train": dict(learning_rate=1e-5, steps=1000, batch_size=1),  # the paper's
    # The tiny model learns from scratch in minutes, with a high lr, short outputs and bigger groups.
    "tiny": dict(num_generations=8, max_new_tokens=24, learning_rate=3e-3, steps=150, batch_size=2),
    "eval": dict(temperature=0.8, top_p=0.95),  # the paper's evaluation (Sec. 6)
}


def run_defaults(purpose, tiny, settings=None):
    """The defaults of a run ("train" or "eval") that are not Config's own, by flag: training's (the
    tiny model's, or the paper's and the env's `settings`) or evaluation's (the paper's sampling; the
    tiny model's length). Config then fills the rest (fill_defaults(args, asdict(cfg)))."""
    if purpose == "eval":  # the tiny model writes as long as it learnt to in training
        length = {"max_new_tokens": RUN_DEFAULTS["tiny"]["max_new_tokens"]} if tiny else {}
        return {**RUN_DEFAULTS["eval"], **length}
    return dict(RUN_DEFAULTS["tiny"]) if tiny else {**RUN_DEFAULTS["train"], **(settings or {})}


def fill_defaults(args, defaults):
    """Each flag of `defaults` that the program has and the user did not give (None) takes its default."""
    for name, value in defaults.items():
        if name in vars(args) and getattr(args, name) is None:
            setattr(args, name, value)


def show_defaults(parser, purpose, env_settings):
    """Each flag's help ends with the defaults a run uses (run_defaults), per model and per env
    ({name: settings}) where they differ, so that --help shows what a run will use."""
    config = dataclasses.asdict(magrpo.Config())
    tiny, real = {**config, **run_defaults(purpose, True)}, {**config, **run_defaults(purpose, False)}
    for action in [action for action in parser._actions if action.dest in tiny]:  # the flags with defaults
        name = action.dest
        text = (f"default: the tiny model {tiny[name]}, a real model {real[name]}" if tiny[name] != real[name]
                else f"default {real[name]}")
        # The envs whose own value differs from a real model's default: "tldr 5e-06, arxiv 5e-06".
        per_env = [f"{env} {own[name]}" for env, own in env_settings.items()
                   if own.get(name, real[name]) != real[name]]
        if per_env:
            text += "; a real model on " + ", ".join(per_env)
        action.help = f"{action.help or ''} ({text})".strip()


def config_from_flags(args, **overrides):
    """A Config from the flags that name its fields and were given (the others: Config's defaults)."""
    values = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(magrpo.Config)}
    given = {name: value for name, value in values.items() if value is not None}
    return checked_config(**{**given, **overrides})


def flag_parser(doc):
    """The parser of train.py or eval.py (`doc`: the script's docstring, its first paragraph the
    description) with the flags both take: the model's, and the env's (env_from_flags): which env, its
    data and split, its team's size, its reward (ours or the authors'), and for an env that runs code
    its sandbox's time and isolation."""
    # allow_abbrev is off, or argparse would take a typo such as --num-gen for --num-generations silently.
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="demo", help=f"one of {', '.join(sorted(envs.ENVS))}, or your own: "
                                                   f"FILE.py:CLASS or MODULE:CLASS")
    p.add_argument("--dataset", help="the env's data: a name it knows (humaneval) or a JSONL path")
    p.add_argument("--split", help="named split (train, eval, test) or a slice like 33:133")
    p.add_argument("--text-field", help="writing envs: the JSONL field holding the text")
    p.add_argument("--num-agents", type=int, help="number of agents (default: the env's)")
    p.add_argument("--authors-rewards", action="store_true", help="score with the authors' rewards, not ours")
    p.add_argument("--test-timeout", type=float,
                   help=f"coding: seconds per sandbox test (default {envs.TEST_TIMEOUT:g})")
    p.add_argument("--sandbox", choices=("auto", "namespaces", "rlimits"), default="auto",
                   help="coding: the sandbox's isolation for model code; auto: namespaces where they work, "
                        "else rlimits; a level named is required")
    models.add_model_flags(p)
    return p


# The constructor keyword of each env flag. timeout and isolation go only to an env that runs code.
ENV_FLAGS = {"dataset": "--dataset", "split": "--split", "text_field": "--text-field",
             "num_agents": "--num-agents", "authors": "--authors-rewards", "timeout": "--test-timeout",
             "isolation": "--sandbox"}


def env_from_flags(args, split=None, flag=None, default_split="train"):
    """The env of --env, its constructor called with each env flag given, or another `split` (flag
    `flag`), and `default_split`. ValueError("--flag: ...") for a flag the constructor does not take
    (a flag that changed nothing would make a run lie about itself) or its own complaint."""
    try:
        cls = envs.env_class(args.env)
    except ValueError as e:
        raise ValueError(f"--env: {e}") from None
    code_only = ("timeout", "isolation")
    flags = {key: name for key, name in ENV_FLAGS.items() if cls.runs_code or key not in code_only}
    given = {key: getattr(args, name[2:].replace("-", "_")) for key, name in flags.items()}
    given = {key: value for key, value in given.items() if value is not None and value is not False}
    if split is not None:  # train.py's in-training eval, on --eval-split
        given["split"], flags["split"] = split, flag or "--split"
    params = inspect.signature(cls).parameters
    options = {"default_split": default_split} if "default_split" in params else {}
    for key, value in given.items():
        if key in params:
            options[key] = value
        elif value != getattr(cls, key, None):  # a value the env has anyway, e.g. its num_agents, is fine
            raise ValueError(f"{flags[key]}: the {args.env} env ({cls.__name__}) takes no {key!r} argument")
    # The env's own complaints (bad data, a missing file) end the run in one line: its flag, else --env.
    try:
        return cls(**options)
    except (ValueError, OSError) as e:
        where = flag or "/".join(flags[key] for key in given) or f"--env {args.env}"
        raise ValueError(f"{where}: {e}") from None


# -----------------------------------------------------------------------------
# The run directory: refuse to clobber a run, resume one, write checkpoints atomically. A run is
# hours of compute: a kill, a signal or a full disk at any moment leaves a checkpoint to resume from.


def prepare_out(args):
    """None (step 0) or the (step, path) of the checkpoint to resume. A new run refuses an --out that
    holds a run; --resume refuses flags that would change it."""
    check_out(args.out)
    if not args.resume:
        for name in os.listdir(args.out) if os.path.isdir(args.out) else []:
            ours = name in ("args.json", "metrics.jsonl", "final.json")
            if ours or name.startswith(("checkpoint-", "agent_")):  # writing over a run would lose it
                raise ValueError(f"--out: {args.out!r} already holds a run: continue it with --resume, or "
                                 "pick another --out")
        return None
    # With --resume the newest complete checkpoint is the start; a broken one (a kill mid-save) is skipped.
    checkpoint = latest_checkpoint(args.out)
    if checkpoint is None:
        return None
    saved = json.loads(Path(checkpoint[1], CHECKPOINT_STATE).read_text())["args"]  # the run's flags
    for name, value in saved.items():
        mine = vars(args).get(name)
        # The same run: an earlier version saved None for the flags resolve_flags fills now, and a dtype
        # is recorded as what auto resolved to.
        same = value == mine or (value is None and name in FILLED) or (name == "dtype" and mine == "auto")
        if name not in RESUMABLE and not same:
            raise ValueError(f"--{name.replace('_', '-')}: the run in {args.out!r} used {value!r}, not "
                             f"{mine!r}; resume with the same flags (only --steps and the save/eval/device "
                             "flags may change)")
    if args.steps < checkpoint[0]:  # A larger --steps continues a finished run, which is allowed.
        raise ValueError(f"--steps: the run in {args.out!r} is already at step {checkpoint[0]}")
    return checkpoint


def check_out(out):
    """A ValueError when --out cannot hold a run (a file in its place, a directory that cannot be
    written). Asked before any model loads: a typo costs a second, not a model load."""
    # The nearest path that exists is --out itself or the directory the run makes --out in, and it
    # must be a directory the run can write in.
    path = os.path.abspath(out)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise ValueError(f"--out: {path!r} is a file, not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"--out: cannot write in {path!r}")


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
    if checkpoints(out):  # A checkpoint-0 of an earlier, stopped start is its run, kept whole.
        return
    for name in ("args.json", "metrics.jsonl", "completions.jsonl", "curve.svg"):
        Path(out, name).unlink(missing_ok=True)
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
    """Everything under `path` on disk, directories included: before a manifest vouches for it (a
    checkpoint, written in place) or it is renamed into place (the final agents)."""
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
        latest = latest_checkpoint(out)
        where = (f"{latest[1]} is the newest complete checkpoint (--resume continues from it)" if latest
                 else "there is no complete checkpoint (--resume starts at step 0)")
        raise SaveFailed(f"could not save {what} ({type(e).__name__}: {e}; {free:.1f} MB left on the disk); "
                         + where) from None


# A checkpoint is made whole by one thing: its CHECKPOINT_STATE, written last, lists every file and its
# size. One without it, or with a file missing or cut short (a kill mid-save, a full disk, a copy cut
# short), is skipped for the one before. Saved and loaded here, side by side.
CHECKPOINT_STATE = "trainer_state.json"  # the step, the run's flags and each file's size (HF's name)
OPTIMIZER_STATE, RNG_STATE = "optimizer.pt", "rng_state.pt"  # beside each agent's weights; the RNGs'
CRITIC_STATE = "critic.pt"  # --advantage critic: the value heads, their optimizer and replay (critic.py)


def save_checkpoint(out, step, agents, args, logs=(), critic=None):
    """OUT/checkpoint-<step>, once the `logs` hold every row before it: per agent its weights (as
    transformers or peft load them) and its optimizer's state, the critic's (if any), the RNG states,
    then CHECKPOINT_STATE. Keeps the newest --save-total-limit complete ones."""
    path = os.path.join(out, f"checkpoint-{step}")
    if checkpoint_problem(path) is None:
        return  # saved already (a signal right after a periodic save)
    with saving(out, f"checkpoint-{step}", path):
        # The logs go first, since a checkpoint of step k must never lack the rows of the steps before k.
        for log in logs:
            log.sync()
        shutil.rmtree(path, ignore_errors=True)  # a broken checkpoint of this step, from before a resume
        # Each agent is also a usable model; its optimizer's state lies beside it (save_final leaves it out).
        for i, agent in enumerate(agents):
            models.save_agent(agent, os.path.join(path, f"agent_{i}"))
            torch.save(agent.optimizer.state_dict(), os.path.join(path, f"agent_{i}", OPTIMIZER_STATE))
        if critic is not None:
            torch.save(critic.state_dict(), os.path.join(path, CRITIC_STATE))
        # A resumed run samples what the uninterrupted one would. Without a GPU, CUDA's list is empty.
        rng = dict(python=random.getstate(), torch=torch.get_rng_state(), cuda=torch.cuda.get_rng_state_all())
        torch.save(rng, os.path.join(path, RNG_STATE))
        # Every file is on disk before the state file vouches for it, so that a power loss cannot leave a
        # state file that lists data still in the page cache.
        fsync_tree(path)
        files = {str(f.relative_to(path)): f.stat().st_size for f in sorted(Path(path).rglob("*"))
                 if f.is_file()}
        # The step is the data's position too, since batch_at derives step k's examples from (seed, k).
        state = {"step": step, "args": vars(args), "files": files}
        write_atomic(os.path.join(path, CHECKPOINT_STATE), json.dumps(state, indent=1))  # JSON, to read too
        fsync_tree(path)
    # Rotation comes only after the new checkpoint is complete, so a full disk never costs the old ones.
    complete = [old for _, old in checkpoints(out) if checkpoint_problem(old) is None]
    # The newest complete ones stay; broken ones go.
    for old in [old for _, old in checkpoints(out) if old not in complete[:args.save_total_limit]]:
        # Its state file goes first: a kill during the delete leaves a checkpoint known to be broken.
        with contextlib.suppress(OSError):
            os.remove(os.path.join(old, CHECKPOINT_STATE))
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path, agents, critic=None):
    """Checkpoint `path` into a run whose agents train.build loaded from its agent_i: each agent's
    optimizer state (AdamW's moments too, so a resumed run steps as the uninterrupted one), the critic's
    heads and optimizer, and the RNGs."""
    # map_location puts each state on its agent's device, which may differ from the saving run's.
    for i, agent in enumerate(agents):
        agent.optimizer.load_state_dict(torch.load(os.path.join(path, f"agent_{i}", OPTIMIZER_STATE),
                                                   map_location=agent.model.device, weights_only=True))
    if critic is not None:
        critic.load_state_dict(torch.load(os.path.join(path, CRITIC_STATE), weights_only=True))
    rng = torch.load(os.path.join(path, RNG_STATE), weights_only=False)  # Python's state is a tuple
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def checkpoint_problem(path):
    """None if checkpoint `path` is complete, else what is wrong."""
    try:
        files = json.loads(Path(path, CHECKPOINT_STATE).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no readable {CHECKPOINT_STATE} ({type(e).__name__})"
    # The state file lists each file with its size, so a file that a kill or a full disk left missing
    # or cut short makes the checkpoint broken, and --resume takes the one before.
    for rel, size in files.items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            return f"{rel} is missing"
        if os.path.getsize(full) != size:
            return f"{rel} is truncated ({os.path.getsize(full)} of {size} bytes)"
    return None


def checkpoints(out):
    """The checkpoint-<step> directories under `out`, newest first, as (step, path)."""
    names = os.listdir(out) if os.path.isdir(out) else []
    return sorted(((int(n[11:]), os.path.join(out, n)) for n in names if n.startswith("checkpoint-")
                   and n[11:].isdigit() and os.path.isdir(os.path.join(out, n))), reverse=True)


def latest_checkpoint(out):
    """(step, path) of the newest complete checkpoint under `out`, or None; a broken one is skipped."""
    for step, path in checkpoints(out):
        problem = checkpoint_problem(path)
        if problem is None:
            return step, path
        # An older complete checkpoint loses some steps and a broken one would lose the run, so we say which.
        warnings.warn(f"skipping {path}: {problem}; trying the one before")
    return None


def save_final(out, step, agents, merged=False):
    """OUT/agent_i, hard links to checkpoint-<step>'s files where it can, then OUT/final.json;
    `merged`: a LoRA agent also as a full model in OUT/agent_i/merged."""
    tmps = [os.path.join(out, f".tmp-agent_{i}") for i in range(len(agents))]
    # final.json is written last and removed first: it says that every OUT/agent_i is whole, which
    # eval.py --agents checks before it trusts them (else it takes the latest checkpoint).
    with saving(out, f"the trained agents in {out}", *tmps):
        Path(out, "final.json").unlink(missing_ok=True)  # an earlier end's, about to be replaced
        for i, (agent, tmp) in enumerate(zip(agents, tmps)):
            dest = os.path.join(out, f"agent_{i}")
            shutil.rmtree(tmp, ignore_errors=True)
            source = os.path.join(out, f"checkpoint-{step}", f"agent_{i}")
            no_optimizer = shutil.ignore_patterns(OPTIMIZER_STATE)  # only a checkpoint needs it
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
        """The handlers the run found, back: a later ^C in a notebook or a test behaves as usual."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

# -----------------------------------------------------------------------------
# Data parallelism: torchrun --nproc-per-node N train.py ... (gloo on the CPU, NCCL on GPUs). Every
# process runs the same loop on its share of each step's prompts (my_share); a MAGRPO step sums the loss
# counts and the gradients with the all_sum that train.py gives it, and the collectives here keep the
# processes in step (gather).

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
    # Any picklable object: a vote on a signal, the rows of a log, a digest of the weights.
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
    """This process's contiguous share of a step's items (N processes sample what one samples, in
    float32; in bfloat16 a row's tokens can change with its batch: docs/scale.md)."""
    # Contiguous shares keep each prompt's seed with it, so sampling does not depend on the split.
    rank, size = world()
    return items[rank * len(items) // size:(rank + 1) * len(items) // size]


def data_parallel():
    """Whether this process is one of torchrun's; alone, every collective here is a no-op."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def all_sum(values):
    """The element-wise sum over the processes of a tensor (in place: a gradient), or of a list of
    numbers -> a list (in float64, so that a count or a sum of losses loses nothing on the way)."""
    t = values if torch.is_tensor(values) else torch.tensor(values, dtype=torch.float64)
    if data_parallel():
        torch.distributed.all_reduce(t)
    return t if torch.is_tensor(values) else t.tolist()
