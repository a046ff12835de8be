"""
Evaluate MAGRPO agents against the paper's baselines: the same problems, seeds and sampling for
every method (arXiv 2508.04652, the evaluations of Sec. 4-5).

CPU demo, tiny agents on the offline demo env (no downloads):
    python eval.py
    python train.py --out out && python eval.py --agents out --max-new-tokens 24 --out report.json
Check the coding harness itself (the canonical solutions must give pass@1 = 1.0):
    python eval.py --env coding --dataset humaneval --methods oracle
The paper's coding table (a GPU; paper sampling: 15 samples, T 0.8, top-p 0.95, 256 tokens):
    python eval.py --env coding --dataset humaneval --split test --agents runs/code \
        --model Qwen/Qwen2.5-Coder-3B --single-model Qwen/Qwen2.5-Coder-7B \
        --methods magrpo,single,concat,sequential,discussion,oracle --out report.json

Methods (--methods, default: all the env supports): magrpo (trained agents from --agents, else
the --model agents), single (one model does the whole task), concat (the --model agents with the
MAGRPO prompts, no communication), sequential (each agent reads the earlier agents' outputs),
discussion (one round: each agent revises after seeing the partner's first answer), oracle (the
dataset's canonical solutions; coding only). Without --agents, magrpo and concat are the same
agents with the same seeds and give the same numbers.

Metrics: pass@k (unbiased, Chen et al. 2021), pass_any@k (the paper's: any of the first k samples
passes every test), acc@k (best test pass rate among the first k), coop_rate (share of samples
with a cooperation bonus), the mean reward and its levels, tokens per joint sample (all agents
and rounds), seconds_per_sample (a generate call's wall time per completion; the mean over agents
that run side by side, the sum over agents that wait for each other). Test metrics appear when
the reward carries test counts. --out writes JSON: {"methods": {NAME: metrics}, "details": {NAME:
means of the reward's levels and numeric fields}, "problems": [{"task_id", "method", "rewards",
"passed", "tests", "errors", "outputs" (--save-outputs)}], "config": {...}}.
"""
import argparse
import copy
import dataclasses
import json
import math
import os
import sys
import time

from tqdm import tqdm

import envs
import magrpo
import models


METHODS = ("magrpo", "single", "concat", "sequential", "discussion", "oracle")
SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "num_turns", "feedback",
                   "feedback_max_new_tokens", "termination_threshold")  # the Config fields eval.py takes
PAPER_K = (1, 3, 5, 10)

# -----------------------------------------------------------------------------
# Metrics (Sec. 6)


def pass_at_k(n, c, k):
    """The unbiased pass@k of one problem with n samples of which c are correct (Chen et al. 2021):
    1 - C(n-c, k) / C(n, k), as the product 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms
    the huge binomials. 1.0 when n - c < k (every k-subset holds a correct sample)."""
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _number(v):
    return isinstance(v, (int, float, bool)) and math.isfinite(float(v))


def sample_record(reward, error=None, tokens=0, seconds=0.0):
    """The numbers of one scored joint sample, read generically off the env's reward object:
    the total (float(reward)); test counts when it has `passed` and `n_tests` (rewards.CodeReward);
    `coop`; a `levels` dict; and every numeric (or numeric tuple) dataclass field. So any reward
    that carries levels or diagnostics (the writing rewards' length_ratio, ...) is reported as is.
    A magrpo.ScoreError (or None with an `error`) is a sample whose scoring raised: reward 0, no
    tests passed, error kept."""
    if isinstance(reward, magrpo.ScoreError):
        reward, error = None, reward.error
    rec = {"reward": 0.0, "tokens": tokens, "seconds": seconds, "error": error, "levels": {}, "fields": {}}
    if reward is None:
        return rec
    try:
        total = float(reward)
        if not math.isfinite(total):
            raise ValueError(f"non-finite reward {total}")
    except Exception as e:  # a reward float() rejects is one bad sample, not a crash
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec
    rec["reward"] = total
    passed, n_tests = getattr(reward, "passed", None), getattr(reward, "n_tests", None)
    if _number(passed) and _number(n_tests):
        rec["tests"] = (int(passed), int(n_tests))
    if _number(getattr(reward, "coop", None)):
        rec["coop"] = float(reward.coop)
    levels = getattr(reward, "levels", None)
    if isinstance(levels, dict):
        rec["levels"] = {k: float(v) for k, v in levels.items() if _number(v)}
    if dataclasses.is_dataclass(reward):
        for f in dataclasses.fields(reward):
            v = getattr(reward, f.name)
            if _number(v):
                rec["fields"][f.name] = float(v)
            elif isinstance(v, tuple) and v and all(_number(x) for x in v):
                rec["fields"].update({f"{f.name}_{i}": float(x) for i, x in enumerate(v)})
    return rec


def all_passed(rec):
    """Every test of the problem passed (a sample that never reached the tests did not)."""
    p, n = rec.get("tests", (0, 0))
    return n > 0 and p == n


def pass_rate(rec):
    p, n = rec.get("tests", (0, 0))
    return p / n if n > 0 else 0.0


def problem_metrics(records, ks):
    """pass@k, pass_any@k and acc@k of one problem's samples, in sampling order."""
    ok, rates = [all_passed(r) for r in records], [pass_rate(r) for r in records]
    out = {f"pass@{k}": pass_at_k(len(ok), sum(ok), k) for k in ks}
    out.update({f"pass_any@{k}": float(any(ok[:k])) for k in ks})
    out.update({f"acc@{k}": max(rates[:k]) for k in ks})
    return out


def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def aggregate(problems, ks):
    """One method's metrics from its problems (each a list of sample records). Test metrics are
    averaged over problems and appear only when the rewards carry test counts; coop_rate only
    when they carry a cooperation bonus (the paper's cooperation rate: the share of samples with a
    bonus > 0). level_<name> is the mean of each reward level by its name (absent = gated = 0:
    coding structure, syntax, tests, cooperation; writing structure, coordination, vocabulary,
    style). Returns (metrics, details): details holds the share of samples that earned each level
    and the means of the reward's numeric fields."""
    samples = [r for recs in problems for r in recs]
    metrics = {}
    if any("tests" in r for r in samples):
        per_problem = [problem_metrics(recs, ks) for recs in problems]
        metrics.update({key: _mean(m[key] for m in per_problem) for key in per_problem[0]})
    if any("coop" in r for r in samples):
        metrics["coop_rate"] = _mean(r.get("coop", 0.0) > 0 for r in samples)
    rewards = [r["reward"] for r in samples]
    metrics["reward"] = _mean(rewards)
    metrics["reward_std"] = math.sqrt(_mean((x - metrics["reward"]) ** 2 for x in rewards))
    metrics["tokens_per_sample"] = _mean(r["tokens"] for r in samples)
    metrics["seconds_per_sample"] = _mean(r["seconds"] for r in samples)
    metrics["errors"] = sum(r["error"] is not None for r in samples)
    details = {}
    for name in dict.fromkeys(k for r in samples for k in r["levels"]):  # by the paper's names
        metrics[f"level_{name}"] = _mean(r["levels"].get(name, 0.0) for r in samples)
        details[f"earned/{name}"] = _mean(r["levels"].get(name, 0.0) > 0 for r in samples)
    levels = {k for r in samples for k in r["levels"]}
    for name in dict.fromkeys(k for r in samples for k in r["fields"] if k not in levels):
        details[name] = _mean(r["fields"][name] for r in samples if name in r["fields"])
    return metrics, details

# -----------------------------------------------------------------------------
# Sampling: each method turns a batch of B problems into N = --num-samples joint outputs each, per
# turn. Problem p is seeded by mix_seed(--seed, p) for every method, whatever batch it is in: e.g.
# discussion's first round is exactly concat's samples.


@dataclasses.dataclass
class Sample:
    outputs: tuple     # one text per agent (one text in all for `single`)
    tokens: int        # completion tokens generated for it so far: all agents, rounds and turns
    seconds: float     # response time so far: mean of parallel agents' times, summed over steps and turns
    reward: object = None  # the env's reward, where the sampler already scored it


def problem_seeds(args, start, B):
    return [magrpo.mix_seed(args.seed, start + b) for b in range(B)]


def sample_cfg(args):
    """The sampling of evaluation: N samples per problem, each revised at every later turn but a
    solved one (it reached --termination-threshold: carried over as it is). --authors-rewards with
    no threshold given revises every sample, solved or not, as the authors' evaluation does."""
    cfg = magrpo.config_from_flags(args, num_generations=args.num_samples, expand="all")
    if args.authors_rewards and args.termination_threshold is None:
        cfg.termination_threshold = math.inf
    return cfg


def per_row(rollout):
    """Tokens of each row, and the wall time per completion of the generate call that drew them."""
    return rollout.completion_mask.sum(-1).tolist(), rollout.seconds / len(rollout)


def run_team(env, agents, batch, args, start, expert=None):
    """magrpo and concat: every agent samples alone from its own prompt (decentralised execution,
    Sec. 1), so a sample takes the agents' mean time; with --num-turns T every sample is revised
    once per later turn after the env's feedback on it (magrpo.rollout_team, one child per sample),
    its cost added. Returns one [B][N] list of Samples per turn."""
    turns = magrpo.rollout_team(agents, env, batch, sample_cfg(args), problem_seeds(args, start, len(batch)),
                                expert, children=1)
    rows = [[per_row(r) for r in turn.rollouts] for turn in turns]
    out, N = [], args.num_samples
    for t in range(args.num_turns):
        samples, flat = [], []
        for path in chains(turns, args.num_turns):
            nodes = list(dict.fromkeys(path[:t + 1]))  # a node carried over costs nothing more
            tokens = seconds = 0
            for tt, node in nodes:
                turn = turns[tt]
                k, idx = divmod(node, len(turn.joint))
                tokens += sum(toks[k * turn.size + g] for (toks, _), g in zip(rows[tt], turn.joint[idx]))
                seconds += _mean(sec for _, sec in rows[tt])
            tt, node = path[t]
            flat.append(Sample(turns[tt].outputs[node], tokens, seconds, turns[tt].rewards[node]))
        out.append([flat[b * N:(b + 1) * N] for b in range(len(batch))])
    return out


def chains(turns, num_turns):
    """For an episode with one child per revised node (evaluation): per turn-1 node, the node it has
    become at each turn, [(turn index, node)] for turns 1..T; a solved node stands for itself."""
    out = []
    for n in range(len(turns[0].rewards)):
        path = [(0, n)]
        for t in range(1, num_turns):
            prev_t, prev = path[-1]
            k = turns[prev_t].children.get(prev) if prev_t == t - 1 else None
            path.append((t, k * len(turns[t].joint)) if k is not None else (prev_t, prev))
        out.append(path)
    return out


def team_rewards(agents, env, cfg, limit, expert=None, batch_size=8):
    """The greedy joint reward on the first `limit` examples of `env`, per turn: decentralised
    execution (Sec. 1), each agent decoding alone from its own prompt; at a later turn each answer
    is revised once after its feedback (one that reached the threshold stays as it is)."""
    greedy = dataclasses.replace(cfg, num_generations=1, temperature=0.0, expand="all")
    examples, totals = env.examples[:limit], [0.0] * cfg.num_turns
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        turns = magrpo.rollout_team(agents, env, batch, greedy, [0] * len(batch), expert, children=1)
        for path in chains(turns, cfg.num_turns):
            for t, (turn, node) in enumerate(path):
                totals[t] += float(turns[turn].rewards[node])
    return [total / len(examples) for total in totals]


def run_sequential(env, agents, batch, args, start, expert=None):
    """Sequential pipeline: agent i writes after reading what agents 0..i-1 wrote in the same
    sample (env.sequential_prompt); the agents wait for each other, so their times add up."""
    cfg, N, seeds = sample_cfg(args), args.num_samples, problem_seeds(args, start, len(batch))
    texts, tokens, seconds = [], [], 0.0
    for i, agent in enumerate(agents):
        if i == 0:
            r = magrpo.sample_agent(agent, 0, [env.sequential_prompt(ex, 0, []) for ex in batch], N, cfg, seeds)
        else:  # one prompt per (problem, sample): it shows that sample's earlier outputs
            prompts = [env.sequential_prompt(ex, i, [t[b * N + g] for t in texts])
                       for b, ex in enumerate(batch) for g in range(N)]
            r = magrpo.sample_agent(agent, i, prompts, 1, cfg, [magrpo.mix_seed(s, g) for s in seeds for g in range(N)])
        texts.append([t for group in r.texts for t in group])
        toks, sec = per_row(r)
        tokens.append(toks)
        seconds += sec
    return [[[Sample(tuple(t[b * N + g] for t in texts), sum(k[b * N + g] for k in tokens), seconds)
              for g in range(N)] for b in range(len(batch))]]


def run_discussion(env, agents, batch, args, start, expert=None):
    """One-round discussion: first answers as concat, then every agent revises after seeing its
    sample's first answers (env.discussion_prompt). Scored on the revisions; tokens and times of
    the two rounds add up."""
    first = run_team(env, agents, batch, args, start)[0]
    cfg, N = sample_cfg(args), args.num_samples
    seeds = [magrpo.mix_seed(s, N + g) for s in problem_seeds(args, start, len(batch)) for g in range(N)]
    flat = [s for row in first for s in row]
    second = [per_row(r) + (r,) for r in (magrpo.sample_agent(
        agent, i, [env.discussion_prompt(batch[n // N], i, s.outputs) for n, s in enumerate(flat)], 1, cfg, seeds)
        for i, agent in enumerate(agents))]
    seconds = _mean(sec for _, sec, _ in second)
    return [[[Sample(tuple(r.texts[b * N + g][0] for _, _, r in second),
                     first[b][g].tokens + sum(toks[b * N + g] for toks, _, _ in second), first[b][g].seconds + seconds)
              for g in range(N)] for b in range(len(batch))]]


def run_single(env, agents, batch, args, start, expert=None):
    """One model writes the whole solution (env.single_prompt); scored with env.single_reward."""
    r = magrpo.sample_agent(agents[0], 0, [env.single_prompt(ex) for ex in batch], args.num_samples,
                            sample_cfg(args), problem_seeds(args, start, len(batch)))
    toks, sec = per_row(r)
    N = args.num_samples
    return [[[Sample((r.texts[b][g],), toks[b * N + g], sec) for g in range(N)] for b in range(len(batch))]]


def run_oracle(env, agents, batch, args, start, expert=None):
    """The dataset's canonical solution as every sample: checks the harness (pass@1 must be 1)."""
    return [[[Sample(tuple(env.oracle_outputs(ex)), 0, 0.0)] * args.num_samples for ex in batch]]


RUNNERS = {"magrpo": run_team, "concat": run_team, "sequential": run_sequential,
           "discussion": run_discussion, "single": run_single, "oracle": run_oracle}

# -----------------------------------------------------------------------------
# Scoring: an exception while scoring one sample is that sample's reward 0, never the end


def score_batch(env, batch, samples, single=False):
    """Sample records for a batch. A sample the sampler already scored keeps its reward; the others
    go through magrpo.score_joint (one bad sample costs only itself), identical outputs of one
    problem once (the oracle's copies, a model's repeats), as the reward is a function of the joint
    output. `single` scores one-model outputs with env.single_reward."""
    unique = list(dict.fromkeys((b, s.outputs) for b, row in enumerate(samples) for s in row if s.reward is None))
    one = (lambda ex, out: env.single_reward(ex, out[0])) if single else None
    rewards = magrpo.score_joint(env, [batch[b] for b, _ in unique], [o for _, o in unique], one) if unique else []
    scored = dict(zip(unique, rewards))
    return [[sample_record(scored[(b, s.outputs)] if s.reward is None else s.reward, tokens=s.tokens, seconds=s.seconds)
             for s in row] for b, row in enumerate(samples)]

# -----------------------------------------------------------------------------
# Command line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    envs.add_env_flags(p)
    models.add_model_flags(p)
    magrpo.add_config_flags(p, SAMPLING_FIELDS)
    p.add_argument("--limit", type=int, help="evaluate the first N problems of the split")
    p.add_argument("--methods", help=f"comma list of {', '.join(METHODS)} (default: all the env supports)")
    p.add_argument("--agents", help="a train.py --out directory holding agent_0, agent_1, ... (method magrpo)")
    p.add_argument("--single-model", help="the single baseline's model (default: the first --model)")
    p.add_argument("--num-samples", type=int, default=15, help="joint samples per problem (paper: 15)")
    p.add_argument("--k", help="comma list of k for pass@k/acc@k (default: 1,3,5,10 up to --num-samples)")
    p.add_argument("--batch-size", type=int, default=4, help="problems per generate call")
    p.add_argument("--latency-problems", type=int, default=3, help="problems timed at batch 1 for "
                   "latency_seconds (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the JSON report here")
    p.add_argument("--save-outputs", action="store_true", help="keep every sample's texts in the report")
    return p.parse_args(argv)


def comma_list(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def use_training_flags(args):
    """With --agents DIR from train.py, default --model (the base the agents were trained from, for
    the baselines), --max-new-tokens and --chat-template to what DIR/args.json recorded."""
    path = os.path.join(args.agents or "", "args.json")
    if not (args.agents and os.path.isfile(path)):
        return
    with open(path) as f:
        saved = json.load(f)
    args.model = args.model or saved.get("model")
    args.chat_template = args.chat_template or bool(saved.get("chat_template"))
    if args.max_new_tokens is None:
        args.max_new_tokens = saved.get("max_new_tokens")


def check_flags(args):
    """Fill defaults and check every flag that needs no env or model."""
    use_training_flags(args)
    names = models.model_names(args)
    tiny = not args.agents and all(m == models.TINY for m in names)
    # the paper's evaluation sampling (Sec. 6); the tiny model's own length and test timeout
    defaults = dict(temperature=0.8, top_p=0.95, max_new_tokens=256, test_timeout=10.0)
    if tiny:
        defaults.update({k: models.TINY_DEFAULTS[k] for k in ("max_new_tokens", "test_timeout")})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for flag, value in (("--num-samples", args.num_samples), ("--batch-size", args.batch_size),
                        ("--limit", 1 if args.limit is None else args.limit)):
        if value < 1:
            raise ValueError(f"{flag}: must be >= 1, got {value}")
    if args.latency_problems < 0:
        raise ValueError(f"--latency-problems: must be >= 0, got {args.latency_problems}")
    cfg = sample_cfg(args)  # checks the sampling and multi-turn flags; args gets Config's defaults
    vars(args).update({k: getattr(cfg, k) for k in SAMPLING_FIELDS if getattr(args, k) is None})
    if args.dtype not in models.DTYPES:
        raise ValueError(f"--dtype: unknown {args.dtype!r}: use one of {', '.join(models.DTYPES)}")
    if args.k is None:
        args.ks = [k for k in PAPER_K if k <= args.num_samples]
    else:
        try:
            args.ks = sorted({int(k) for k in comma_list(args.k)})
        except ValueError:
            raise ValueError(f"--k: want a comma list of integers, got {args.k!r}") from None
        if not args.ks or args.ks[0] < 1 or args.ks[-1] > args.num_samples:
            raise ValueError(f"--k: every k must be in 1..--num-samples ({args.num_samples}), got {args.k!r}")
    if args.methods is not None:
        args.methods = list(dict.fromkeys(comma_list(args.methods)))
        unknown = [m for m in args.methods if m not in METHODS]
        if unknown or not args.methods:
            raise ValueError(f"--methods: unknown {', '.join(unknown) or 'empty list'}: use {', '.join(METHODS)}")
    if args.agents and not os.path.isdir(args.agents):
        raise ValueError(f"--agents: {args.agents!r} is not a directory")
    if args.out and not os.access(os.path.dirname(os.path.abspath(args.out)), os.W_OK):
        raise ValueError(f"--out: cannot write into the directory of {args.out!r}")
    return names


def make_env(args):
    """The env and the problems to evaluate. --split defaults to the final-eval split "test" (every
    env has one; a file without named splits is one split): a forgotten flag must not score
    training data."""
    args.split = args.split or "test"
    env = envs.env_from_flags(args)
    examples = env.examples[:args.limit] if args.limit is not None else env.examples
    if not examples:
        raise ValueError(f"--dataset/--split: the {env.name} env has no problems to evaluate")
    return env, examples


def supported(env, examples, method):
    """None if the env can run `method` on these problems, else why not: single and oracle need
    env hooks, and the oracle a canonical solution for every problem."""
    try:
        if method == "single":
            env.single_prompt(examples[0])
        elif method == "oracle":
            if not hasattr(env, "oracle_outputs"):
                return f"oracle needs canonical solutions (--env coding); the {env.name} env has none"
            for ex in examples:
                env.oracle_outputs(ex)
    except Exception as e:  # ValueError from the env's hooks, KeyError from data without solutions
        return f"{method}: {e}"
    return None


class Team:
    """Loads models on first use; a model named twice on one device loads once (eval needs no
    separate copies: nothing is trained), except tiny ones, whose random init depends on the seed.
    LoRA agents (adapter directories) on one base and device share one copy of it (self.bases)."""

    def __init__(self, args, names, n):
        self.args, self.n, self.cache, self.bases = args, n, {}, {}
        self.devices = models.agent_devices(args.device, n)
        self.models = models.per_agent(names, n, "--model")
        self.expert = models.load_expert(args, self.devices[0])

    def agent(self, name, device, flag, seed):
        key = (name, device, seed if name == models.TINY else None)
        if key not in self.cache:
            agent = models.load_agent(name, device, self.args.dtype, seed, flag, self.args.chat_template,
                                      bases=self.bases)
            magrpo.generate(agent.model, agent.tokenizer, ["warm up"], 1, 2)  # first-call costs stay out of the timings
            self.cache[key] = agent
        return self.cache[key]

    def base(self):
        return [self.agent(m, d, "--model", self.args.seed + i)
                for i, (m, d) in enumerate(zip(self.models, self.devices))]

    def trained(self):
        return [self.agent(d, dev, "--agents", self.args.seed + i)
                for i, (d, dev) in enumerate(zip(trained_dirs(self.args.agents, self.n), self.devices))]

    def single(self):
        name = self.args.single_model or self.models[0]
        return [self.agent(name, self.devices[0], "--single-model", self.args.seed)]

    def for_method(self, method):
        if method == "oracle":
            return []
        if method == "single":
            return self.single()
        return self.trained() if method == "magrpo" and self.args.agents else self.base()


def trained_dirs(out, n):
    """The agents of a train.py run: its final agents (OUT/agent_i, complete when OUT/final.json
    exists), else those of its latest complete checkpoint (the run did not finish: said on stderr)."""
    dirs = [os.path.join(out, f"agent_{i}") for i in range(n)]
    if not os.path.isfile(os.path.join(out, "final.json")):
        checkpoint = models.latest_checkpoint(out)
        if checkpoint is not None:
            print(f"eval.py: note: the run in {out} did not finish: using its latest checkpoint, "
                  f"{checkpoint[1]} (step {checkpoint[0]})", file=sys.stderr)
            dirs = [os.path.join(checkpoint[1], f"agent_{i}") for i in range(n)]
    missing = [d for d in dirs if not os.path.isdir(d)]
    if missing:
        raise ValueError(f"--agents: no {missing[0]} (want agent_0..agent_{n - 1} from train.py --out)")
    return dirs


def problem_id(example, index):
    for key in ("task_id", "id"):
        if key in example:
            return example[key]
    return index


def evaluate(args, env, examples, team):
    """Every method on every problem, batch by batch, turn by turn. Returns the report (without
    config): "methods" and "details" hold each method's last turn (its final answer), "turns" one
    {"methods", "details"} per turn, "improvement" the last turn's metrics minus the first's."""
    turns = [{"methods": {}, "details": {}} for _ in range(args.num_turns)]
    report = {"methods": {}, "details": {}, "problems": [], "turns": turns, "improvement": {}}
    bar = tqdm(total=len(args.methods) * len(examples), desc="eval", dynamic_ncols=True)
    try:
        for method in args.methods:
            bar.set_description(method)
            agents, records, rows = team.for_method(method), [[] for _ in turns], []
            for start in range(0, len(examples), args.batch_size):
                batch = examples[start:start + args.batch_size]
                by_turn = RUNNERS[method](env, agents, batch, args, start, team.expert)
                by_turn += [by_turn[-1]] * (args.num_turns - len(by_turn))  # single-turn methods keep their answer
                for t, samples in enumerate(by_turn):
                    recs = score_batch(env, batch, samples, single=method == "single")
                    records[t] += recs
                rows += [problem_row(method, problem_id(ex, start + b), s, r, args)
                         for b, (ex, s, r) in enumerate(zip(batch, by_turn[-1], recs))]
                bar.update(len(batch))
                bar.set_postfix(reward=f"{_mean(r['reward'] for rec in records[-1] for r in rec):.3f}")
            for t, recs in enumerate(records):
                turns[t]["methods"][method], turns[t]["details"][method] = aggregate(recs, args.ks)
            if args.latency_problems and method != "oracle":
                turns[-1]["methods"][method]["latency_seconds"] = latency(env, agents, examples, args, method, team.expert)
            report["methods"][method], report["details"][method] = turns[-1]["methods"][method], turns[-1]["details"][method]
            first, last = turns[0]["methods"][method], turns[-1]["methods"][method]
            report["improvement"][method] = {k: last[k] - first[k] for k in last if k in first}
            report["problems"] += rows
    except KeyboardInterrupt:
        print("interrupted: reporting the methods finished so far", file=sys.stderr)
    bar.close()
    return report


def latency(env, agents, examples, args, method, expert):
    """Seconds to one problem's joint answer at batch 1, one sample (the paper's response time:
    what a user waits; parallel agents' times averaged, sequential steps and all turns added),
    the mean over the first --latency-problems problems. seconds_per_sample is the other view:
    batched throughput."""
    one = copy.copy(args)
    one.num_samples = 1
    times = [RUNNERS[method](env, agents, [ex], one, i, expert)[-1][0][0].seconds
             for i, ex in enumerate(examples[:args.latency_problems])]
    return _mean(times)


def problem_row(method, task_id, samples, records, args):
    """One problem's samples (the last turn's), for finding where two methods differ."""
    row = {"task_id": task_id, "method": method, "rewards": [r["reward"] for r in records]}
    if any("tests" in r for r in records):
        row["passed"] = [all_passed(r) for r in records]
        row["tests"] = [list(r.get("tests", (0, 0))) for r in records]
    errors = {g: r["error"] for g, r in enumerate(records) if r["error"]}
    if errors:
        row["errors"] = errors
    if args.save_outputs:
        row["outputs"] = [list(s.outputs) for s in samples]
    return row


def format_table(rows, title):
    """Methods as rows, metrics as columns."""
    cols = list(dict.fromkeys(k for metrics in rows.values() for k in metrics))
    if not cols:
        return ""
    w0 = max(len(title), *(len(m) for m in rows))
    widths = [max(8, len(c)) for c in cols]
    lines = [" ".join([title.ljust(w0)] + [c.rjust(w) for c, w in zip(cols, widths)])]
    for method, metrics in rows.items():
        cells = [("-" if c not in metrics else f"{metrics[c]:.4g}" if isinstance(metrics[c], float)
                  else str(metrics[c])).rjust(w) for c, w in zip(cols, widths)]
        lines.append(" ".join([method.ljust(w0)] + cells))
    return "\n".join(lines)


def setup(args):
    """Every flag checked and every model loaded before any sampling: (env, examples, team)."""
    names = check_flags(args)
    env, examples = make_env(args)
    if args.methods is None:  # every method this env can run
        args.methods = [m for m in METHODS if supported(env, examples, m) is None]
    else:
        for why in filter(None, (supported(env, examples, m) for m in args.methods)):
            raise ValueError(f"--methods: {why}")
    if args.agents and not args.model and set(args.methods) & {"single", "concat", "sequential", "discussion"}:
        print("eval.py: note: the baselines use the tiny model; give --model (the base the agents were "
              "trained from) for a fair comparison", file=sys.stderr)
    team = Team(args, names, env.num_agents)
    for m in args.methods:
        team.for_method(m)
    return env, examples, team


def main(argv=None):
    args = parse_args(argv)
    try:
        env, examples, team = setup(args)
    except ValueError as e:
        sys.exit(f"eval.py: error: {e}")
    report = evaluate(args, env, examples, team)
    report["config"] = {**vars(args), "env_name": env.name,
                        "num_problems": len(examples), "models": team.models, "devices": team.devices}
    for t, turn in enumerate(report["turns"], 1):
        title = "method" if args.num_turns == 1 else f"turn {t}"
        print(format_table(turn["methods"], title))
    if args.num_turns > 1:
        print(format_table(report["improvement"], f"turn {args.num_turns} - turn 1"))
    print(format_table(report["details"], "reward detail"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
