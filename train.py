"""
Train n cooperating agents with MAGRPO (arXiv 2508.04652, Sec. 2; multi-turn: Sec. 3).

    python train.py                     # CPU demo: two tiny random-init agents, offline, ~45 s
    python train.py --num-turns 2       # with a revision turn: feedback on the joint answer, revise
    python train.py --env coding --dataset humaneval --model Qwen/Qwen2.5-Coder-3B --out runs/code
    python train.py --env coding --model Qwen/Qwen2.5-Coder-3B --dtype bfloat16 --lora-r 16  # 1 GPU
    torchrun --nproc-per-node 8 train.py --env coding --model Qwen/Qwen2.5-Coder-3B --lora-r 16 --batch-size 8

Writes OUT/metrics.jsonl (a row per step), OUT/curve.svg, OUT/args.json, OUT/checkpoint-<step>/
(--resume continues from the newest) and OUT/agent_i. The loop is train(), right below; one MAGRPO
step is magrpo.single_turn_step (Sec. 2), or magrpo.train_step on Sec. 3's tree; what keeps a run
safe (checkpoints, signals, torchrun) is runs.py. The flags that TRL's GRPOConfig also has keep its
names: --num-generations, --temperature, --top-p, --top-k, --learning-rate, --weight-decay,
--loss-type (ours and TRL's values), --scale-rewards, --mask-truncated-completions, --max-grad-norm,
--seed and --save-total-limit. docs/flags.md lists them all, and TRL's fields beside ours;
docs/runs.md, docs/scale.md.
"""
import contextlib
import dataclasses
import importlib.util
import json
import os
import random
import sys
import time
import warnings

import torch
from tqdm import tqdm

import critic
import envs
import eval as evaluation
import magrpo
import models
import runs
from sampler import compiled_graphs, mix_seed


def train(args):
    """A whole run: every input checked before anything is written, then the step loop. A signal ends
    it with a checkpoint and exit status 128 + the signal; process 0 alone logs and saves."""
    try:
        run = Run(args)
    except ValueError as e:  # Every bad input, from any layer, is one line and exit status 1.
        sys.exit(f"train.py: error: {e}")
    run.signals = runs.Signals()  # until the run's end (restore, below)
    try:
        for step in run.bar:  # range(run.start, args.steps), with a progress bar
            # The step's batch and a seed per example come from (seed, step) alone, so a resumed run
            # draws and samples exactly what the uninterrupted one would.
            indices = runs.my_share(batch_at(len(run.env.examples), args.seed, step, args.batch_size))
            seeds = runs.my_share([mix_seed(args.seed, step, j) for j in range(args.batch_size)])
            batch = [run.env.examples[i] for i in indices]
            t0 = time.time()
            # A signal while the step samples drops the step (Stop). The weights are untouched, so the
            # checkpoint that finish() saves is the state before it, and --resume runs it again.
            run.step, turns, update = step, None, None
            with contextlib.suppress(runs.Stop), run.signals.abandon_on_signal():
                turns, update = single_turn_or_tree_step(run, batch, seeds)
            if turns is None:  # This process's sampling was dropped, and the others hear of it here.
                run.agree(abandoned=True)
            if update is None:  # A signal, or a step none of whose answers could be scored.
                break
            if step == run.start and run.main and not args.chat_template:
                note_raw_prompts(run.agents, turns, run.cfg.max_new_tokens)
            metrics = step_metrics(step, turns, update, run.cfg.num_turns, len(run.agents))
            metrics["seconds"] = round(time.time() - t0, 4)
            run.log_completions(step, indices, turns)
            run.done, last = step + 1, step == args.steps - 1
            if run.eval_env is not None and (step % args.eval_every == 0 or last):
                run.evaluate(step, metrics)
            # A signal during the update waited for it to end; now every process hears of it.
            run.agree(abandoned=False)
            # A periodic checkpoint. The last step's is finish()'s, which also writes the final agents.
            save = args.save_every and run.done % args.save_every == 0 and not last
            if save:
                runs.check_ranks_agree(run.agents)  # This is a collective, so every process runs it.
            if run.main:
                run.record(step, metrics, turns, last, save)
            if run.signum is not None:
                break
    except Exception:  # A crash, not a signal: one before the first step leaves --out as it was.
        if run.main and run.done == 0:
            runs.undo_start(args.out, run.made_out)
        raise
    finally:
        run.signals.restore()  # A later ^C in the caller (a test, a notebook) behaves as usual again.
    return run.finish()

# -----------------------------------------------------------------------------
# What the loop calls: the run (its state, files and step gate), the MAGRPO step, the step's data and metrics


class Run:
    """A run's state: its flags, env, Config, agents, expert and files (process 0 alone writes them),
    the step it starts at and the steps its weights hold (done), and why it stopped early (signum,
    error). Its methods gate a step's update (may_update, where torchrun's processes agree), log,
    evaluate, record and finish."""

    def __init__(self, args):
        local_rank, local_world = runs.start_processes()
        self.args, self.main = args, runs.world()[0] == 0
        # Every input is checked (flags, --out, the models) before anything is written.
        self.env, self.cfg = resolve_flags(args)
        checkpoint = runs.prepare_out(args)
        self.agents = build(args, self.env, checkpoint, local_rank, local_world)
        self.expert = models.load_expert(args, str(self.agents[0].model.device))  # --feedback expert's
        self.critic = None  # the learned V(s) of --advantage critic (critic.py)
        if self.cfg.advantage == "critic":
            # The critic reads the agents as they began, so a resumed run's (the checkpoint's) are loaded
            # again from --model for it; a LoRA team's frozen base is that already.
            reread = checkpoint is not None and not models.is_lora(self.agents[0].model)
            start = build(args, self.env, None, local_rank, local_world, optimize=False) if reread else None
            self.critic = critic.Critic(self.agents, args.critic, args.critic_learning_rate, start)
        # The in-training eval has its own split, never the training rows (a plain file has none).
        self.eval_env = (runs.env_from_flags(args, split=args.eval_split, flag="--eval-split")
                         if args.eval_every else None)
        # start is the first step to run, and done counts the steps whose update the weights hold (what a
        # checkpoint records, and what finish() saves after a signal).
        self.start = self.done = 0 if checkpoint is None else checkpoint[0]
        runs.gather(None)  # every process has read --out (prepare_out) before process 0 writes into it
        self.made_out = self.main and runs.start_out(args, self.start)  # whether --out is ours (undo_start)
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
            runs.load_checkpoint(checkpoint[1], self.agents, self.critic)
        self.log, self.curve, self.completions = (runs.RunFile(os.path.join(args.out, name)) for name in
                                                  ("metrics.jsonl", "curve.svg", "completions.jsonl"))
        self.logs = (self.log, self.completions)  # what a checkpoint writes out first
        # The curve is drawn from every row so far, a resumed run's too (start_out kept those before
        # the checkpoint's step).
        self.history = []
        if self.main and self.log.size:
            with open(self.log.path) as f:
                self.history = [json.loads(line) for line in f]
        # recent holds the last rewards the progress bar averages; signum and error say why a run stopped;
        # step is the one running (for the messages), and signals are train()'s handlers (runs.Signals).
        self.recent, self.signum, self.error, self.step, self.signals = [], None, None, None, None
        if self.main and len(self.agents) > 1:  # which path the steps take (docs/scale.md)
            way = "in one batch (LoRA adapters of one base)" if isinstance(self.agents, models.Team) else \
                "one at a time (no LoRA base shared by all)"
            print(f"team: {len(self.agents)} agents sample and learn {way}", file=sys.stderr)
        self.bar = tqdm(range(self.start, args.steps), desc=f"magrpo {self.env.name}", dynamic_ncols=True,
                        initial=self.start, total=args.steps, disable=not self.main)

    def may_update(self, rewards):
        """The word between a step's sampling and its update, the MAGRPO step's last check, on every
        process: the processes agree to go on (a signal stops them all here, no agent holding half an
        update), and the step has answers that could be scored (if none could, the sandbox or the env is
        broken, not the agents, and the run stops)."""
        self.signals.abandonable = False  # The sampling is over, and a signal now waits for the step's end.
        if not self.agree(abandoned=False):  # A signal stopped some process's sampling, so all stop.
            return False
        # Every process's rewards are counted, so that every process decides the same.
        sandbox = sum(getattr(reward, "sandbox_error", None) is not None for reward in rewards)
        scoring = sum(isinstance(reward, magrpo.ScoreError) for reward in rewards)
        sandbox, scoring, total = (int(n) for n in runs.all_sum([sandbox, scoring, len(rewards)]))
        bad, why = sandbox + scoring, f"({sandbox} sandbox failures, {scoring} scoring errors)"
        if bad == total:
            self.error = (f"train.py: error: step {self.step}: none of the {total} joint answers "
                          f"could be scored {why}")
            return False
        if bad:
            tqdm.write(f"warning: step {self.step}: {bad} of {total} joint answers could not be scored "
                       f"{why}: no verdict, so no gradient and no part in their group's baseline",
                       file=sys.stderr)
        return True

    def agree(self, abandoned):
        """The processes stop together or not at all: each tells whether a signal came and whether
        it abandoned its sampling. -> True when no process abandoned its step."""
        # Every process enters this collective once per step, whatever happened to it, so the step's
        # other collectives (the gradients' sums) never wait for a process that left.
        votes = runs.gather((self.signals.received, abandoned))
        self.signum = next((signum for signum, _ in votes if signum is not None), None)
        return not any(gave_up for _, gave_up in votes)

    def log_completions(self, step, indices, turns):
        """OUT/completions.jsonl: every process's joint actions of the step, written once, by process 0."""
        if not self.args.log_completions_every or step % self.args.log_completions_every:
            return  # (a long run's every step and joint action is a large file)
        rows = [row for share in runs.gather(completion_rows(step, indices, turns)) for row in share]
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
        # Sums and a count are added over the processes, so the mean is the one a single process computes.
        examples = runs.my_share(self.eval_env.examples[:self.args.eval_limit])
        sums, judged = evaluation.team_reward_sums(self.agents, self.eval_env, examples, self.cfg,
                                                   self.expert)
        counted = runs.all_sum(sums + judged)  # every process's sums, then its counts of answers judged
        rewards = [total / count if count else None for total, count in zip(counted, counted[len(sums):])]
        metrics["eval_reward_mean"] = rewards[0]  # turn 1's, the single-turn number; each turn's below
        metrics.update({f"eval_reward_mean_turn{t}": reward for t, reward in enumerate(rewards, 1)})
        if self.main:
            shown = " -> ".join("no verdict" if r is None else f"{r:.3f}" for r in rewards)
            tqdm.write(f"step {step:5d} eval reward {shown} ({self.eval_env.name}, {self.args.eval_split})")

    def record(self, step, metrics, turns, last, save):
        """Process 0: the step's row of metrics.jsonl, the curve every 10 steps, a checkpoint when
        `save`, the progress bar, and now and then a line with the first joint answer."""
        self.log.append(json.dumps(metrics) + "\n")
        self.history.append(metrics)
        if self.tracker is not None:  # W&B draws the numbers' curves; None is a turn not reached.
            self.tracker.log({k: v for k, v in metrics.items() if v is not None and k != "step"}, step=step)
        # The curve is redrawn every 10 steps, not every step, since a long run's SVG is a few hundred kB.
        if step % 10 == 9 or last or self.signum is not None:
            curve = evaluation.curve_svg(self.history, max_reward=self.env.max_reward)
            self.curve.write(runs.write_atomic, self.curve.path, curve)
        if save:
            try:
                runs.save_checkpoint(self.args.out, self.done, self.agents, self.args, self.logs, self.critic)
            except runs.SaveFailed as e:  # On a full disk the run goes on, and the next save tries again.
                warnings.warn(f"{e}; the run goes on")
        # The bar shows the mean reward of the last 20 steps (a step's own reward is noisy), at the
        # last turn when the step's groups reached it, which is what the team finally answers.
        shown = metrics[f"reward_mean_turn{self.cfg.num_turns}"]
        self.recent = (self.recent + [metrics["reward_mean"] if shown is None else shown])[-20:]
        self.bar.set_postfix(reward=f"{sum(self.recent) / len(self.recent):.3f}",
                             zero_adv=metrics["zero_adv_groups"])
        if step % max(1, self.args.steps // 10) == 0 or last:  # Ten times a run, what the agents write.
            rewards = [metrics[f"reward_mean_turn{t}"] or 0 for t in range(1, self.cfg.num_turns + 1)]
            samples = " | ".join(repr(text[:60]) for text in turns[-1].outputs[0])
            tqdm.write(f"step {step:5d} reward {' -> '.join(f'{r:.3f}' for r in rewards)} | {samples}")

    def finish(self):
        """The run's end: a checkpoint, and unless a signal or an error stopped it, the final agents
        (OUT/agent_i). A stopped run exits with 128 + the signal, or its error."""
        runs.check_ranks_agree(self.agents)
        # Always a checkpoint, even after a signal or an error, so that --resume continues. The final
        # agents only for a run that reached its last step.
        try:
            if self.main:
                runs.save_checkpoint(self.args.out, self.done, self.agents, self.args, self.logs, self.critic)
                if self.signum is None and self.error is None:
                    runs.save_final(self.args.out, self.done, self.agents, merged=self.args.save_merged)
                    out, logged = self.args.out, "curve.svg (the learning curve), metrics.jsonl"
                    if self.args.log_completions_every:
                        logged += ", completions.jsonl (what the agents wrote)"
                    print(f"wrote {out}/: {logged} and the {len(self.agents)} agents, agent_*")
                if self.cfg.compile:  # Each new shape of the decode step is a compile of its own.
                    print(f"--compile: torch.compile made {compiled_graphs()} graphs in this run")
        except runs.SaveFailed as e:
            print(f"train.py: error: {e}", file=sys.stderr)  # One line says what failed and how to resume.
            self.error = self.error or 1
        if self.tracker is not None:
            status = 128 + self.signum if self.signum is not None else int(bool(self.error))
            self.tracker.finish(exit_code=status)
        runs.gather(None)  # torchrun stops every process when one exits, so wait for process 0's save.
        if self.signum is not None:
            sys.exit(128 + self.signum)
        if self.error:
            sys.exit(self.error)
        return self.log.path


def single_turn_or_tree_step(run, batch, seeds):
    """One MAGRPO step -> (turns, metrics): magrpo.single_turn_step, Sec. 2 top to bottom, for one turn
    of aligned joint actions (its results as the tree's one Turn, for the logs); magrpo.train_step, Sec.
    3's tree on the same functions, for the settings it leaves to the tree (Config.on_the_tree: turns,
    cross, ReMax, ...). Both sum over torchrun's processes with runs.all_sum and ask run.may_update."""
    if run.cfg.on_the_tree() or isinstance(run.agents, models.Team):  # (a Team samples in one batch there)
        return magrpo.train_step(run.agents, run.env, batch, run.cfg, seeds, run.expert, runs.all_sum,
                                 run.may_update, run.critic)
    rollouts, rewards, advantages, update = magrpo.single_turn_step(run.agents, run.env, batch, run.cfg,
                                                                    seeds, runs.all_sum, run.may_update)
    return [magrpo.turn_of_step(run.env, batch, run.cfg, seeds, rollouts, rewards, advantages)], update


def step_metrics(step, turns, update, num_turns, num_agents):
    """The step's row of metrics.jsonl, the same on every process: the reward metrics of every process's
    nodes (eval.episode_metrics), the update's, and each agent's mean completion length in tokens, EOS
    included, over every process's rows."""
    nodes = [node for share in runs.gather(evaluation.episode_summary(turns)) for node in share]
    metrics = {"step": step, **evaluation.episode_metrics(nodes, num_turns), **update}
    for i in range(num_agents):
        lengths = completion_lengths(turns, i).float()
        total, count = runs.all_sum([lengths.sum().item(), len(lengths)])
        metrics[f"completion_len_{i}"] = total / count
    return metrics


def completion_lengths(turns, i):
    """Agent i's completion lengths in tokens (EOS included), every turn's rows of this process."""
    return torch.cat([turn.rollouts[i].completion_mask.sum(-1).cpu() for turn in turns])


def note_raw_prompts(agents, turns, max_new_tokens):
    """An instruct model ends its turn with a chat-turn token (<|im_end|>) that raw prompts rarely
    lead to: its completions then run to the cap. Said once, after the first step, where it shows."""
    for i, agent in enumerate(agents):
        lengths = completion_lengths(turns, i)
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
        epoch_order = random.Random(mix_seed(seed, position // n)).sample(range(n), n)
        indices.append(epoch_order[position % n])
    return indices


def completion_rows(step, indices, turns):
    """OUT/completions.jsonl's rows: each joint action of the step, its reward, each agent's advantage.
    The file to read when a curve puzzles: what the agents wrote and what Eq. 2 made of it."""
    rows = []
    for t, turn in enumerate(turns, 1):
        for node, (outputs, reward) in enumerate(zip(turn.outputs, turn.rewards)):
            group, action = turn.group_action(node)
            # Each agent's completion in this joint action (its g) and the advantage that row got.
            advantages = [agent_advantages[group * turn.size + g].item()
                          for agent_advantages, g in zip(turn.advantages, turn.joint[action])]
            rows.append({"step": step, "example": indices[turn.groups[group].example], "turn": t,
                         "completions": list(outputs), "reward": evaluation.finite(float(reward)),
                         "levels": getattr(reward, "levels", None) or None, "advantages": advantages})
    return rows


# -----------------------------------------------------------------------------
# The flags, checked before anything is loaded or written; the agents they name


def parse_args(argv=None):
    """The flags: the env's, the model's, LoRA's, every Config field's (magrpo.py), and the run's.
    Flags left None are filled by resolve_flags, so a default can depend on the model and the env."""
    p = runs.flag_parser(__doc__)
    models.add_lora_flags(p)
    runs.add_config_flags(p)
    p.add_argument("--learning-rate", type=float, help="each agent's AdamW")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--critic", default="central", choices=("central", "per-agent"),
                   help="--advantage critic: one V(s) of all the prompts, or each agent's V_i of its own")
    p.add_argument("--critic-learning-rate", type=float, default=1e-3, help="the critic's Adam (critic.py)")
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
    runs.show_defaults(p, "train", {name: env.settings for name, env in envs.ENVS.items()})
    return p.parse_args(argv)


def resolve_flags(args):
    """The env built, the defaults filled (runs.run_defaults), every flag that needs no model checked, and
    what the run resolved for flags left None recorded in args -> (env, Config). Nothing is loaded or
    written yet: a bad flag costs a second, not a model load."""
    # The tiny model learns from scratch, so its defaults differ from a real model's.
    tiny = all(name == models.TINY for name in models.model_names(args))
    env = runs.env_from_flags(args)
    if env.runs_code:  # The isolation model code has (--sandbox, resolved), which args.json records.
        print(f"sandbox: model code runs at the {env.isolation} level (docs/sandbox.md)", file=sys.stderr)
    runs.fill_defaults(args, runs.run_defaults("train", tiny, env.settings))
    args.cpu_threads = models.cpu_threads(args.cpu_threads, tiny)  # build() sets it
    # fp16 overflows in the backward pass without a loss scaler; bf16 has fp32's range (and master
    # weights keep its small updates: MasterWeightAdamW).
    if args.dtype in ("float16", "fp16"):
        raise ValueError("--dtype: float16 training needs loss scaling, which we skip: use bfloat16")
    # Config checks its own fields, each error naming its flag; args.json then records every setting,
    # so that a run can be read (and resumed) without knowing this version's defaults.
    cfg = runs.config_from_flags(args)
    runs.fill_defaults(args, dataclasses.asdict(cfg))
    args.world_size = runs.world()[1]
    if cfg.scale_rewards == "batch" and args.world_size > 1:  # Each process holds only its share of them.
        raise ValueError("--scale-rewards: batch needs the whole step's rewards in one process, "
                         "not torchrun's")
    # A group needs G >= 2 for its baseline (Eq. 1), a critic does not, and a step needs a prompt per process.
    least = dict(num_generations=1 if cfg.advantage == "critic" else 2, steps=1, batch_size=args.world_size,
                 eval_limit=1, save_total_limit=1, save_every=0, log_completions_every=0)
    for flag, smallest in least.items():
        if getattr(args, flag) < smallest:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= {smallest}, got {getattr(args, flag)}")
    for flag in ("learning_rate", "critic_learning_rate"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')}: must be > 0, got {getattr(args, flag)}")
    if args.wandb and importlib.util.find_spec("wandb") is None:  # wandb is optional, never required.
        raise ValueError("--wandb: the wandb package is not installed: pip install wandb")
    # The values the run resolved for flags left None go into args: args.json then records them, and the
    # run can be read, and repeated, from it. None stays only where a flag is off or its value comes from
    # each row or model (--text-field, --lora-target-modules, --feedback-model, --wandb).
    args.model = models.model_names(args)  # ["tiny"], or one name per agent: ["a", "b"]
    args.num_agents = env.num_agents
    args.dataset = args.dataset or env.dataset  # coding: humaneval; tldr, arxiv: builtin; demo: None
    args.split = args.split or env.split  # the split trained on; None for an env that has none to name
    args.sandbox = env.isolation if env.runs_code else args.sandbox  # the level model code runs at
    args.test_timeout = args.test_timeout or envs.TEST_TIMEOUT  # the coding env's too; one for every env
    lora = models.lora_from_flags(args)  # It checks the LoRA flags too, before any model loads.
    # The threshold is the env's maximum, as magrpo.rollout_team takes it, every turn's loss weighs 1
    # unless --turn-weights says otherwise (written as the flag is given), and LoRA's alpha is resolved.
    runs.fill_defaults(args, {"termination_threshold": getattr(env, "max_reward", None),
                              "turn_weights": ",".join(["1"] * cfg.num_turns),
                              "lora_alpha": None if lora is None else lora.alpha})
    return env, cfg


def build(args, env, checkpoint=None, local_rank=0, local_world=1, optimize=True):
    """The agents of --model or of a checkpoint, on this process's devices; LoRA agents on one base
    share its frozen copy. optimize: each with its optimizer (False: models only read, a critic's)."""
    lora, bases = models.lora_from_flags(args), {}
    # The tiny model's steps are too small for a GPU, where launching their kernels costs more than
    # running them (docs/benchmarks.md), so --device auto keeps it on the CPU.
    tiny = set(models.model_names(args)) == {models.TINY} and not args.feedback_model
    if args.device == "auto" and tiny and torch.cuda.is_available():
        args.device = "cpu"
        print("device: cpu (--device auto keeps the tiny model on the CPU, where it runs faster)",
              file=sys.stderr)
    # LoRA agents share one frozen base, so with --device auto they all go where the base is.
    n = 1 if lora and args.device == "auto" else env.num_agents
    devices = models.agent_devices(args.device, n, local_rank, local_world) * (env.num_agents // n)
    models.set_torch(args.cpu_threads, devices)
    names = models.per_agent(models.model_names(args), env.num_agents, "--model")
    # A resumed run loads its agents from the checkpoint, the weights it had reached, not --model's.
    if checkpoint is not None:
        names = [os.path.join(checkpoint[1], f"agent_{i}") for i in range(env.num_agents)]
    agents = []
    for i, (name, device) in enumerate(zip(names, devices)):
        agent = models.load_agent(name, device, args.dtype, args.seed + i, chat_template=args.chat_template,
                                  lora=lora, bases=bases, base_seed=args.seed if lora else None)
        if optimize:  # (bf16 weights get fp32 master copies: 4 more bytes a weight, for training alone)
            agent.optimizer = models.make_optimizer(agent.model, args.learning_rate, args.weight_decay)
        agents.append(agent)
    # args.json records the device(s) and the dtype the run used, not "auto".
    args.device = ",".join(dict.fromkeys(str(agent.model.device) for agent in agents))
    args.dtype = str(agents[0].model.dtype).removeprefix("torch.")
    return models.team_of(agents, bases)  # LoRA agents of one base: a Team, which samples and learns as one


def main(argv=None):
    """The command line, `python train.py [flags]`, from Python: train(parse_args(argv))."""
    return train(parse_args(argv))


if __name__ == "__main__":
    try:
        main()
        status = 0
    except SystemExit as e:
        status = e.code
    if torch.distributed.is_initialized():  # Under torchrun the interpreter's teardown, where gloo's threads
        torch.distributed.destroy_process_group()  # can abort the process (SIGABRT), is skipped
        if isinstance(status, str):
            print(status, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if isinstance(status, str) else status or 0)
    sys.exit(status)
