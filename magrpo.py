"""
MAGRPO: Multi-Agent Group Relative Policy Optimization, in the paper's order (Liu et al., arXiv
2508.04652). Read it with the paper open; single_turn_step is one whole step of Sec. 2, top to bottom.

n agents cooperate on one task. Each agent i sees only its own prompt h_i and samples G completions
from its own policy (sample_agent; the sampler itself is sampler.py). The g-th completions of all
agents form the g-th joint action (joint_actions), scored with one shared reward R^(g) (score_joint):

    Eq. 1   A^(g) = R^(g) - mean_g' R^(g')                           -> group_advantages
    Eq. 2   J(theta_i) = E[ A^(g) * log pi_theta_i(a_i^(g) | h_i) ]  -> completion_logprobs, policy_loss

then one AdamW step per agent per batch. On-policy: no ratio, no clipping, no KL. Multi-turn (Sec. 3):
the env's feedback on a joint answer goes into each agent's next prompt (rollout_team), and Eq. 1
compares siblings, the revisions of one node (episode_advantages). With the default --expand best
(only each group's best node is revised) R is each turn's own reward; with --expand all it is the
node's return, r + gamma * the mean of its children's returns (node_return; gamma is --discount,
which only --expand all reads).

The order below: Config; Sec. 2 steps 1-3 (sample, join, score); Eq. 1; Eq. 2;
single_turn_step; Sec. 3's tree of turns and train_step, its step for every setting (turns, cross
joint actions, ReMax). A course blanks some of these functions (tests/make_assignment.py --list names
them); pytest -k NAME runs each one's tests. Try it: python train.py (the CPU demo).
"""
import dataclasses
import itertools
import math
import warnings
from dataclasses import dataclass, field

import torch

from sampler import (eos_token_ids, forward_kwargs, generate, joined, mix_seed, positions_from_mask,
                     shared_prompt_rows, token_logprobs)

# -----------------------------------------------------------------------------
# The knobs of one step. The defaults are the paper's where it fixes one (Sec. 2: G = 4, 256 new
# tokens, Eq. 1 without the std, Eq. 2 on summed log-probs, aligned joint actions; Sec. 3: gamma 0.9,
# the best node revised, solved at the maximum reward). The others are plain choices: sampling at T 1
# without a cut (a run takes each env's sampling, the authors', from its settings), every turn's loss
# weighing 1, and level feedback (the paper's came from an expert model). Each field is a flag of
# train.py (num_generations is --num-generations), and those that sampling and the turns read of
# eval.py (eval.SAMPLING_FIELDS); their help, choices and checks are runs.py's.


@dataclass
class Config:
    """The settings of a MAGRPO step (runs.checked_config makes one from flags, each value checked)."""
    num_generations: int = 4         # G, completions per agent per prompt (Sec. 2 step 1)
    max_new_tokens: int = 256        # tokens per completion at most
    temperature: float = 1.0         # sampling temperature (0: greedy)
    top_p: float = 1.0               # nucleus sampling: the most likely tokens up to this mass
    top_k: int = 0                   # sample among the k most likely tokens only (0: off)
    logprob: str = "cut"             # Eq. 2's log-prob under a top-k/top-p cut: cut or full (TRL's)
    compile: bool = False            # torch.compile the sampler's decode step
    joint: str = "aligned"           # joint actions: aligned (G, the paper) or cross (G^n)
    advantage: str = "mean"          # Eq. 1's baseline: mean (the paper), rloo, none, remax or critic
    scale_rewards: str = "none"      # advantages / the std of their group or batch (GRPO), or none
    loss_type: str = "seq_sum"       # Eq. 2's normalisation (policy_loss): seq_sum is the paper's
    mask_truncated_completions: bool = False  # completions that never reached EOS get no gradient
    max_grad_norm: float = 0.0       # clip each agent's gradient norm to this (0: off, as the paper)
    micro_batch_size: int = 8        # rows per log-prob forward/backward (memory, not maths)
    num_turns: int = 1               # T: answer, get feedback, revise (Sec. 3; 1: single turn)
    expand: str = "best"             # multi-turn: revise the best joint answer of each group, or all
    discount: float = 0.9            # gamma of node_return, with --expand all
    termination_threshold: float = None  # a reward that reaches it is solved (None: the env's max)
    turn_weights: tuple = None       # each turn's loss weight (None: all 1)
    feedback: str = "level"          # between turns: level, plain or expert
    feedback_max_new_tokens: int = 256  # bound on the expert's review (--feedback expert)

    # The values each choice takes. A value that no step knows would change nothing, silently, so a
    # Config refuses it (runs.checked_config also takes TRL's names for them, and names the flag).
    CHOICES = {"joint": ("aligned", "cross"), "advantage": ("mean", "rloo", "none", "remax", "critic"),
               "scale_rewards": ("none", "group", "batch"),
               "loss_type": ("seq_sum", "token_mean", "seq_mean", "token_budget"), "expand": ("best", "all"),
               "feedback": ("level", "plain", "expert"), "logprob": ("cut", "full")}

    def __post_init__(self):
        for name, choices in self.CHOICES.items():
            if getattr(self, name) not in choices:
                value = getattr(self, name)
                raise ValueError(f"Config.{name}: use one of {', '.join(choices)}, got {value!r}")

    def on_the_tree(self):
        """Whether a step takes Sec. 3's tree (train_step): several turns, or an option that
        single_turn_step, the paper's Sec. 2, leaves to it (cross, ReMax, a critic, turn weights, truncation
        masks)."""
        options = (self.joint != "aligned", self.advantage in ("remax", "critic"),
                   self.mask_truncated_completions)
        return self.num_turns > 1 or any(options) or self.turn_weights not in (None, (1.0,))


# -----------------------------------------------------------------------------
# Sec. 2 step 1: each agent samples G completions of its own prompt.


def sample_agent(agent, i, prompts, size, cfg, seeds):
    """Agent i samples `size` completions of each of its prompts in one generate call, prompt b
    seeded with mix_seed(seeds[b], i). Decentralised: it sees nothing of the other agents."""
    return generate(agent.model, agent.tokenizer, list(map(agent.format, prompts)), size, cfg.max_new_tokens,
                    cfg.temperature, cfg.top_p, cfg.top_k, [mix_seed(s, i) for s in seeds], cfg.compile)


def sample_team(agents, prompts, size, cfg, seeds):
    """Every agent samples (sample_agent): prompts[i] are agent i's. A models.Team samples in one generate
    call, each row through its own agent's adapter: the same tokens. -> a Rollout per agent"""
    if getattr(agents, "model", None) is None:
        return [sample_agent(agent, i, prompts[i], size, cfg, seeds) for i, agent in enumerate(agents)]
    texts = [agents[i].format(prompt) for i, agent_prompts in enumerate(prompts) for prompt in agent_prompts]
    agent_seeds = [mix_seed(seed, i) for i in range(len(agents)) for seed in seeds]
    adapters = [i for i, agent_prompts in enumerate(prompts) for _ in agent_prompts]
    return generate(agents.model, agents[0].tokenizer, texts, size, cfg.max_new_tokens, cfg.temperature,
                    cfg.top_p, cfg.top_k, agent_seeds, cfg.compile, adapters).split()

# -----------------------------------------------------------------------------
# Sec. 2 steps 2-3: joint actions, and one shared reward for each


def joint_actions(num_agents, num_generations, mode="aligned"):
    """Which completions form one prompt's joint actions, as tuples (g_0, ..., g_{n-1}): agent i gives
    its g_i-th. aligned: the g-th of every agent (G joint actions); cross: every combination (G^n)."""
    if mode == "aligned":
        return [(g,) * num_agents for g in range(num_generations)]
    return list(itertools.product(range(num_generations), repeat=num_agents))


def credited_returns(returns, joint, num_agents, num_generations):
    """Per agent, [B, G]: each completion's credit, the mean return of the joint actions it takes
    part in (aligned: its one joint action's) and have a verdict (NaN: none). `returns` is [B, len(joint)],
    in `joint`'s order."""
    # members[i][j, g] is 1 where joint action j uses agent i's g-th completion.
    members = torch.nn.functional.one_hot(torch.tensor(joint).T, num_generations).float()
    judged = (~returns.isnan()).float()
    return [returns.nan_to_num(0.0) @ members[i] / (judged @ members[i]) for i in range(num_agents)]


@dataclass
class ScoreError:
    """The reward of a joint action whose scoring raised: no verdict, NaN; the error kept for the logs."""
    error: str

    def __float__(self):
        return math.nan


def score_joint(env, examples, outputs, score_one=None):
    """The shared reward of each (example, joint output): env.rewards on the batch, else one by one with
    `score_one` (default env.reward), where one broken answer gets a ScoreError and costs only its reward."""
    if score_one is None:
        try:
            return list(env.rewards(examples, outputs))
        except Exception:  # find the culprit, one by one
            score_one = env.reward
    rewards = []
    for ex, out in zip(examples, outputs):
        try:
            rewards.append(score_one(ex, out))
        except Exception as e:
            rewards.append(ScoreError(f"{type(e).__name__}: {e}"[:500]))
    return rewards

# -----------------------------------------------------------------------------
# Eq. 1 and Eq. 2


def group_advantages(rewards, mode="mean", baseline=None, scale="none"):
    """Eq. 1 over the last dim (the G joint actions of one prompt). mode, the baseline: mean: A = R - mean R
    (the paper; no std, after Dr. GRPO); rloo: R minus the mean of the other G - 1; none: A = R (REINFORCE);
    remax: R - `baseline`, one per group, its greedy joint answer's reward (ReMax, Li et al. 2023). scale:
    none (the paper), or A / (std + 1e-4) of its group (GRPO) or of all the rewards (batch), stds unbiased
    as TRL's. A NaN reward (no verdict) gets A = 0, out of every mean and std, as do groups of < 2 verdicts.
    rewards: [..., G], a tensor or lists, G >= 2 (else ValueError). -> float32, the rewards' shape."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.shape[-1] < 2:
        raise ValueError(f"group_advantages needs a group of at least 2, got {rewards.shape[-1]}")
    judged = ~rewards.isnan()  # An answer nobody judged is no failure: it teaches nothing either way.
    G = judged.sum(-1, keepdim=True)  # the group's verdicts
    rewards = rewards.where(judged, 0.0)
    centered = (rewards - rewards.sum(-1, keepdim=True) / G) * judged
    if mode == "mean":
        advantages = centered
    elif mode == "rloo":  # R - (sum - R) / (G - 1) = G / (G - 1) * (R - mean)
        advantages = centered * G / (G - 1)
    elif mode == "none":
        advantages = rewards
    elif mode == "remax":
        advantages = rewards - torch.as_tensor(baseline, dtype=torch.float32)[..., None]
    else:  # std is mean with scale="group" (Config resolves the name)
        raise ValueError(f"group_advantages: no baseline {mode!r}: use mean, rloo, none or remax")
    # The 1e-4 keeps a group of equal rewards at 0 (not 0 / 0), and makes near-equal ones large, not huge.
    if scale == "group":  # unbiased, as TRL's GRPO
        advantages = advantages / ((centered ** 2).sum(-1, keepdim=True) / (G - 1)).sqrt().add(1e-4)
    elif scale == "batch":
        advantages = advantages / (rewards[judged].std() + 1e-4)
    return advantages.where(judged & (G >= 2) & ~advantages.isnan(), 0.0)  # (NaN: a remax baseline's)


def critic_advantages(returns, values):
    """Eq. 1 with a learned baseline in place of the group's mean (--advantage critic): A = R - V(s),
    V(s) the critic's value of the state the completions were sampled from (critic.py), so that a group
    of one (G = 1) has an advantage too; a NaN return (no verdict) gets 0. returns: [states, G]; values:
    [states]. -> float32 [states, G]."""
    returns = torch.as_tensor(returns, dtype=torch.float32)
    return (returns - torch.as_tensor(values, dtype=torch.float32)[:, None]).nan_to_num(0.0)


def row_logprobs(model, rollout, temperature=1.0):
    """log pi_theta(a_t | h, a_<t) of every completion token (Eq. 2), the textbook way: each row,
    prompt and completion, in one forward pass, where the logits at position t score token t + 1.
    The reference that completion_logprobs, which computes the same with less, is tested against."""
    T = temperature if temperature > 0 else 1.0
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
    scores = torch.log_softmax(logits[:, :-1].float() / T, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return scores[:, rollout.prompt_ids.shape[1] - 1:]  # ids[:, :-1] predicts ids[:, 1:]: the completion's


def completion_logprobs(model, rollout, temperature=1.0):
    """log pi_theta(a_t | h, a_<t) of every completion token of a sampler.Rollout (Eq. 2) at the sampling
    temperature (greedy: T = 1), over the logits / T above each token's floor where it has floors (a
    top-k/top-p cut). -> float32 [rows, T] with grad; the caller masks the positions after EOS."""
    T = temperature if temperature > 0 else 1.0
    # A group's rows share their prompt, which runs once for them with their completions after it, each
    # attending to the prompt and to itself (Prefix Grouper, Liu et al. 2025): the same gradient, for less.
    ids, mask, positions, predicting = shared_prompt_rows(model, rollout)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True,
                use_cache=False, **forward_kwargs(model, last=1))
    hidden = out.hidden_states[-1].flatten(0, 1)[predicting]  # [rows, T, H], each predicting a token
    # The logits over the vocabulary, the pass's largest tensors, are made a chunk at a time (sampler).
    return token_logprobs(model, hidden, rollout.completion_ids, T, check=out, floors=rollout.floors)


def policy_loss(logprobs, mask, advantages, loss_type="seq_sum", normalizer=None):
    """Eq. 2 as a loss to minimise, -A^(g) * log pi(a^(g) | h), one advantage per sequence:
    seq_sum      -mean_s(A_s * sum_t m*lp)             (the paper: a completion's summed log-probs)
    token_mean   -sum_{s,t}(A_s * m * lp) / sum(m)     (DAPO: every token weighs the same)
    seq_mean     -mean_s(A_s * sum_t(m*lp) / sum_t m)  (original GRPO)
    token_budget -sum_{s,t}(A_s * m * lp) / (rows * T) (Dr. GRPO: T the token budget, default the mask's)
    logprobs, mask: [rows, T], mask 1 up to and including EOS; advantages: [rows], a tensor or a list;
    normalizer: the whole batch's count (loss_normalizer; default this batch's). -> a scalar, with grad."""
    mask = mask.to(logprobs.dtype)
    adv = torch.as_tensor(advantages, dtype=logprobs.dtype, device=logprobs.device).reshape(-1)
    masked = (logprobs * mask).sum(-1)  # per sequence; 0 * lp gives padding no gradient
    if loss_type == "seq_mean":
        masked = masked / mask.sum(-1).clamp(min=1)
    total = (adv * masked).sum()  # seq_sum and token_mean differ only in the denominator
    return -total / (normalizer if normalizer is not None else loss_normalizer(mask, loss_type))


def loss_normalizer(mask, loss_type, max_new_tokens=None):
    """policy_loss's denominator: tokens (token_mean), sequences (seq_sum, seq_mean) or, for token_budget,
    sequences times the budget, max_new_tokens (default: the mask's width)."""
    if loss_type == "token_mean":
        return float(mask.sum())
    if loss_type == "token_budget":
        return mask.shape[0] * (max_new_tokens or mask.shape[1])
    return mask.shape[0]


def loss_mask(rollout, eos_ids=None):
    """The completion mask of Eq. 2's loss; given eos_ids, 0 on the rows that never reached EOS (cut at
    max_new_tokens), which then teach nothing (DAPO's overlong filtering)."""
    mask = rollout.completion_mask
    if eos_ids is None:
        return mask
    last = rollout.completion_ids.gather(1, mask.sum(-1, keepdim=True).clamp(min=1) - 1)
    return mask * torch.isin(last, torch.tensor(eos_ids, device=last.device))


def micro_batches(num_rows, group_size, micro_batch_size):
    """Ranges [start, stop) of <= micro_batch_size rows, whole groups where they fit (a prompt runs once)."""
    step = micro_batch_size // group_size * group_size or micro_batch_size
    return [(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]

def update_agent(agent, i, parts, cfg, all_sum=lambda x: x):
    """Eq. 2, steps 4-6, for agent i: the policy gradient of `parts`, (rollout, loss mask, advantages, weight)
    a turn, a micro-batch of rows at a time, then its AdamW step. -> its metrics, each name ending in _i"""
    agent.model.eval()  # Dropout is off, so the gradient is of the very policy that sampled.
    agent.model.zero_grad(set_to_none=True)  # A call cut short (an OOM, a ^C) may have left some.
    # Each part's loss is divided by its whole batch's count, of all processes (0 for a turn one missed).
    counts = [loss_normalizer(mask, cfg.loss_type, cfg.max_new_tokens) for _, mask, _, _ in parts]
    counts = all_sum(counts + [0.0] * (cfg.num_turns - len(parts)))
    loss_sum, drift, tokens, drift_max = 0.0, 0.0, 0.0, 0.0
    for (rollout, mask, advantages, weight), count in zip(parts, counts):
        for start, stop in micro_batches(len(rollout), rollout.num_generations, cfg.micro_batch_size):
            if not advantages[start:stop].any():  # These rows' loss and gradient would be 0 anyway.
                continue
            rows = rollout.rows(start, stop, cut=cfg.logprob == "cut")  # full: Eq. 2 before the cut (TRL's)
            logprobs = completion_logprobs(agent.model, rows, cfg.temperature)
            rows_mask = mask[start:stop, :logprobs.shape[1]]
            loss = weight * policy_loss(logprobs, rows_mask, advantages[start:stop], cfg.loss_type, count)
            loss.backward()
            loss_sum = loss_sum + loss.detach()
            # The sampler's log-probs should be these, but for --logprob full's gap to the cut by design.
            gaps = (logprobs.detach() - rows.logprobs).abs() * rows.completion_mask
            drift, drift_max = drift + float(gaps.sum()), max(drift_max, float(gaps.max()))
            tokens += float(rows.completion_mask.sum())
    metrics = optimizer_step(agent, loss_sum, all_sum, cfg.max_grad_norm)
    drift, tokens = all_sum([drift, tokens])
    metrics["logprob_drift"] = drift / tokens if tokens else None
    metrics["logprob_drift_max"] = drift_max if tokens else None  # (this process's rows)
    return {f"{name}_{i}": value for name, value in metrics.items()}

# -----------------------------------------------------------------------------
# The step on the tree (train_step) samples and updates through these: a plain list of agents one at a
# time (sample_agent, update_agent), a models.Team of LoRA agents on one base in one batch.


def update_team(agents, parts, cfg, all_sum=lambda x: x):
    """Eq. 2, steps 4-6, for every agent: update_agent, one agent at a time (the reference). A models.Team's
    agents take each micro-batch in one forward/backward, a row through its agent's adapter, so that each
    adapter gets the gradient of its own pass; then each its own AdamW step. -> metrics, names ending _i"""
    if getattr(agents, "model", None) is None:
        metrics = {}
        for i, agent in enumerate(agents):
            metrics.update(update_agent(agent, i, parts[i], cfg, all_sum))
        return metrics
    counts, seen = [], [dict(loss=0.0, drift=0.0, tokens=0.0, drift_max=0.0) for _ in agents]
    for agent, agent_parts in zip(agents, parts):  # as update_agent begins
        agent.model.eval()
        agent.model.zero_grad(set_to_none=True)
        count = [loss_normalizer(mask, cfg.loss_type, cfg.max_new_tokens) for _, mask, _, _ in agent_parts]
        counts.append(all_sum(count + [0.0] * (cfg.num_turns - len(agent_parts))))
    for t, (rollout, *_) in enumerate(parts[0]):
        for start, stop in micro_batches(len(rollout), rollout.num_generations, cfg.micro_batch_size):
            batch = [i for i in range(len(agents)) if parts[i][t][2][start:stop].any()]  # (all 0: none)
            if not batch:
                continue
            rows = [parts[i][t][0].rows(start, stop, cut=cfg.logprob == "cut") for i in batch]
            logprobs = completion_logprobs(agents.model, joined(rows, batch), cfg.temperature)
            loss = 0.0
            for i, agent_rows, lp in zip(batch, rows, logprobs.split(stop - start)):
                _, mask, advantages, weight = parts[i][t]
                lp = lp[:, :agent_rows.completion_ids.shape[1]]  # (the pass's rows are as wide as the widest)
                rows_mask, rows_advantages = mask[start:stop, :lp.shape[1]], advantages[start:stop]
                agent_loss = weight * policy_loss(lp, rows_mask, rows_advantages, cfg.loss_type, counts[i][t])
                loss = loss + agent_loss
                gaps = (lp.detach() - agent_rows.logprobs).abs() * agent_rows.completion_mask
                seen[i]["loss"] += agent_loss.detach()
                seen[i]["drift"] += float(gaps.sum())
                seen[i]["tokens"] += float(agent_rows.completion_mask.sum())
                seen[i]["drift_max"] = max(seen[i]["drift_max"], float(gaps.max()))
            loss.backward()  # (models.TeamLoRALinear.hand_out gives each adapter its share)
    metrics = {}
    for i, agent in enumerate(agents):  # as update_agent ends
        agent_metrics = optimizer_step(agent, seen[i]["loss"], all_sum, cfg.max_grad_norm)
        drift, tokens = all_sum([seen[i]["drift"], seen[i]["tokens"]])
        agent_metrics["logprob_drift"] = drift / tokens if tokens else None
        agent_metrics["logprob_drift_max"] = seen[i]["drift_max"] if tokens else None
        metrics.update({f"{name}_{i}": value for name, value in agent_metrics.items()})
    return metrics

# -----------------------------------------------------------------------------
# Sec. 2, one whole step, top to bottom: read it first. Sec. 3's tree below runs the other settings
# (several turns, cross joint actions) on the same functions; with one turn it gives the same step.


def single_turn_step(agents, env, examples, cfg, seeds, all_sum=lambda x: x, may_update=None):
    """Sec. 2's MAGRPO step, one turn (where not cfg.on_the_tree()), a seed per example. all_sum(x): x, a list
    or a tensor, summed over the processes sharing the batch; may_update(rewards): the caller's word before
    a weight changes. -> (rollouts, rewards, advantages, metrics)"""
    if cfg.on_the_tree():
        raise ValueError("single_turn_step runs Sec. 2 alone: this Config's turns, cross, remax, critic, "
                         "turn weights or truncation masks are train_step's")
    G, turn_seeds = cfg.num_generations, [mix_seed(seed, 1) for seed in seeds]  # turn 1's, as in Sec. 3
    # Step 1: each agent samples G completions of its own prompt, seeing nothing of the others.
    prompts = list(zip(*[env.prompts(example) for example in examples]))  # per agent, one per example
    rollouts = [sample_agent(agent, i, prompts[i], G, cfg, turn_seeds) for i, agent in enumerate(agents)]
    # Steps 2-3: the g-th completions of the agents form the g-th joint action; the env scores it.
    outputs = list(zip(*[list(itertools.chain(*rollout.texts)) for rollout in rollouts]))  # prompt by prompt
    rewards = score_joint(env, [example for example in examples for _ in range(G)], outputs)
    if may_update is not None and not may_update(rewards):
        return rollouts, rewards, None, None
    # Eq. 1 among a prompt's G joint actions; both a NaN (no verdict, A = 0) and an all-0 group are counted.
    values = torch.tensor([float(r) for r in rewards]).view(-1, G)  # a row of G per prompt
    advantages = group_advantages(values, cfg.advantage, None, cfg.scale_rewards).view(-1)
    counts = all_sum([int((advantages.view(-1, G) == 0).all(-1).sum()), int(values.isnan().sum())])
    metrics = {"zero_adv_groups": int(counts[0]), "no_verdict": int(counts[1])}
    # Eq. 2, steps 4-6: every agent's policy gradient on the shared reward's advantages, then its step.
    for i, (agent, rollout) in enumerate(zip(agents, rollouts)):
        part = (rollout, rollout.completion_mask, advantages, 1.0)  # its one turn, weighing 1
        metrics.update(update_agent(agent, i, [part], cfg, all_sum))
    return rollouts, rewards, advantages, metrics

# -----------------------------------------------------------------------------
# Sec. 3: the return of a node of the multi-turn tree


def node_return(reward, child_returns, gamma):
    """R_t = r_t + gamma * mean(R_{t+1} of the node's children); a node without children: r_t. reward and
    child_returns: anything float() takes (an env's number, a tensor, a ScoreError). -> a Python float."""
    child_returns = [float(r) for r in child_returns]
    if not child_returns:
        return float(reward)
    return float(reward) + gamma * sum(child_returns) / len(child_returns)


def solved_return(reward, turns_left, gamma):
    """A solved node (its reward reached the threshold: not revised) is an absorbing state that keeps
    its reward for the turns it skips, r + gamma r + ..., so it shares its revised siblings' horizon."""
    value = float(reward)
    for _ in range(turns_left):
        value = node_return(reward, [value], gamma)
    return value

# -----------------------------------------------------------------------------
# A team's episode (Sec. 2 steps 1-3; Sec. 3): sample, join, score, and between turns feedback.
# The episode is a tree. At turn 1 each example is a group of G joint actions (its nodes); a node
# that is revised becomes a group of the next turn, whose prompts hold that node's answers and the
# env's feedback on them.

@dataclass
class Group:
    """One prompt per agent, each sampled Turn.size times: an example at turn 1, later a revised node."""
    example: int  # index of the example in the batch
    parent: int  # the node of the previous turn this group revises (None at turn 1)
    prompts: list  # one env prompt per agent
    histories: list  # per agent, [(its own answer, the feedback it got), ...] of earlier turns
    seed: int  # the group's sampling seed; agent i samples with mix_seed(seed, i)


@dataclass
class Turn:
    """One turn of the batch: its groups, each of `size` completions per agent (rollout rows) and
    len(joint) joint actions (its nodes). The methods below name the tree's indices."""
    groups: list
    size: int  # completions per agent per group
    rollouts: list  # one Rollout per agent
    joint: list  # index tuples of one group's joint actions
    outputs: list  # per node, one text per agent
    rewards: list  # per node, the env's reward, whose float() is the number
    solved: list  # per node, whether its reward reached the termination threshold
    children: dict = field(default_factory=dict)  # revised node -> its group at the next turn
    baseline: list = None  # with remax at turn 1, per group, the reward of the greedy joint answer
    advantages: list = None  # per agent, each row's advantage in Eq. 2 (train_step sets it)

    def node(self, group, action):
        """The node of group `group`'s joint action number `action` (an index into `joint`)."""
        return group * len(self.joint) + action

    def group_action(self, node):
        """(its group, its joint action's number): node's inverse."""
        return divmod(node, len(self.joint))

    def values(self):
        """The rewards as numbers, [groups, J]."""
        return torch.tensor([float(r) for r in self.rewards]).view(len(self.groups), len(self.joint))

    def zero_advantage_groups(self):
        """How many groups have every agent's every advantage 0 (group k's rows: k * size + g)."""
        per_group = torch.stack(self.advantages).view(len(self.advantages), len(self.groups), self.size)
        return int((per_group == 0).all(-1).all(0).sum())


def sample_turn(agents, env, examples, groups, size, cfg, threshold, greedy=False):
    """Sample every group of a turn (a generate call per agent), join and score (Sec. 2 steps 1-3); a
    node whose reward reaches `threshold` is solved. greedy (remax): also each group's baseline."""
    prompts = list(zip(*[group.prompts for group in groups]))  # per agent, one per group
    seeds = [group.seed for group in groups]
    rollouts = sample_team(agents, prompts, size, cfg, seeds)
    joint = joint_actions(len(agents), size, cfg.joint)
    outputs, node_examples = [], []
    for k, group in enumerate(groups):
        for action in joint:
            outputs.append(tuple(rollout.texts[k][g] for rollout, g in zip(rollouts, action)))
            node_examples.append(examples[group.example])
    rewards = score_joint(env, node_examples, outputs)
    solved = [float(r) >= threshold - 1e-9 for r in rewards]
    turn = Turn(groups, size, rollouts, joint, outputs, rewards, solved)
    if greedy:  # ReMax's baseline is the reward of the agents' greedy joint answer, one per group.
        greedy_cfg = dataclasses.replace(cfg, temperature=0.0, joint="aligned")
        greedy_turn = sample_turn(agents, env, examples, groups, 1, greedy_cfg, threshold)
        turn.baseline = [float(r) for r in greedy_turn.rewards]
    return turn


def turn_of_step(env, examples, cfg, seeds, rollouts, rewards, advantages):
    """single_turn_step's results as the tree's one Turn: the record that a caller's logs read."""
    groups, outputs = [], []
    joint = joint_actions(len(rollouts), cfg.num_generations)
    for b, ex in enumerate(examples):  # Turn 1's groups, as rollout_team makes them.
        groups.append(Group(b, None, list(env.prompts(ex)), [[] for _ in rollouts], mix_seed(seeds[b], 1)))
        outputs += zip(*[rollout.texts[b] for rollout in rollouts])  # aligned, as single_turn_step's
    solved = [float(r) >= solved_threshold(env, cfg) - 1e-9 for r in rewards]
    return Turn(groups, cfg.num_generations, rollouts, joint, outputs, rewards, solved,
                advantages=[advantages] * len(rollouts))


def solved_threshold(env, cfg):
    """The reward at which a joint answer is solved (not revised): --termination-threshold, by default
    the env's maximum (an env without one, max_reward None: never solved)."""
    if cfg.termination_threshold is not None:
        return cfg.termination_threshold
    max_reward = getattr(env, "max_reward", None)
    return math.inf if max_reward is None else max_reward


def expand_nodes(turn, mode):
    """The nodes of `turn` that get children at the next turn. all: every node not solved. best: each
    group's best node (ties to the first) unless the whole group is solved. That is the rule of the
    authors' code from the paper's time (August 2025), which skipped turn 2 only where all G joint
    answers had reached the maximum: a solved best answer is still revised, and the revision teaches
    the agents to keep what is right."""
    if mode == "all":
        return [node for node in range(len(turn.outputs)) if not turn.solved[node]]
    values = turn.values().nan_to_num(-math.inf)  # an answer without a verdict is nobody's best
    all_solved = torch.tensor(turn.solved).view(values.shape).all(-1)  # per group: is every node solved?
    return [turn.node(k, int(values[k].argmax())) for k in range(len(turn.groups)) if not all_solved[k]]


def team_feedback(env, examples, turn, nodes, cfg, expert=None):
    """The env's feedback on each node's joint answer, one text per agent (Sec. 3). expert: an expert
    model first reviews each agent's part of every node, greedily, all in one generate call."""
    n = len(turn.rollouts)
    groups = [turn.groups[turn.group_action(node)[0]] for node in nodes]
    cases = [(examples[group.example], turn.outputs[node]) for group, node in zip(groups, nodes)]
    reviews = [None] * len(nodes)
    if cfg.feedback == "expert":
        asks = itertools.product(cases, range(n))  # (node, agent i), node by node
        prompts = [expert.format(env.expert_prompt(ex, outputs, i)) for (ex, outputs), i in asks]
        rollout = generate(expert.model, expert.tokenizer, prompts, 1, cfg.feedback_max_new_tokens,
                           temperature=0)
        texts = [group[0] for group in rollout.texts]
        reviews = [texts[start:start + n] for start in range(0, len(texts), n)]  # node k's n reviews
    return [env.feedback(ex, outputs, cfg.feedback, reward=turn.rewards[node], reviews=node_reviews)
            for (ex, outputs), node, node_reviews in zip(cases, nodes, reviews)]


def revision_groups(env, examples, turn, nodes, notes, t):
    """Sec. 3: each revised node becomes a group of turn t + 1. Each agent's new prompt holds its own
    earlier answers and the feedback it got, never a partner's answer: execution stays decentralised."""
    groups = []
    for node, node_notes in zip(nodes, notes):
        group_index, action = turn.group_action(node)
        parent = turn.groups[group_index]
        histories, prompts = [], []
        for i, history in enumerate(parent.histories):
            histories.append(history + [(turn.outputs[node][i], node_notes[i])])
            prompts.append(env.revision_prompt(examples[parent.example], i, histories[i]))
        turn.children[node] = len(groups)
        groups.append(Group(parent.example, node, prompts, histories, mix_seed(parent.seed, t, action)))
    return groups


def rollout_team(agents, env, examples, cfg, seeds, expert=None, children=None):
    """One episode per example, seeds one per example (Sec. 2 steps 1-3; Sec. 3) -> its Turns. The
    nodes of expand_nodes get the env's feedback and are revised, each `children` times (default G)."""
    threshold = solved_threshold(env, cfg)
    groups = []
    for b, ex in enumerate(examples):
        groups.append(Group(b, None, list(env.prompts(ex)), [[] for _ in agents], mix_seed(seeds[b], 1)))
    size = cfg.num_generations
    turns = []
    for t in range(1, cfg.num_turns + 1):
        remax = t == 1 and cfg.advantage == "remax"
        turn = sample_turn(agents, env, examples, groups, size, cfg, threshold, greedy=remax)
        turns.append(turn)
        nodes = expand_nodes(turn, cfg.expand) if t < cfg.num_turns else []
        if not nodes:
            break
        notes = team_feedback(env, examples, turn, nodes, cfg, expert)
        groups = revision_groups(env, examples, turn, nodes, notes, t)
        size = children or cfg.num_generations
    return turns


def episode_returns(turns, gamma, num_turns):
    """Per turn, each node's return, [groups, J], from the last turn back: solved_return of a solved
    node not revised (over the turns it skips), else node_return over its children (a leaf: its reward)."""
    returns = [None] * len(turns)
    for t in reversed(range(len(turns))):
        turn, values = turns[t], []
        for node, reward in enumerate(turn.rewards):
            group = turn.children.get(node)
            if group is None and turn.solved[node]:
                values.append(solved_return(reward, num_turns - 1 - t, gamma))
            else:  # Its children's returns with a verdict (not NaN) count; a leaf not solved has none.
                children = [] if group is None else returns[t + 1][group].tolist()
                values.append(node_return(reward, [r for r in children if not math.isnan(r)], gamma))
        returns[t] = torch.tensor(values).view(len(turn.groups), len(turn.joint))
    return returns


def turn_returns(turns, cfg):
    """Per turn, the R of each node that Eq. 1 compares, [groups, J]. all: the returns (every sibling is
    revised or solved: one horizon); best: each turn's rewards (only the best has a next turn: a return
    would favour it)."""
    if cfg.expand == "all":
        return episode_returns(turns, cfg.discount, cfg.num_turns)
    return [turn.values() for turn in turns]


def episode_advantages(turns, cfg, values=None):
    """Eq. 1 among siblings: per turn, per agent, an advantage per rollout row, on turn_returns. cross: a
    completion's credit is its joint actions' mean. --advantage critic: R - V, values[turn][agent] the
    critic's V of each of the turn's groups (critic_advantages)."""
    advantages = []
    for t, (turn, turn_values) in enumerate(zip(turns, turn_returns(turns, cfg))):
        credits = credited_returns(turn_values, turn.joint, len(turn.rollouts), turn.size)
        if cfg.advantage == "critic":
            advantages.append([critic_advantages(credit, value).view(-1)
                               for credit, value in zip(credits, values[t])])
            continue
        # remax compares with the greedy joint answer, which only turn 1 has, so later turns use the mean.
        mode = "mean" if cfg.advantage == "remax" and not turn.baseline else cfg.advantage
        advantages.append([group_advantages(credit, mode, turn.baseline, cfg.scale_rewards).view(-1)
                           for credit in credits])
    return advantages

# -----------------------------------------------------------------------------
# Sec. 2 steps 4-6 on the tree: Eq. 2 for every agent on every turn, then one step of its own
# optimizer each (AdamW, models.make_optimizer).


def train_step(agents, env, examples, cfg, seeds, expert=None, all_sum=lambda x: x, may_update=None,
               critic=None):
    """One MAGRPO step on a batch of examples, seeds one per example, with Sec. 3's tree of turns: the
    team's episodes, Eq. 1 among siblings, Eq. 2's update of every agent. With one turn of aligned joint
    actions it is single_turn_step's step; all_sum and may_update are as there (may_update sees every
    turn's rewards).
    critic: the learned V(s) of --advantage critic (critic.py). -> (turns, metrics); metrics None when
    may_update said no."""
    if (cfg.advantage == "critic") != (critic is not None):
        raise ValueError(f"--advantage {cfg.advantage}: a critic goes with --advantage critic alone")
    # Sec. 2 steps 1-3: each agent samples G completions of its own prompt, their g-th ones form a
    # joint action, and the env scores it. With several turns (Sec. 3), feedback and revision grow
    # each example's episode into a tree of such groups.
    turns = rollout_team(agents, env, examples, cfg, seeds, expert)
    if may_update is not None and not may_update([reward for turn in turns for reward in turn.rewards]):
        return turns, None
    # Eq. 1 gives each completion its advantage among its siblings, the completions of one prompt. A
    # group whose advantages are all 0 teaches nothing, and their count explains a loss of 0.
    values = features = None
    if critic is not None:
        # The critic's V of every group's prompts (its state), per turn and agent; it reads the agents as
        # they began, so its fit below takes the same features.
        features = critic.features([group.prompts for turn in turns for group in turn.groups])
        sizes = [len(turn.groups) for turn in turns]
        values = list(zip(*[value.split(sizes) for value in critic.values(features)]))
    for turn, advantages in zip(turns, episode_advantages(turns, cfg, values)):
        turn.advantages = advantages
    zero_groups = sum(turn.zero_advantage_groups() for turn in turns)
    no_verdict = sum(int(turn.values().isnan().sum()) for turn in turns)  # joint answers given A = 0
    counts = all_sum([zero_groups, no_verdict])
    metrics = {"zero_adv_groups": int(counts[0]), "no_verdict": int(counts[1])}
    if critic is not None:
        # The critic learns this step's returns only now, after its values gave their advantages: a
        # baseline that had seen the very return it is subtracted from would cancel part of it, and the
        # gradient would be biased.
        metrics.update(critic.fit(features, torch.cat(turn_returns(turns, cfg)), all_sum))
    # Eq. 2, steps 4-6: every agent's own policy gradient on the shared reward's advantages, then its
    # own AdamW step. Each turn is a part of the loss, with its weight (--turn-weights).
    weights = cfg.turn_weights or [1.0] * cfg.num_turns
    parts = []
    for i, agent in enumerate(agents):
        # Eq. 2's masks; --mask-truncated-completions leaves out the rows cut before their EOS.
        eos_ids = eos_token_ids(agent.model, agent.tokenizer) if cfg.mask_truncated_completions else None
        parts.append([(turn.rollouts[i], loss_mask(turn.rollouts[i], eos_ids), turn.advantages[i], weight)
                      for turn, weight in zip(turns, weights)])
    metrics.update(update_team(agents, parts, cfg, all_sum))
    return turns, metrics


def optimizer_step(agent, loss, all_sum=lambda x: x, max_grad_norm=0.0):
    """One agent's AdamW step on its gradients summed by all_sum, clipped to max_grad_norm (0: off, as the
    paper); their norm is logged before clipping; a step with anything not finite is skipped, warned."""
    params = [p for p in agent.model.parameters() if p.requires_grad]
    for p, anyone in zip(params, all_sum([p.grad is not None for p in params])):  # some process has it
        if anyone:
            p.grad = all_sum(p.grad if p.grad is not None else torch.zeros_like(p))
    (loss,) = all_sum([float(loss)])
    grads = [p.grad for p in params if p.grad is not None]
    grad_norm = torch.stack([grad.float().norm() for grad in grads]).norm().item() if grads else 0.0
    skipped = not (math.isfinite(loss) and math.isfinite(grad_norm))
    if skipped:
        warnings.warn(f"non-finite loss ({loss}) or grad norm ({grad_norm}): skipping this agent's step")
    else:
        if 0 < max_grad_norm < grad_norm:  # as torch's clip_grad_norm_ (TRL's)
            for grad in grads:
                grad.mul_(max_grad_norm / (grad_norm + 1e-6))
        agent.optimizer.step()  # Parameters without a gradient (all advantages 0) are left alone.
    agent.model.zero_grad(set_to_none=True)
    return {"loss": loss, "grad_norm": grad_norm, "skipped": int(skipped)}
