"""
Train n cooperating agents with MAGRPO (arXiv 2508.04652, Sec. 2; multi-turn: Sec. 3).

    python train.py                     # CPU demo: two tiny random-init agents, offline, ~45 s
    python train.py --num-turns 2       # with a revision turn: feedback on the joint answer, revise
    python train.py --env coding --dataset humaneval --model Qwen/Qwen2.5-Coder-3B --out runs/code
    python train.py --env coding --model Qwen/Qwen2.5-Coder-3B --dtype bfloat16 --lora-r 16  # 1 GPU
    torchrun --nproc-per-node 8 train.py --env coding --model Qwen/Qwen2.5-Coder-3B --lora-r 16 --batch-size 8

Writes OUT/metrics.jsonl (a row per step), OUT/curve.svg, OUT/args.json, OUT/checkpoint-<step>/
(--resume continues from the newest) and OUT/agent_i. Flags are named like TRL's GRPOConfig.
The loop is train(); one MAGRPO step is magrpo.train_step. docs/runs.md, docs/scale.md.
"""
import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib.util
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

# Flags that do not change what a resumed run computes: the rest must match the checkpoint's, since
# a run resumed with another learning rate or G would be neither the old run nor a new one.
RESUMABLE = {"steps", "resume", "out", "device", "micro_batch_size", "save_every", "save_total_limit",
             "eval_every", "eval_split", "eval_limit", "world_size", "save_merged", "log_completions_every",
             "wandb", "cpu_threads"}
FILLED = {"model", "num_agents", "dataset", "split", "termination_threshold", "turn_weights", "lora_alpha"}


def parse_args(argv=None):
    """The flags: the env's, the model's, LoRA's, every Config field's (magrpo.py), and the run's.
    Flags left None are filled by resolve_flags, so a default can depend on the model and the env."""
    # allow_abbrev off: argparse would take a typo such as --num-gen for --num-generations, silently.
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
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
    p.add_argument("--wandb", metavar="PROJECT", help="also log the metrics and the completions to Weights & "
                   "Biases, in this project (pip install wandb; WANDB_MODE=offline writes local files only)")
    return p.parse_args(argv)


def resolve_flags(args):
    """Defaults filled (envs.DEFAULTS), the env built, every flag that needs no model checked
    -> (env, Config). Nothing is loaded or written yet: a bad flag costs a second, not a model load."""
    # The tiny model learns from scratch: its defaults differ from a real model's (envs.DEFAULTS).
    tiny = all(name == models.TINY for name in models.model_names(args))
    if args.test_timeout is None:  # the env needs it: fill it first
        args.test_timeout = envs.run_defaults(tiny, "train")["test_timeout"]
    env = envs.env_from_flags(args)
    envs.fill_defaults(args, envs.run_defaults(tiny, "train", env.authors_config))
    args.cpu_threads = models.cpu_threads(args.cpu_threads, tiny)  # build() sets it
    # fp16 overflows in the backward pass without a loss scaler; bf16 has fp32's range (and master
    # weights keep its small updates: MasterWeightAdamW).
    if args.dtype in ("float16", "fp16"):
        raise ValueError("--dtype: float16 training needs loss scaling, which we skip: use bfloat16")
    # Config checks its own fields, each error naming its flag; args.json then records every setting,
    # so that a run can be read (and resumed) without knowing this version's defaults.
    cfg = magrpo.config_from_flags(args)
    envs.fill_defaults(args, dataclasses.asdict(cfg))
    args.world_size = world()[1]
    # G >= 2: a group needs a baseline (Eq. 1); a step has at least a prompt per process.
    least = dict(num_generations=2, steps=1, batch_size=args.world_size, eval_limit=1, save_total_limit=1,
                 save_every=0, log_completions_every=0)
    for flag, smallest in least.items():
        if getattr(args, flag) < smallest:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= {smallest}, got {getattr(args, flag)}")
    if args.learning_rate <= 0:
        raise ValueError(f"--learning-rate: must be > 0, got {args.learning_rate}")
    if args.wandb and importlib.util.find_spec("wandb") is None:  # optional: never a requirement
        raise ValueError("--wandb: the wandb package is not installed: pip install wandb")
    fill_resolved(args, env, cfg)
    return env, cfg


def fill_resolved(args, env, cfg):
    """The values the run resolved for flags left None, into args: args.json then records them, and
    the run can be read, and repeated, from it. None stays only where a flag is off or its value
    comes from each row or model (--text-field, --lora-target-modules, --feedback-model, --wandb)."""
    takes = envs.constructor_keywords(type(env))  # an env gets only the keywords it takes
    args.model = models.model_names(args)  # ["tiny"], or one name per agent: ["a", "b"]
    args.num_agents = env.num_agents
    if args.dataset is None and (takes is None or "dataset" in takes):
        args.dataset = getattr(env, "dataset", None)  # coding: humaneval; tldr, arxiv: builtin
    # train.py trains on the train split; an env whose constructor takes no split has none to name.
    if args.split is None and (takes is None or "split" in takes):
        args.split = "train"
    if args.termination_threshold is None:  # the env's maximum, as magrpo.rollout_team takes it
        args.termination_threshold = getattr(env, "max_reward", None)
    # Every turn's loss weighs 1 unless --turn-weights says otherwise; written as the flag is given.
    if args.turn_weights is None:
        args.turn_weights = ",".join(["1"] * cfg.num_turns)
    lora = models.lora_from_flags(args)  # (it checks the LoRA flags too, before any model loads)
    if lora is not None:
        args.lora_alpha = lora.alpha


def build(args, env, checkpoint=None, local_rank=0, local_world=1):
    """(agents, expert): the agents of --model or of a checkpoint, on this process's devices; LoRA
    agents on one base share its frozen copy."""
    torch.set_num_threads(args.cpu_threads)  # (for the whole process: torch has one thread pool)
    lora, bases = models.lora_from_flags(args), {}
    # LoRA agents share one frozen base, so with --device auto they all go where the base is.
    n = 1 if lora and args.device == "auto" else env.num_agents
    devices = models.agent_devices(args.device, n, local_rank, local_world) * (env.num_agents // n)
    names = models.per_agent(models.model_names(args), env.num_agents, "--model")
    # A resumed run loads its agents from the checkpoint: the weights it had reached, not --model's.
    if checkpoint is not None:
        names = [os.path.join(checkpoint[1], f"agent_{i}") for i in range(env.num_agents)]
    agents = []
    for i, (name, device) in enumerate(zip(names, devices)):
        agent = models.load_agent(name, device, args.dtype, args.seed + i, chat_template=args.chat_template,
                                  lora=lora, bases=bases, base_seed=args.seed if lora else None)
        agent.optimizer = make_optimizer(agent.model, args.learning_rate, args.weight_decay)
        if checkpoint is not None:  # AdamW's moments too: a resumed run steps as the uninterrupted one
            models.load_optimizer_state(agent, name)
        agents.append(agent)
    return agents, models.load_expert(args, devices[0])


class MasterWeightAdamW:
    """AdamW over fp32 master copies of low-precision (bf16) weights: an update at RL learning rates
    is below bf16's resolution and would round away; the master copy keeps it."""

    def __init__(self, params, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        # AdamW's moments are fp32 too: it steps the masters, never the bf16 weights.
        self.inner = torch.optim.AdamW(self.master, **kwargs)

    @torch.no_grad()
    def step(self):
        # The bf16 gradient goes to the master, AdamW steps the master, and the model's weight is the
        # master rounded to bf16: small updates add up in the master until the rounding shows them.
        for master, p in zip(self.master, self.params):
            master.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for master, p in zip(self.master, self.params):
            p.copy_(master)

    def state_dict(self):  # the masters too: a resumed run must not restart from the rounded weights
        return {"inner": self.inner.state_dict(), "master": [m.detach().clone() for m in self.master]}

    @torch.no_grad()
    def load_state_dict(self, state):
        for master, p, saved in zip(self.master, self.params, state["master"]):
            master.copy_(saved)
            p.copy_(saved)
        self.inner.load_state_dict(state["inner"])


def make_optimizer(model, learning_rate, weight_decay=0.0):
    """Each agent's own AdamW (Sec. 2 step 6) over its trainable parameters; fp32 master weights if
    they are low-precision (bf16)."""
    params = [p for p in model.parameters() if p.requires_grad]  # a LoRA agent: its adapters only
    if all(p.dtype == torch.float32 for p in params):  # (LoRA adapters are fp32 on any base)
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
    return MasterWeightAdamW(params, lr=learning_rate, weight_decay=weight_decay)

# -----------------------------------------------------------------------------
# The run: one loop from the first step to the last, under torchrun on every process


def train(args):
    """A whole run. A bad flag ends it in one line, before anything is written; a signal ends it with
    a checkpoint and exit status 128 + signum; process 0 alone logs and saves."""
    try:
        run = Run(args)
    except ValueError as e:  # every bad input, from any layer: one line, exit 1, nothing written
        sys.exit(f"train.py: error: {e}")
    # The loop: each step samples a batch, runs magrpo.train_step on it, then logs, evaluates and
    # saves as due (Run.step). It stops early on a signal or on a step nothing of which could be scored.
    signals = Signals()
    try:
        for step in run.bar:
            if not run.step(step, signals):
                break
    except Exception:  # a crash (not a signal): one before the first step leaves --out as it was
        if run.main and run.done == 0:
            undo_start(args.out, run.made_out)
        raise
    finally:
        signals.restore()  # a later ^C in the caller (a test, a notebook) behaves as usual again
    return run.finish()


class Run:
    """A run's state: its flags, env, Config, agents and files (process 0 alone writes them), and the
    loop's named parts: step, ready, evaluate, record, save and finish."""

    def __init__(self, args):
        local_rank, local_world = start_processes()
        self.args, self.main = args, world()[0] == 0
        # Every input is checked (flags, --out, the models) before anything is written.
        self.env, self.cfg = resolve_flags(args)
        checkpoint = prepare_out(args)
        self.agents, self.expert = build(args, self.env, checkpoint, local_rank, local_world)
        # The in-training eval's own split: never the training rows (a plain file has none: refused).
        self.eval_env = None
        if args.eval_every:
            self.eval_env = envs.env_from_flags(args, split=args.eval_split, flag="--eval-split")
        # start: the first step to run; done: the steps whose update the weights hold (what a
        # checkpoint records, and what finish() saves after a signal).
        self.start = self.done = 0 if checkpoint is None else checkpoint[0]
        gather(None)  # every process has read --out (prepare_out) before process 0 writes into it
        self.made_out = self.main and start_out(args, self.start)  # (whether --out is ours: undo_start)
        self.tracker = None  # Weights & Biases (--wandb), on process 0
        if self.main and args.wandb:
            import wandb
            name = os.path.basename(os.path.abspath(args.out))
            self.tracker = wandb.init(project=args.wandb, name=name, dir=args.out, config=vars(args))
        # The sampler draws from its own hashed seeds; torch's and Python's RNGs serve the rest (a
        # custom env, dropout in a custom model), and a resumed run restores them.
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        if checkpoint is not None:
            print(f"resuming {args.out} at step {self.start} from {checkpoint[1]}", file=sys.stderr)
            models.restore_rng(checkpoint[1])
        self.log, self.curve, self.completions = (RunFile(os.path.join(args.out, name)) for name in
                                                  ("metrics.jsonl", "curve.svg", "completions.jsonl"))
        self.logs = (self.log, self.completions)  # what a checkpoint writes out first
        # The curve is drawn from every row so far: a resumed run's too (start_out kept those before
        # the checkpoint's step).
        self.history = []
        if self.main and self.log.size:
            with open(self.log.path) as f:
                self.history = [json.loads(line) for line in f]
        # scored: the step's reward metrics (ready() sets them); signum, error: why the run stops early.
        self.recent, self.scored, self.signum, self.error = [], None, None, None
        self.bar = tqdm(range(self.start, args.steps), desc=f"magrpo {self.env.name}", dynamic_ncols=True,
                        initial=self.start, total=args.steps, disable=not self.main)

    def step(self, step, signals):
        """One step: magrpo.train_step on the step's batch, then its metrics, completions, the eval
        and a checkpoint when due. -> False when the run stops here."""
        args = self.args
        # The step's batch and a seed per example, from (seed, step) alone: a resumed or a torchrun
        # run draws and samples exactly what one uninterrupted process would.
        indices = my_share(batch_at(len(self.env.examples), args.seed, step, args.batch_size))
        seeds = my_share([magrpo.mix_seed(args.seed, step, j) for j in range(args.batch_size)])
        batch = [self.env.examples[i] for i in indices]
        t0 = time.time()
        # A signal while the step samples drops it (Stop); the weights are untouched, so the
        # checkpoint finish() saves is the state before this step, which --resume then runs again.
        turns = update = None
        with contextlib.suppress(Stop), signals.abandon_on_signal():
            turns, update = magrpo.train_step(self.agents, self.env, batch, self.cfg, seeds, self.expert,
                                              before_update=functools.partial(self.ready, step, signals))
        # A signal while this process sampled: its turns are gone, and the others hear of it in ready().
        if turns is None:
            self.agree(signals, abandoned=True)
        if update is None:  # that, or ready() said stop: a signal, or a step nothing of which could be scored
            return False
        if step == self.start and self.main and not args.chat_template:
            note_raw_prompts(self.agents, turns, self.cfg.max_new_tokens)
        # The row of metrics.jsonl: the rewards (ready), the update's losses and gradient norms, the time.
        metrics = {**self.scored, **update, "seconds": round(time.time() - t0, 4)}
        self.log_completions(step, indices, turns)
        self.done, last = step + 1, step == args.steps - 1
        if self.eval_env is not None and (step % args.eval_every == 0 or last):
            self.evaluate(step, metrics)
        # A signal during the update waited for it: now every process learns of it and stops here.
        self.agree(signals, abandoned=False)
        # A periodic checkpoint; the last step's is finish()'s, which also writes the final agents.
        due = args.save_every and self.done % args.save_every == 0
        if due:  # (on every process: it is a collective)
            check_ranks_agree(self.agents)
        if self.main:
            self.record(step, metrics, turns, last, save=due and not last)  # the last: finish() saves
        return self.signum is None

    def ready(self, step, signals, turns):
        """train_step's last check before the update, on every process: the processes agree to go on
        (a signal stops them all here, no agent holding half an update), and the step has answers that
        could be scored (if none could, the sandbox or the env is broken, not the agents)."""
        signals.abandonable = False  # the sampling is over: from here a signal waits for the step's end
        if not self.agree(signals, abandoned=False):  # a signal stopped a process's sampling: all stop
            return False
        nodes = []  # every process's nodes: the metrics and the check below are the same everywhere
        for process_nodes in gather(evaluation.episode_summary(turns)):
            nodes += process_nodes
        self.scored = {"step": step, **evaluation.episode_metrics(nodes, self.cfg.num_turns)}
        sandbox, scoring = self.scored["sandbox_errors"], self.scored["score_errors"]
        bad, total = sandbox + scoring, len(nodes)
        why = f"({sandbox} sandbox failures, {scoring} scoring errors)"  # the usual culprits, named
        if bad == total:  # the same on every process: every process's nodes are counted
            self.error = (f"train.py: error: step {step}: none of the {total} joint answers could be "
                          f"scored {why}")
            return False
        if bad:
            tqdm.write(f"warning: step {step}: {bad} of {total} joint answers could not be scored and count "
                       f"as 0 {why}", file=sys.stderr)
        return True

    def agree(self, signals, abandoned):
        """The processes stop together or not at all: each tells whether a signal came and whether
        it abandoned its sampling. -> True when no process abandoned its step."""
        # A collective that every process enters once per step, whatever happened to it: the step's
        # other collectives (the gradients' sums) then never wait for a process that left.
        votes = gather((signals.received, abandoned))
        self.signum = next((signum for signum, _ in votes if signum is not None), None)
        return not any(gave_up for _, gave_up in votes)

    def log_completions(self, step, indices, turns):
        """OUT/completions.jsonl: every process's joint actions of the step, written once, by process 0."""
        every = self.args.log_completions_every
        if not every or step % every:  # (a long run's every step and joint action is a large file)
            return
        rows = []
        for process_rows in gather(completion_rows(step, indices, turns)):
            rows += process_rows
        if self.main:
            self.completions.append("".join(json.dumps(row) + "\n" for row in rows))
        if self.tracker is not None:  # the same rows as a table; lists and dicts as JSON text
            import wandb
            table = wandb.Table(columns=list(rows[0]))
            for row in rows:
                table.add_data(*[json.dumps(v) if isinstance(v, (list, dict)) else v for v in row.values()])
            self.tracker.log({"completions": table}, step=step)

    def evaluate(self, step, metrics):
        """The in-training eval: the greedy joint reward per turn on --eval-limit examples of
        --eval-split. Each process scores its share, so none waits long in a collective for another."""
        # Sums and a count, added over the processes: the mean is the one a single process computes.
        examples = my_share(self.eval_env.examples[:self.args.eval_limit])
        sums = evaluation.team_reward_sums(self.agents, self.eval_env, examples, self.cfg, self.expert)
        counted = magrpo.all_sum(sums + [len(examples)])  # every process's sums, and its example count
        rewards = [total / counted[-1] for total in counted[:-1]]
        metrics["eval_reward_mean"] = rewards[0]  # turn 1's, the single-turn number; each turn's below
        metrics.update({f"eval_reward_mean_turn{t}": reward for t, reward in enumerate(rewards, 1)})
        if self.main:
            tqdm.write(f"step {step:5d} eval reward {' -> '.join(f'{r:.3f}' for r in rewards)} "
                       f"({self.eval_env.name}, {self.args.eval_split})")

    def record(self, step, metrics, turns, last, save):
        """Process 0: the step's row of metrics.jsonl, the curve every 10 steps, a checkpoint when
        `save`, the progress bar, and now and then a line with the first joint answer."""
        self.log.append(json.dumps(metrics) + "\n")
        self.history.append(metrics)
        if self.tracker is not None:  # the row's numbers; W&B draws their curves (None: a turn not reached)
            numbers = {key: value for key, value in metrics.items() if value is not None and key != "step"}
            self.tracker.log(numbers, step=step)
        # The curve is redrawn every 10 steps, not every step: a long run's SVG is a few hundred kB.
        if step % 10 == 9 or last or self.signum is not None:
            self.curve.write(write_atomic, self.curve.path, evaluation.curve_svg(self.history))
        if save:
            try:
                save_checkpoint(self.args.out, self.done, self.agents, self.args, self.logs)
            except SaveFailed as e:  # a full disk: the run goes on, and the next save tries again
                warnings.warn(f"{e}; the run goes on")
        # The bar shows the mean reward of the last 20 steps (a step's own reward is noisy), at the
        # last turn when the step's groups reached it: what the team finally answers.
        shown = metrics[f"reward_mean_turn{self.cfg.num_turns}"]
        self.recent = (self.recent + [metrics["reward_mean"] if shown is None else shown])[-20:]
        self.bar.set_postfix(reward=f"{sum(self.recent) / len(self.recent):.3f}",
                             zero_adv=metrics["zero_adv_groups"])
        if step % max(1, self.args.steps // 10) == 0 or last:  # ten times a run: what the agents write
            rewards = [metrics[f"reward_mean_turn{t}"] or 0 for t in range(1, self.cfg.num_turns + 1)]
            samples = " | ".join(repr(text[:60]) for text in turns[-1].outputs[0])
            tqdm.write(f"step {step:5d} reward {' -> '.join(f'{r:.3f}' for r in rewards)} | {samples}")

    def finish(self):
        """The run's end: a checkpoint, and unless a signal or an error stopped it, the final agents
        (OUT/agent_i). A stopped run exits with 128 + the signal, or its error."""
        check_ranks_agree(self.agents)
        # Always a checkpoint, even after a signal or an error: --resume continues from it. The final
        # agents only for a run that reached its last step.
        try:
            if self.main:
                save_checkpoint(self.args.out, self.done, self.agents, self.args, self.logs)
                if self.signum is None and self.error is None:
                    save_final(self.args.out, self.done, self.agents, merged=self.args.save_merged)
                    out = self.args.out
                    print(f"wrote {self.log.path} and {len(self.agents)} agents under {out}/agent_*")
        except SaveFailed as e:
            print(f"train.py: error: {e}", file=sys.stderr)  # one line: what failed, how to resume
            self.error = self.error or 1
        if self.tracker is not None:
            status = 128 + self.signum if self.signum is not None else int(bool(self.error))
            self.tracker.finish(exit_code=status)
        gather(None)  # torchrun stops every process when one exits: not before process 0 has saved
        if self.signum is not None:
            sys.exit(128 + self.signum)
        if self.error:
            sys.exit(self.error)
        return self.log.path


def note_raw_prompts(agents, turns, max_new_tokens):
    """An instruct model ends its turn with a chat-turn token (<|im_end|>) that raw prompts rarely
    lead to: its completions then run to the cap. Said once, after the first step, where it shows."""
    for i, agent in enumerate(agents):
        lengths = magrpo.completion_lengths(turns, i)
        capped = int((lengths >= max_new_tokens).sum())
        if agent.tokenizer.chat_template is not None and capped >= 0.9 * len(lengths):
            tqdm.write(f"note: {capped} of agent {i}'s {len(lengths)} completions ran to --max-new-tokens; "
                       "its tokenizer has a chat template: an instruct model may stop only at its "
                       "end-of-turn token, which raw prompts rarely reach (try --chat-template)",
                       file=sys.stderr)


def batch_at(n, seed, step, batch_size):  # (the data's position in the run is the step itself)
    """A step's examples, indices among n: shuffled epochs, each epoch's order from (seed, epoch) alone,
    so that a resumed run draws what the uninterrupted one would."""
    indices = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch_order = random.Random(magrpo.mix_seed(seed, position // n)).sample(range(n), n)
        indices.append(epoch_order[position % n])
    return indices


def completion_rows(step, indices, turns):
    """OUT/completions.jsonl's rows: each joint action of the step, its reward, each agent's advantage.
    The file to read when a curve puzzles: what the agents wrote and what Eq. 2 made of it."""
    rows = []
    for t, turn in enumerate(turns, 1):
        for node, (outputs, reward) in enumerate(zip(turn.outputs, turn.rewards)):
            group, action = turn.place(node)
            # Each agent's completion in this joint action (its g) and the advantage that row got.
            advantages = [agent_advantages[turn.row(group, g)].item()
                          for agent_advantages, g in zip(turn.advantages, turn.joint[action])]
            rows.append({"step": step, "example": indices[turn.groups[group].example], "turn": t,
                         "completions": list(outputs), "reward": float(reward),
                         "levels": getattr(reward, "levels", None) or None, "advantages": advantages})
    return rows

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
    # --resume: what a kill left half done goes, then the newest complete checkpoint is the start.
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
    if args.steps < checkpoint[0]:  # (a larger --steps continues a finished run: allowed)
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
        # Rows of steps at or after the checkpoint's would be logged twice: the resumed run redoes them.
        for name in ("metrics.jsonl", "completions.jsonl"):
            cut_metrics(os.path.join(args.out, name), start)
        write_atomic(os.path.join(args.out, "args.json"), json.dumps(vars(args), indent=1))
    except OSError as e:
        raise ValueError(f"--out: cannot write in {args.out!r} ({e})") from None
    return made


def undo_start(out, made):
    """A run that failed before its first step leaves --out as it found it: the files of a start go
    (a run that never stepped is no work to keep), and --out too if this run made it."""
    if models.checkpoints(out):  # (a checkpoint-0 of an earlier, stopped start: its run, kept whole)
        return
    for name in ("args.json", "metrics.jsonl", "completions.jsonl", "curve.svg"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, name))
    if made:
        with contextlib.suppress(OSError):  # (not empty: another program's files, e.g. W&B's, stay)
            os.rmdir(out)


def write_atomic(path, text):
    """`text` as the file `path`, whole or not at all: written aside, fsync'd, renamed into place."""
    # A rename is atomic: a reader (or a resume after a kill) sees the old file or the new one.
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
        free = shutil.disk_usage(out).free / 2**20  # before the partial copies go: what the save left
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
    tmp = os.path.join(out, f".tmp-checkpoint-{step}")  # a hidden name: never taken for a checkpoint
    if os.path.isdir(final) and models.checkpoint_problem(final) is None:
        return  # saved already (a signal right after a periodic save)
    with saving(out, f"checkpoint-{step}", tmp):
        # The logs first: a checkpoint of step k must never lack the rows of the steps before k.
        for log in logs:
            log.sync()
        shutil.rmtree(tmp, ignore_errors=True)
        # The data position is the step: batch_at derives step k's examples from (seed, k) alone.
        models.write_checkpoint(tmp, agents, {"step": step, "data_position": step * args.batch_size,
                                              "args": vars(args)})
        # On disk before the rename, and the rename on disk after it: after a power loss the name
        # checkpoint-<step> never points at data that was still in the page cache.
        fsync_tree(tmp)
        if os.path.exists(final):  # a broken checkpoint of this step, from before a resume
            os.rename(final, os.path.join(out, f".trash-checkpoint-{step}"))
        os.rename(tmp, final)
        fsync_tree(out)
    # Rotation comes only after the new checkpoint is complete: a full disk never costs the old ones.
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
        # The length of what is written whole: a write the disk cut short is truncated back to it.
        self.size = os.path.getsize(path) if os.path.exists(path) else 0

    def write(self, writer, *args):
        try:
            writer(*args)
        except OSError as e:
            if not self.warned:
                warnings.warn(f"could not write {self.path} ({e}); the run goes on (docs/runs.md)")
            self.warned = True

    def append(self, line):
        # Not fsync'd: a row per step need not cost a disk flush; a checkpoint syncs the log first.
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
        # Python runs a handler between two bytecodes of the main thread: raising Stop here ends the
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
# process runs the same loop on its share of each step's prompts (my_share); magrpo.update_agent sums
# the gradients, and the collectives here keep the processes in step (gather).

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
    if magrpo.data_parallel():
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
    if magrpo.data_parallel():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def my_share(items):
    """This process's contiguous share of a step's items (N processes sample what one samples)."""
    # Contiguous shares keep each prompt's seed with it: sampling does not depend on the split.
    rank, size = world()
    return items[rank * len(items) // size:(rank + 1) * len(items) // size]


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
