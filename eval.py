"""
How agents are measured. After training: MAGRPO agents against the paper's baselines (arXiv
2508.04652, Sec. 6), the same problems, seeds and sampling for every method, metrics per turn (the
methods, metrics and JSON report: docs/eval.md). During training: train.py's greedy in-training
evaluation (team_reward_sums), what a step scored (metrics.jsonl) and the run's learning curve
(curve.svg).

CPU demo, tiny agents on the offline demo env (no downloads):
    python eval.py
    python train.py --out out && python eval.py --agents out --max-new-tokens 24 --out report.json
Check the coding harness itself (the canonical solutions must give pass@1 = 1.0):
    python eval.py --env coding --dataset humaneval --methods oracle
The paper's coding table (a GPU; the paper's sampling is the default):
    python eval.py --env coding --dataset humaneval --agents runs/code --model Qwen/Qwen2.5-Coder-3B \
        --single-model Qwen/Qwen2.5-Coder-7B --out report.json
"""
import dataclasses
import json
import math
import os
import sys
from collections import namedtuple

import torch
from tqdm import tqdm

import magrpo
import models
import runs
import sampler


# The paper's methods (Sec. 6) are the trained team, one model doing the whole task, and the untrained
# agents side by side (concat), in a pipeline (sequential) or after one round of discussion. The
# dataset's own solutions (oracle) check the harness, so their pass@1 must be 1.
METHODS = ("magrpo", "single", "concat", "sequential", "discussion", "oracle")
SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "compile", "num_turns", "feedback",
                   "feedback_max_new_tokens", "termination_threshold")  # the Config fields eval.py takes

# -----------------------------------------------------------------------------
# Every method on every problem, the same seeds for each (Sec. 6)


def evaluate(args, env, examples, agents, expert=None):
    """Every method on every problem -> the report without its config (docs/eval.md: the JSON report). A ^C
    reports the methods finished so far."""
    cfg, problems = sample_cfg(args), []
    turns = [{"methods": {}, "details": {}} for _ in range(cfg.num_turns)]
    # Problem p's seed is the same for every method and batch, so the methods differ in what they are,
    # not in their luck (discussion's first round is exactly concat's samples).
    seeds = [sampler.mix_seed(args.seed, p) for p in range(len(examples))]
    bar = tqdm(total=len(args.methods) * len(examples), desc="eval", dynamic_ncols=True)
    try:
        for method in args.methods:
            bar.set_description(method)
            run, team, records = RUNNERS[method], agents[method], [[] for _ in turns]
            for start in range(0, len(examples), args.batch_size):
                batch = examples[start:start + args.batch_size]
                by_turn = run(env, team, batch, cfg, seeds[start:start + args.batch_size], expert)
                by_turn += [by_turn[-1]] * (cfg.num_turns - len(by_turn))  # one-turn methods keep theirs
                for t, samples in enumerate(by_turn):
                    records[t] += score_batch(env, batch, samples, single=method == "single")
                bar.update(len(batch))
                bar.set_postfix(reward=f"{mean(r['reward'] for rec in records[-1] for r in rec):.3f}")
            for t, recs in enumerate(records):
                turns[t]["methods"][method], turns[t]["details"][method] = aggregate(recs, args.ks)
            problems += [problem_row(method, ex.get("task_id", ex.get("id", p)), recs, args.save_outputs)
                         for p, (ex, recs) in enumerate(zip(examples, records[-1]))]
            # The paper's response time (Sec. 6) is a user's wait for one answer, so it is timed with batch 1
            # and one sample, apart from the batched sampling above, whose per-sample time is a throughput.
            if args.latency_problems and method != "oracle":
                one = dataclasses.replace(cfg, num_generations=1)
                times = [run(env, team, [ex], one, seeds[p:p + 1], expert)[-1][0].seconds
                         for p, ex in enumerate(examples[:args.latency_problems])]
                turns[-1]["methods"][method]["latency_seconds"] = mean(times)
    except KeyboardInterrupt:  # an hour of evaluation is not thrown away for the method that was running
        print("interrupted: reporting the methods finished so far", file=sys.stderr)
    bar.close()
    first, last = turns[0]["methods"], turns[-1]["methods"]
    improvement = {}  # per method, each metric's last turn minus its first
    for method, metrics in last.items():
        improvement[method] = {k: v - first[method][k] for k, v in metrics.items() if k in first[method]}
    return {**turns[-1], "problems": problems, "turns": turns, "improvement": improvement}

def problem_row(method, task_id, records, save_outputs):
    """One problem's samples (the last turn's), for finding where two methods differ."""
    # The report's `problems` hold each sample's reward (and tests) per method and problem, because where
    # two methods differ is where to read their outputs (--save-outputs keeps them).
    row = {"task_id": task_id, "method": method, "rewards": [r["reward"] for r in records]}
    if any("tests" in r for r in records):
        row["passed"] = [tests_rate(r) == 1 for r in records]
        row["tests"] = [list(r.get("tests", (0, 0))) for r in records]
    errors = {g: r["error"] for g, r in enumerate(records) if r["error"]}
    if errors:
        row["errors"] = errors
    if save_outputs:
        row["outputs"] = [list(r["outputs"]) for r in records]
    return row

# -----------------------------------------------------------------------------
# Sampling. B problems give B * N joint samples per turn (N = --num-samples), and row b * N + g is problem
# b's g-th. With the same seeds, discussion's first round is exactly concat's samples.


# One joint answer of a method, with what it cost (the paper's response time, Sec. 6): its outputs, one
# text per agent (one in all for `single`); the completion tokens so far, over all agents, rounds and turns;
# the response time so far in seconds, the mean of agents sampling side by side and the sum of sequential
# steps and turns; and the env's reward where the sampler already scored it (else None).
Sample = namedtuple("Sample", "outputs tokens seconds reward", defaults=(None,))


def sample_cfg(args):
    """N samples per problem, each revised at every later turn unless solved; --authors-rewards with
    no --termination-threshold revises every one, as the authors' evaluation."""
    # With expand "all" every unsolved sample is revised (one child each, run_team), not only the best of
    # a group as in training, because each sample is one user's conversation with the team.
    cfg = runs.config_from_flags(args, num_generations=args.num_samples, expand="all")
    if args.authors_rewards and args.termination_threshold is None:
        cfg.termination_threshold = math.inf
    return cfg


def per_row(rollout):
    """Each row's text and token count, and the generate call's seconds per completion: a batch's
    rows are sampled together, so each is charged its share of the call."""
    texts = [t for group in rollout.texts for t in group]
    return texts, rollout.completion_mask.sum(-1).tolist(), rollout.seconds / len(rollout)


def run_team(env, agents, batch, cfg, seeds, expert=None):
    """magrpo and concat: each agent samples alone (Sec. 1); a later turn revises each unsolved sample
    once. Per turn, every sample as it then stands, costs so far added."""
    # This is the training episode with one child per revised node. Each sample is a chain of answers,
    # one per turn, and a solved one stops, unless --authors-rewards asks to revise all as the authors do.
    turns = magrpo.rollout_team(agents, env, batch, cfg, seeds, expert, children=1)
    where = [(0, node) for node in range(len(turns[0].outputs))]  # each sample's latest (turn, node)
    tokens, seconds, out = [0] * len(where), [0.0] * len(where), []
    for t in range(cfg.num_turns):
        rows = [per_row(rollout) for rollout in turns[t].rollouts] if t < len(turns) else []
        for i, (turn, node) in enumerate(where):
            if turn == t - 1 and node in turns[turn].children:  # if revised, now its child group's one node
                turn, node = where[i] = t, turns[t].node(turns[turn].children[node], 0)
            if turn == t:  # a new answer is row `node` of each agent (aligned); a kept one costs nothing
                tokens[i] += sum(row_tokens[node] for _, row_tokens, _ in rows)
                seconds[i] += mean(row_seconds for _, _, row_seconds in rows)
        out.append([Sample(turns[turn].outputs[node], tokens[i], seconds[i], turns[turn].rewards[node])
                    for i, (turn, node) in enumerate(where)])
    return out


def team_reward_sums(agents, env, examples, cfg, expert=None, batch_size=8):
    """Per turn, the sum over `examples` of the greedy joint reward, and the count of answers with a
    verdict (train.py's in-training evaluation: each process sums its share, train.py divides the sums
    of all by their counts). -> (sums, counts), a list each"""
    # Greedy and one sample per example, so the number moves with the agents, not with the sampling.
    # The advantage is reset too, or remax would decode the same greedy turn again for its baseline.
    greedy = dataclasses.replace(cfg, num_generations=1, temperature=0.0, expand="all", advantage="mean")
    totals, judged = [0.0] * cfg.num_turns, [0] * cfg.num_turns
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        # A greedy answer needs no seed; a later turn's sample is the solved one kept or its revision.
        for t, samples in enumerate(run_team(env, agents, batch, greedy, [0] * len(batch), expert)):
            for sample in samples:  # One without a verdict (NaN) is left out, as eval.py's report does.
                reward = float(sample.reward)
                if not math.isnan(reward):
                    totals[t] += reward
                    judged[t] += 1
    return totals, judged


def run_sequential(env, agents, batch, cfg, seeds, expert=None):
    """Agent i writes after reading agents 0..i-1's outputs in its sample (env.sequential_prompt);
    their times add up."""
    # The first agent samples N answers per problem; each later one, one answer per sample, after
    # reading that sample's earlier answers, so that each sample is its own pipeline.
    N = cfg.num_generations
    first = [env.sequential_prompt(ex, 0, []) for ex in batch]
    rows = [per_row(magrpo.sample_agent(agents[0], 0, first, N, cfg, seeds))]
    seeds = [sampler.mix_seed(s, g) for s in seeds for g in range(N)]  # one per sample
    for i, agent in enumerate(agents[1:], 1):  # one prompt per sample, showing that sample's earlier outputs
        seen = zip(*[texts for texts, _, _ in rows])
        prompts = [env.sequential_prompt(batch[n // N], i, earlier) for n, earlier in enumerate(seen)]
        rows.append(per_row(magrpo.sample_agent(agent, i, prompts, 1, cfg, seeds)))
    texts, tokens, seconds = zip(*rows)  # per agent; their times add up
    return [[Sample(outputs, sum(toks), sum(seconds)) for outputs, toks in zip(zip(*texts), zip(*tokens))]]


def run_discussion(env, agents, batch, cfg, seeds, expert=None):
    """First answers as concat, then each agent revises after seeing them (env.discussion_prompt);
    scored on the revisions, the two rounds' costs added."""
    N, second = cfg.num_generations, []
    first = run_team(env, agents, batch, dataclasses.replace(cfg, num_turns=1), seeds)[0]
    # The seeds differ from the first round's (N + g), since a revision is a new draw, not a replay.
    seeds = [sampler.mix_seed(s, N + g) for s in seeds for g in range(N)]
    for i, agent in enumerate(agents):
        prompts = [env.discussion_prompt(batch[n // N], i, s.outputs) for n, s in enumerate(first)]
        second.append(per_row(magrpo.sample_agent(agent, i, prompts, 1, cfg, seeds)))
    texts, tokens, seconds = zip(*second)  # per agent; they revise side by side, so the wait is their mean
    return [[Sample(outputs, sample.tokens + sum(toks), sample.seconds + mean(seconds))
             for sample, outputs, toks in zip(first, zip(*texts), zip(*tokens))]]


def run_single(env, agents, batch, cfg, seeds, expert=None):
    """One model writes the whole solution (env.single_prompt); scored with env.single_reward."""
    # The paper's single baseline is a larger model (Qwen2.5-Coder-7B against two 3B agents), given
    # with --single-model; without it the first --model writes alone.
    prompts = [env.single_prompt(ex) for ex in batch]
    texts, toks, sec = per_row(magrpo.sample_agent(agents[0], 0, prompts, cfg.num_generations, cfg, seeds))
    return [[Sample((text,), n, sec) for text, n in zip(texts, toks)]]


def run_oracle(env, agents, batch, cfg, seeds, expert=None):
    """The dataset's canonical solution as every sample: checks the harness (pass@1 must be 1). A
    lower number is a harness bug (a test that needs the prompt's helpers, a sandbox too strict)."""
    return [[Sample(tuple(env.oracle_outputs(ex)), 0, 0.0) for ex in batch
             for _ in range(cfg.num_generations)]]


# magrpo and concat are the same runner; only the agents differ (trained, or the untrained --model).
RUNNERS = {"magrpo": run_team, "concat": run_team, "sequential": run_sequential,
           "discussion": run_discussion, "single": run_single, "oracle": run_oracle}


def score_batch(env, batch, samples, single=False):
    """A turn's sample records, per problem; unscored samples go through magrpo.score_joint, a
    problem's identical outputs once."""
    N = len(samples) // len(batch)
    # A problem's identical answers (greedy decoding, a tiny model's favourite output) are scored
    # once, because the reward is a function of (problem, answer) and the sandbox is the slow part.
    unique = list(dict.fromkeys((n // N, s.outputs) for n, s in enumerate(samples) if s.reward is None))
    # The single model's answer holds both parts; the env scores it with its single-agent reward.
    one = (lambda ex, out: env.single_reward(ex, out[0])) if single else None
    examples, outputs = [batch[b] for b, _ in unique], [o for _, o in unique]
    scored = dict(zip(unique, magrpo.score_joint(env, examples, outputs, one) if unique else []))
    recs = [sample_record(scored[(n // N, s.outputs)] if s.reward is None else s.reward, s.tokens, s.seconds,
                          s.outputs) for n, s in enumerate(samples)]
    return [recs[b * N:(b + 1) * N] for b in range(len(batch))]

# -----------------------------------------------------------------------------
# Metrics (Sec. 6)


def pass_at_k(n, c, k):
    """Unbiased pass@k of n samples, c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), as
    1 - prod_{i=n-c+1}^{n} (1 - k/i) (no huge binomials); 1.0 when n - c < k."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _number(v):  # a finite int or float; bools count, since a level may be one, and NaN would poison means
    return isinstance(v, (int, float)) and math.isfinite(v)


def sample_record(reward, tokens=0, seconds=0.0, outputs=()):
    """One joint sample's numbers: float(reward), its levels and numeric fields (a tuple t as t_0, t_1,
    ...); a reward without a verdict (a magrpo.ScoreError, a sandbox that failed: float() NaN) or one
    float() refuses keeps its error, and the metrics leave it out (aggregate)."""
    error = reward.error if isinstance(reward, magrpo.ScoreError) else getattr(reward, "sandbox_error", None)
    rec = {"reward": 0.0, "tokens": tokens, "seconds": seconds, "outputs": outputs, "error": error,
           "levels": {}, "fields": {}}
    if error is not None:
        return rec
    try:
        total = float(reward)
        if not math.isfinite(total):
            raise ValueError(f"non-finite reward {total}")
    except Exception as e:  # one bad sample, not a crash
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec
    rec["reward"], fields = total, rec["fields"]
    rec["levels"] = {k: float(v) for k, v in getattr(reward, "levels", {}).items() if _number(v)}
    # Every number the reward carries (tests passed, ratios, ...) goes to the report's details, so
    # an env's own reward class is measured without eval.py knowing it.
    for f in dataclasses.fields(reward) if dataclasses.is_dataclass(reward) else ():
        v = getattr(reward, f.name)
        if _number(v):
            fields[f.name] = float(v)
        elif isinstance(v, tuple):
            fields.update({f"{f.name}_{i}": float(x) for i, x in enumerate(v) if _number(x)})
    if "passed" in fields and "n_tests" in fields:  # a code reward, whose tests pass@k and acc@k read
        rec["tests"] = (int(fields["passed"]), int(fields["n_tests"]))
    return rec


def tests_rate(rec):  # acc@k's unit gives partial credit, where pass@k is all or nothing (a rate of 1)
    """The share of the problem's tests a sample passed: 0 if it never reached the tests (a program
    that does not parse counts as a failure, not as missing)."""
    passed, total = rec.get("tests", (0, 0))
    return passed / total if total else 0.0


def test_metrics(problems, ks):
    """pass@k (unbiased), pass_any@k (the authors': any of the first k samples passes) and acc@k (the
    best test pass rate among the first k samples), each a mean over problems (Sec. 6)."""
    # Each problem's samples stay in sampling order, since the authors' pass@k reads the first k and the
    # unbiased estimator all n (Chen et al. 2021). Both are reported, under different names. A sample
    # without a verdict (an error) is no failure: it is left out, and a problem with none left too.
    rates = []  # per problem, its judged samples' test pass rates
    for records in problems:
        judged = [tests_rate(r) for r in records if r["error"] is None]
        if judged:
            rates.append(judged)
    unbiased, authors, acc = {}, {}, {}  # each k's, so that the report lists pass@k, then pass_any@k, acc@k
    # A sample passes when its rate is 1 (every test passed), so a problem's c is p.count(1).
    for k in ks:
        unbiased[f"pass@{k}"] = mean(pass_at_k(len(p), p.count(1), k) if 1 in p else 0.0 for p in rates)
        authors[f"pass_any@{k}"] = mean(1 in p[:k] for p in rates)
        acc[f"acc@{k}"] = mean(max(p[:k]) for p in rates)
    return {**unbiased, **authors, **acc}


def aggregate(problems, ks):
    """One method's (metrics, details) from its problems' sample records: test metrics are means over
    problems, the rest over samples; a level a sample lacks counts 0 (it was gated). A sample without a
    verdict is counted under errors and left out of everything else."""
    errors = sum(r["error"] is not None for recs in problems for r in recs)
    samples = [r for recs in problems for r in recs if r["error"] is None]
    # pass@k and the cooperation rate exist only where the reward says so (coding), so that no
    # metric means nothing for the env (a writing task has no tests).
    metrics = test_metrics(problems, ks) if any("tests" in r for r in samples) else {}
    if any("cooperation" in r["levels"] for r in samples):
        metrics["coop_rate"] = mean(r["levels"].get("cooperation", 0.0) > 0 for r in samples)
    # Every env reports the shared reward itself, the number the team was trained on; its std is the
    # sample std over samples (Bessel's n - 1, as metrics.jsonl's), not a standard error.
    rewards = [r["reward"] for r in samples]
    metrics.update(reward=mean(rewards), reward_std=sample_std(rewards),
                   tokens_per_sample=mean(r["tokens"] for r in samples),
                   seconds_per_sample=mean(r["seconds"] for r in samples), errors=errors)
    # The details (the "reward detail" table) say how often each level was earned and the mean of every
    # other number the rewards carry, so that they show where a method loses its reward, level by level.
    metrics.update(level_means([r["levels"] for r in samples]))
    details, levels = {}, list(dict.fromkeys(k for r in samples for k in r["levels"]))  # reward's order
    for name in levels:
        details[f"earned/{name}"] = mean(r["levels"].get(name, 0.0) > 0 for r in samples)
    for name in dict.fromkeys(k for r in samples for k in r["fields"] if k not in levels):
        details[name] = mean(r["fields"][name] for r in samples if name in r["fields"])
    return metrics, details

# -----------------------------------------------------------------------------
# What a training step scored (OUT/metrics.jsonl; docs/runs.md lists the keys) and the learning curve


def finite(x):
    """x, or None where it is NaN (no verdict) or infinite: JSON has no NaN."""
    return x if math.isfinite(x) else None


def mean(xs):
    """The mean of the numbers `xs`, 0 for none."""
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def sample_std(xs):
    """The sample standard deviation (Bessel's n - 1, torch.std in float32), 0 for fewer than 2 values:
    the one std of the report and of metrics.jsonl."""
    return torch.tensor(xs).std().item() if len(xs) > 1 else 0.0


def episode_summary(turns):
    """Each node of the step's episodes as plain data (gathered under torchrun): its turn, reward,
    levels, whether it is solved or could not be scored, and its gain over the node it revises."""
    nodes = []
    for t, turn in enumerate(turns, 1):
        for node, reward in enumerate(turn.rewards):
            # The mean over a turn of a revised answer's gain over the one it revises is the metric
            # improvement_turn<t>; every group of a turn has the same number of nodes.
            parent = turn.groups[turn.group_action(node)[0]].parent
            gain = None if parent is None else float(reward) - float(turns[t - 2].rewards[parent])
            # A sandbox that failed, or a scoring that raised, says nothing of the agents, so it counts apart.
            nodes.append({"turn": t, "reward": float(reward), "gain": gain, "solved": turn.solved[node],
                          "levels": dict(getattr(reward, "levels", None) or {}),
                          "sandbox_error": getattr(reward, "sandbox_error", None) is not None,
                          "score_error": isinstance(reward, magrpo.ScoreError)})
    return nodes


def level_means(levels, suffix=""):
    """The mean of each reward level over the samples (their `levels` dicts); a level a sample lacks
    counts 0: it was gated off by a level before it."""
    means = {}
    for name in dict.fromkeys(name for node_levels in levels for name in node_levels):  # the reward's order
        means[f"level_{name}{suffix}"] = mean(float(node_levels.get(name, 0.0)) for node_levels in levels)
    return means


def episode_metrics(nodes, num_turns):
    """A step's row of metrics.jsonl from its nodes (every process's); None for a turn no node reached.
    Turn 1's keys have no suffix (the single-turn names); then each turn's, _turn1 included. A node
    without a verdict (reward NaN) is counted in sandbox_errors or score_errors, and left out of the rest."""
    errors = {"sandbox_errors": sum(node["sandbox_error"] for node in nodes),
              "score_errors": sum(node["score_error"] for node in nodes)}
    nodes = [node for node in nodes if not math.isnan(node["reward"])]
    first = [node for node in nodes if node["turn"] == 1]
    rewards = torch.tensor([node["reward"] for node in first] or [math.nan])  # float32, as the curves were
    m = {"reward_mean": rewards.mean().item(), "reward_std": sample_std([node["reward"] for node in first]),
         "reward_max": rewards.max().item(), **level_means([node["levels"] for node in first])}
    # Every row has every turn's keys, None for a turn no group reached (all solved before it), so that
    # the columns of metrics.jsonl stay the same from the first row to the last.
    for t in range(1, num_turns + 1):
        turn = [node for node in nodes if node["turn"] == t]
        rewards = torch.tensor([node["reward"] for node in turn] or [math.nan])
        m[f"reward_mean_turn{t}"] = rewards.mean().item() if turn else None
        m[f"reward_max_turn{t}"] = rewards.max().item() if turn else None
        m[f"terminated_turn{t}"] = mean(node["solved"] for node in turn) if turn else None
        if t > 1:  # how much revising gained over the answers it revised (that had a verdict)
            gains = [node["gain"] for node in turn if not math.isnan(node["gain"])]
            m[f"improvement_turn{t}"] = mean(gains) if turn else None
        m.update(level_means([node["levels"] for node in turn], f"_turn{t}"))
    return {**m, **errors}

# The learning curve, OUT/curve.svg, drawn from metrics.jsonl's rows

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def curve_series(rows):
    """The curve's lines, {name: [(step, value), ...]}: turn 1's reward and levels, the last turn's
    reward when there are several turns, and the in-training eval's reward."""
    last = max(int(k[len("reward_mean_turn"):]) for k in rows[0] if k.startswith("reward_mean_turn"))
    # Turn 1's reward and its levels show where the reward comes from, and which level the agents learn.
    names = [k for k in rows[0] if k == "reward_mean" or (k.startswith("level_") and "_turn" not in k)]
    if last > 1:
        names.append(f"reward_mean_turn{last}")
    names.append("eval_reward_mean")
    series = {}
    for name in names:
        points = [(row["step"], row[name]) for row in rows if row.get(name) is not None]
        if points:  # without an eval there is no line
            series[name] = points
    return series


def ticks(lo, hi, count=5, least=0.0):
    """About `count` round values from lo to hi (steps of 1, 2 or 5 times a power of ten, at least
    `least`: steps are whole), for an axis."""
    raw = (hi - lo) / max(1, count - 1)
    unit = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = max(least, next(m * unit for m in (1, 2, 5, 10) if m * unit >= raw))
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]


def curve_svg(rows, width=760, height=400, pad=50, legend=190, max_reward=None):
    """The learning curve of metrics.jsonl's rows as a small SVG (no plotting library needed):
    curve_series, smoothed, on axes with titles and ticks; max_reward (the env's), the reward the curve
    climbs to, has a tick and a dashed line of its own."""
    # The SVG is written by hand, since a plotting library would be one more dependency for one picture.
    series = curve_series(rows)
    steps = [step for points in series.values() for step, _ in points]
    # One y-axis runs from 0 to the highest value, so the levels show what part of the reward each earns.
    reach = [max_reward] if max_reward is not None and math.isfinite(max_reward) else []
    top = max([value for points in series.values() for _, value in points] + reach) or 1.0
    x0, x1 = min(steps), max(max(steps), min(steps) + 1)
    right, bottom = width - legend, height - pad  # the plot's right and lower edges; the legend beyond
    window = max(1, len(rows) // 30)  # about 30 windows in a run, smooth with no step hidden

    def x_of(step):
        return pad + (step - x0) / (x1 - x0) * (right - pad)

    def y_of(value):
        return bottom - max(0.0, value) / top * (bottom - pad)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>',
             f'<path d="M{pad},{pad}V{bottom}H{right}" stroke="black" fill="none"/>']
    # A tick is a short mark and its label; round values let a reader place a point between them.
    for value in ticks(0.0, top):
        parts.append(f'<path d="M{pad - 4},{y_of(value):.1f}H{pad}" stroke="black"/><text x="{pad - 6}" '
                     f'y="{y_of(value) + 4:.1f}" text-anchor="end">{value:g}</text>')
    for value in reach:  # the maximum, labelled unless a round tick is it already
        label = "" if any(abs(value - tick) < 1e-9 for tick in ticks(0.0, top)) else f"{value:g}"
        parts.append(f'<path d="M{pad - 4},{y_of(value):.1f}H{right}" stroke="gray" stroke-dasharray="4,4"/>'
                     f'<text x="{pad - 6}" y="{y_of(value) + 4:.1f}" text-anchor="end">{label}</text>')
    for step in ticks(x0, x1, least=1):
        parts.append(f'<path d="M{x_of(step):.1f},{bottom}V{bottom + 4}" stroke="black"/>'
                     f'<text x="{x_of(step):.1f}" y="{bottom + 16}" text-anchor="middle">{step:g}</text>')
    smoothed = f" (each point the mean of {window} steps)" if window > 1 else ""
    parts += [f'<text x="{(pad + right) / 2}" y="{height - 12}" text-anchor="middle">step</text>',
              f'<text transform="translate(14,{height / 2}) rotate(-90)" text-anchor="middle">'
              f'reward and its levels{smoothed}</text>']
    for n, (name, points) in enumerate(series.items()):
        color = COLORS[n % len(COLORS)]
        values = [value for _, value in points]
        # Each value averaged with the window - 1 before it (the first ones, with what there is).
        values = [mean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]
        line = " ".join(f"{x_of(step):.1f},{y_of(value):.1f}" for (step, _), value in zip(points, values))
        parts.append(f'<polyline points="{line}" stroke="{color}" fill="none" stroke-width="1.5"/>')
        parts.append(f'<text x="{right + 10}" y="{pad + 16 * n}" fill="{color}">{name}</text>')
    return "\n".join(parts + ["</svg>\n"])

# -----------------------------------------------------------------------------
# Command line


def parse_args(argv=None):
    """eval.py's flags: the env's and the model's (as train.py's), the sampling fields of Config, and
    the evaluation's own. Flags left None are filled by check_flags."""
    p = runs.flag_parser(__doc__)
    p.set_defaults(env=None)  # demo, unless the --agents run's args.json names its env (read_run)
    runs.add_config_flags(p, SAMPLING_FIELDS)
    p.add_argument("--limit", type=int, help="evaluate the first N problems of the split")
    p.add_argument("--methods", help=f"comma list of {', '.join(METHODS)} (default: all the env supports)")
    p.add_argument("--agents", help="a train.py --out directory holding agent_0, agent_1, ... "
                   "(method magrpo)")
    p.add_argument("--single-model", help="the single baseline's model (default: the first --model)")
    p.add_argument("--num-samples", type=int, default=15, help="joint samples per problem (paper: 15)")
    p.add_argument("--k", help="comma list of k for pass@k/acc@k (default: 1,3,5,10 up to --num-samples)")
    p.add_argument("--batch-size", type=int, default=4, help="problems per generate call")
    p.add_argument("--latency-problems", type=int, default=3, help="problems timed at batch 1 for "
                   "latency_seconds (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the JSON report here")
    p.add_argument("--save-outputs", action="store_true", help="keep every sample's texts in the report")
    runs.show_defaults(p, "eval", {})
    return p.parse_args(argv)


def comma_list(text):  # "a, b,,c" -> ["a", "b", "c"], since a stray comma or space is no error
    return [x.strip() for x in text.split(",") if x.strip()]


# What eval.py takes from the --agents run's args.json for each of these flags the user did not give,
# so that the agents are measured on the task they learnt and the baselines run their base model.
RUN_FLAGS = ("env", "dataset", "text_field", "num_agents", "model", "chat_template")


def read_run(args):
    """--agents OUT: OUT/args.json (train.py's resolved flags, {} without one); each of RUN_FLAGS the
    user left out is taken from it, and one line says so, and one more where a flag given differs."""
    path = os.path.join(args.agents or "", "args.json")
    if args.agents and not os.path.isdir(args.agents):
        raise ValueError(f"--agents: {args.agents!r} is not a directory")
    if not (args.agents and os.path.isfile(path)):
        return {}
    with open(path) as f:
        saved = json.load(f)
    taken, differ = {}, []
    for name in RUN_FLAGS:
        flag, value, mine = "--" + name.replace("_", "-"), saved.get(name), getattr(args, name)
        # --model may be given repeated or as a comma list, and only the names count.
        same = mine == value or (name == "model" and mine and models.model_names(args) == value)
        if value in (None, False) or same:  # an earlier train.py saved None for some
            continue
        shown = ",".join(value) if name == "model" else value
        if mine in (None, False):
            setattr(args, name, value)
            taken[name] = flag if value is True else f"{flag} {shown}"
        else:
            differ.append(f"{flag} (the run's: {shown})")
    if taken:
        print(f"eval.py: note: from {path}: {' '.join(taken.values())}", file=sys.stderr)
    if differ:
        print(f"eval.py: note: the agents of {args.agents} were trained otherwise than asked: "
              f"{', '.join(differ)}", file=sys.stderr)
    # A data file is all one split, and the run trained on part of it, so without --split eval.py would
    # score the whole file, the training rows included.
    if "dataset" in taken and os.path.exists(args.dataset) and args.split is None:
        raise ValueError(f"--split: the run in {args.agents} trained on the file {args.dataset} (--split "
                         f"{saved.get('split')}): give the rows to evaluate, e.g. --split test (a file with "
                         "named splits, such as CoopHumanEval's) or a slice the run did not train on")
    return saved


def check_flags(args):
    """Fill the defaults and check every flag that needs no env or model."""
    saved = read_run(args)
    args.env = args.env or "demo"
    # The agents' base decides the threads, since a tiny run's agents are as small as the tiny model.
    tiny_base = all(m == models.TINY for m in models.model_names(args))
    args.cpu_threads = models.cpu_threads(args.cpu_threads, tiny_base)
    # The --agents run's length first, as its agents write as long as they learnt to; then the paper's
    # evaluation sampling (Sec. 6) for real models, and the tiny model's short outputs for it.
    runs.fill_defaults(args, {"max_new_tokens": saved.get("max_new_tokens") or None})
    runs.fill_defaults(args, runs.run_defaults("eval", tiny_base and not args.agents))
    # --latency-problems 0 skips the timing; every other count must be at least 1.
    for flag, value, least in (("--num-samples", args.num_samples, 1), ("--batch-size", args.batch_size, 1),
                               ("--limit", args.limit, 1), ("--latency-problems", args.latency_problems, 0)):
        if value is not None and value < least:
            raise ValueError(f"{flag}: must be >= {least}, got {value}")
    # Config checks the sampling flags (one line naming the flag); the report records each value used.
    runs.fill_defaults(args, dataclasses.asdict(sample_cfg(args)))
    # The paper's k (1, 3, 5, 10) are kept where --num-samples allows, as pass@10 of 5 samples means nothing.
    try:
        args.ks = ([k for k in (1, 3, 5, 10) if k <= args.num_samples] if args.k is None
                   else sorted({int(k) for k in comma_list(args.k)}))
    except ValueError:
        raise ValueError(f"--k: want a comma list of integers, got {args.k!r}") from None
    if not args.ks or args.ks[0] < 1 or args.ks[-1] > args.num_samples:
        raise ValueError(f"--k: every k must be in 1..--num-samples ({args.num_samples}), got {args.k!r}")
    if args.methods is not None:  # in the order given, each once
        args.methods = list(dict.fromkeys(comma_list(args.methods)))
        unknown = [m for m in args.methods if m not in METHODS]
        if unknown or not args.methods:
            raise ValueError(f"--methods: unknown {', '.join(unknown) or 'empty list'}: "
                             f"use {', '.join(METHODS)}")
    # Checked now, not after an hour of sampling, since a report that can't be written is a lost evaluation.
    if args.out and not os.access(os.path.dirname(os.path.abspath(args.out)), os.W_OK):
        raise ValueError(f"--out: cannot write into the directory of {args.out!r}")


def unsupported(env, examples, method):
    """Why the env cannot run `method` on these problems, or None. Asked before any model loads: by
    default eval.py runs every method the env can, and a method asked for by name must run."""
    try:
        if method == "single":
            env.single_prompt(examples[0])
        elif method == "discussion":
            env.discussion_prompt(examples[0], 0, [""] * env.num_agents)
        elif method == "oracle":
            for ex in examples:
                env.oracle_outputs(ex)
    except Exception as e:  # ValueError from the env's hooks, KeyError from data without solutions
        return f"{method}: {e}"
    return None


def load_agents(args, methods, n):
    """Each method's agents: the trained ones (magrpo with --agents), the single model, or the untrained
    --model. A model named twice on one device loads once (a tiny one per seed), and LoRA agents on one
    base and device share it: a GPU holds each model once, whatever the number of methods using it."""
    loaded, bases, agents = {}, {}, {}
    for method in methods:
        names, flag = ([] if method == "oracle" else args.models), "--model"
        if method == "magrpo" and args.agents:
            names, flag = trained_dirs(args.agents, n), "--agents"
        elif method == "single":
            names, flag = [args.single_model or args.models[0]], "--single-model"
        agents[method] = []
        for i, (name, device) in enumerate(zip(names, args.devices)):
            key = (name, device, args.seed + i if name == models.TINY else None)  # concat's are discussion's
            if key not in loaded:
                loaded[key] = agent = models.load_agent(name, device, args.dtype, args.seed + i, flag,
                                                        args.chat_template, bases=bases)
                # One-off first-call costs (allocations, kernel choice, --compile's compilation) stay
                # out of the timings. A prompt length the warm-up did not have still compiles anew.
                sampler.generate(agent.model, agent.tokenizer, ["warm up"], 1, 2, compile=args.compile)
            agents[method].append(loaded[key])
    return agents


def trained_dirs(out, n):
    """A train.py run's final agents (OUT/agent_i, with OUT/final.json), else its latest complete
    checkpoint's (said on stderr)."""
    dirs = [os.path.join(out, f"agent_{i}") for i in range(n)]
    # final.json is written after the last OUT/agent_i. Without it those may be an older run's, or
    # half-written by a run that was killed, and the newest complete checkpoint is the run's truth.
    if not os.path.isfile(os.path.join(out, "final.json")):
        checkpoint = runs.latest_checkpoint(out)
        if checkpoint is not None:
            print(f"eval.py: note: the run in {out} did not finish: using its latest checkpoint, "
                  f"{checkpoint[1]} (step {checkpoint[0]})", file=sys.stderr)
            dirs = [os.path.join(checkpoint[1], f"agent_{i}") for i in range(n)]
    missing = [d for d in dirs if not os.path.isdir(d)]
    if missing:
        raise ValueError(f"--agents: no {missing[0]} (want agent_0..agent_{n - 1} from train.py --out)")
    return dirs


def setup(args):
    """Every flag checked and every model loaded before any sampling: (env, examples, each method's
    agents, the expert reviewer or None)."""
    check_flags(args)
    # Without --split we take the test split of a dataset that has named ones, else the whole file given.
    env = runs.env_from_flags(args, default_split="test")  # a forgotten flag must not score training data
    args.split = env.split  # the rows scored: a split's name, or a slice (":" for a whole file)
    if env.runs_code:  # what the sandbox runs the model's code with, for the report
        args.sandbox, args.test_timeout = env.isolation, env.test_timeout
    examples = env.examples[:args.limit]  # the first --limit, the same problems for every method
    if not examples:
        raise ValueError(f"--dataset/--split: the {env.name} env has no problems to evaluate")
    if args.methods is None:  # every method this env can run
        args.methods = [m for m in METHODS if unsupported(env, examples, m) is None]
    for method in args.methods:
        why = unsupported(env, examples, method)
        if why:  # a method the user asked for that this env cannot run
            raise ValueError(f"--methods: {why}")
    # Baselines of another model than the agents' base compare apples with pears, so we say so.
    if args.agents and not args.model and not os.path.isfile(os.path.join(args.agents, "args.json")) and \
            set(args.methods) - {"magrpo", "oracle"}:
        print("eval.py: note: the baselines use the tiny model; give --model (the base the agents were "
              "trained from) for a fair comparison", file=sys.stderr)
    # Every model is loaded now, before any sampling, so that a bad --agents or --single-model fails at once.
    args.devices = models.agent_devices(args.device, env.num_agents)  # the report records them
    args.models = models.per_agent(models.model_names(args), env.num_agents, "--model")
    models.set_torch(args.cpu_threads, args.devices)
    agents = load_agents(args, args.methods, env.num_agents)
    return env, examples, agents, models.load_expert(args, args.devices[0])


def cell_text(value):
    """A table cell: a float to 4 significant digits, "-" for a metric the method lacks (a writing
    method has no pass@k; the oracle has no latency)."""
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_table(rows, title):
    """Methods as rows, metrics as columns, each column as wide as its name (at least 8)."""
    cols = list(dict.fromkeys(k for metrics in rows.values() for k in metrics))
    if not cols:
        return ""
    w0 = max(len(title), *(len(m) for m in rows))
    widths = [max(8, len(c)) for c in cols]
    lines = [" ".join([title.ljust(w0)] + [c.rjust(w) for c, w in zip(cols, widths)])]
    for method, metrics in rows.items():
        cells = [cell_text(metrics.get(c)).rjust(w) for c, w in zip(cols, widths)]
        lines.append(" ".join([method.ljust(w0)] + cells))
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    try:
        env, examples, agents, expert = setup(args)
    except ValueError as e:  # every bad flag, from any layer, ends in one line and exit 1
        sys.exit(f"eval.py: error: {e}")
    report = evaluate(args, env, examples, agents, expert)
    # The report records every setting used, so that a number in it can be reproduced.
    report["config"] = {**vars(args), "env_name": env.name, "num_problems": len(examples)}
    for t, turn in enumerate(report["turns"], 1):
        print(format_table(turn["methods"], "method" if args.num_turns == 1 else f"turn {t}"))
    if args.num_turns > 1:
        print(format_table(report["improvement"], f"turn {args.num_turns} - turn 1"))
    print(format_table(report["details"], "reward detail"))  # the last turn's, to show how each level fared
    if args.out:
        runs.write_atomic(args.out, json.dumps(report, indent=1))
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
