"""
MAGRPO: Multi-Agent Group Relative Policy Optimization, in the paper's order (Liu et al., arXiv
2508.04652). Read it with the paper open; train_step, at the end, is one whole step.

n agents cooperate on one task. Each agent i sees only its own prompt h_i and samples G completions
from its own policy (sample_agent; the sampler itself is sampler.py). The g-th completions of all
agents form the g-th joint action (joint_actions), scored with one shared reward R^(g) (score_joint):

    Eq. 1   A^(g) = R^(g) - mean_g' R^(g')                           -> group_advantages
    Eq. 2   J(theta_i) = E[ A^(g) * log pi_theta_i(a_i^(g) | h_i) ]  -> completion_logprobs, policy_loss

then one AdamW step per agent per batch. On-policy: no ratio, no clipping, no KL. Multi-turn (Sec. 3):
the env's feedback on a joint answer goes into each agent's next prompt (rollout_team); a node's
return adds gamma times its children's mean (node_return); Eq. 1 compares siblings
(episode_advantages).

The order below: Config; the agents; Sec. 2 steps 1-3 (sample, join, score); Eq. 1; Eq. 2; Sec. 3's
tree of turns; train_step. A course blanks some of these functions (tests/make_assignment.py --list
names them); pytest -k NAME runs each one's tests. Try it: python train.py (the CPU demo).
"""
import dataclasses
import itertools
import math
import warnings
from dataclasses import dataclass, field

import torch

from sampler import (forward_kwargs, generate, mix_seed, positions_from_mask, shared_prompt_rows,
                     token_logprobs)

# -----------------------------------------------------------------------------
# The knobs of one step. Each Config field is also a flag of train.py and eval.py (num_generations
# becomes --num-generations), with the help written beside it here. The defaults are the paper's
# (Sec. 2); envs.DEFAULTS holds the few that depend on the run (the tiny model, the env).



def option(default, help):
    """A Config field: its default, and the help of its command-line flag."""
    return field(default=default, metadata={"help": help})


@dataclass
class Config:
    """The settings of a MAGRPO step, checked on creation (a bad one names its flag)."""
    num_generations: int = option(4, "G, completions per agent per prompt (Sec. 2 step 1)")
    max_new_tokens: int = option(256, "tokens per completion at most")
    temperature: float = option(1.0, "sampling temperature (0: greedy)")
    top_p: float = option(1.0, "nucleus sampling: keep the most likely tokens up to this mass")
    top_k: int = option(0, "sample among the k most likely tokens only (0: off)")
    logprob: str = option("cut", "Eq. 2's log-prob under top-k/top-p: cut (of the distribution that drew "
                                 "the token) or full (before the cut, as TRL and the authors)")
    compile: bool = option(False, "torch.compile the sampler's decode step (a CUDA graph on a GPU)")
    joint: str = option("aligned", "joint actions: aligned (G of them, the paper) or cross (G^n)")
    advantage: str = option("mean", "Eq. 1's baseline: mean (the paper), rloo, std, none or remax")
    loss_type: str = option("seq_sum", "Eq. 2's normalisation: seq_sum (paper), token_mean, seq_mean")
    micro_batch_size: int = option(8, "rows per log-prob forward/backward (memory, not maths)")
    num_turns: int = option(1, "T: answer, get feedback, revise (Sec. 3; 1: single turn)")
    expand: str = option("best", "multi-turn: revise the best joint answer of each group, or all")
    discount: float = option(0.9, "gamma of node_return, with --expand all (best: turn rewards)")
    termination_threshold: float = option(None, "a joint answer whose reward reaches it is solved "
                                                "(None: env max)")
    turn_weights: tuple = option(None, "comma list, each turn's loss weight (e.g. 1.2,0.8; None: all 1)")
    feedback: str = option("level", "between turns: level, plain or expert")
    feedback_max_new_tokens: int = option(256, "bound on the expert's review (--feedback expert)")

    CHOICES = {"joint": ("aligned", "cross"), "advantage": ("mean", "rloo", "std", "none", "remax"),
               "loss_type": ("seq_sum", "token_mean", "seq_mean"), "expand": ("best", "all"),
               "feedback": ("level", "plain", "expert"), "logprob": ("cut", "full")}

    def __post_init__(self):
        if self.turn_weights is not None:
            given = self.turn_weights
            weights = given.split(",") if isinstance(given, str) else given  # the flag is a comma list
            try:
                self.turn_weights = tuple(float(w) for w in weights)
            except ValueError:
                raise ValueError(f"--turn-weights: want a comma list of numbers, got {given!r}") from None
        for name, choices in self.CHOICES.items():
            self.check(name, getattr(self, name) in choices, f"use one of {', '.join(choices)}")
        for name in ("num_generations", "max_new_tokens", "micro_batch_size", "num_turns",
                     "feedback_max_new_tokens"):
            self.check(name, getattr(self, name) >= 1, "must be >= 1")
        self.check("temperature", self.temperature >= 0, "must be >= 0 (0 is greedy)")
        self.check("top_p", 0 < self.top_p <= 1, "must be in (0, 1]")
        self.check("top_k", self.top_k >= 0, "must be >= 0 (0: no top-k cut)")
        self.check("discount", 0 <= self.discount <= 1, "must be in [0, 1]")
        one_per_turn = self.turn_weights is None or len(self.turn_weights) == self.num_turns
        self.check("turn_weights", one_per_turn, f"give one weight per turn ({self.num_turns})")

    def check(self, name, ok, why):
        if not ok:
            raise ValueError(f"--{name.replace('_', '-')}: {why}, got {getattr(self, name)!r}")



@dataclass
class Agent:
    """One policy pi_theta_i with its own tokenizer and optimizer (a team may mix models)."""
    model: torch.nn.Module
    tokenizer: object
    optimizer: object = None
    chat_template: bool = False  # raw prompts by default, as the paper (Sec. 4)

    def format(self, prompt):
        """The text this agent's model sees for an env prompt."""
        if not self.chat_template:
            return prompt
        return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                  tokenize=False, add_generation_prompt=True)


# -----------------------------------------------------------------------------
# Sec. 2 step 1: each agent samples G completions of its own prompt.


def sample_agent(agent, i, prompts, size, cfg, seeds):
    """Agent i samples `size` completions of each of its prompts in one generate call, prompt b
    seeded with mix_seed(seeds[b], i). Decentralised: it sees nothing of the other agents."""
    texts = [agent.format(p) for p in prompts]
    return generate(agent.model, agent.tokenizer, texts, size, cfg.max_new_tokens, cfg.temperature,
                    cfg.top_p, cfg.top_k, seed=[mix_seed(s, i) for s in seeds], compile=cfg.compile)

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
    part in (aligned: its one joint action's). `returns` is [B, len(joint)], in `joint`'s order."""
    # members[i][j, g] is 1 where joint action j uses agent i's g-th completion.
    members = torch.nn.functional.one_hot(torch.tensor(joint).T, num_generations).float()
    return [returns @ members[i] / members[i].sum(0) for i in range(num_agents)]


@dataclass
class ScoreError:
    """The reward of a joint action whose scoring raised: 0, the error kept for logs and feedback."""
    error: str

    def __float__(self):
        return 0.0


def score_joint(env, examples, outputs, one=None):
    """The shared reward of each (example, joint output): env.rewards on the batch, else one by one with
    `one` (default env.reward), where one broken answer gets a ScoreError and costs only its reward."""
    if one is None:
        try:
            return list(env.rewards(examples, outputs))
        except Exception:  # find the culprit, one by one
            one = env.reward
    rewards = []
    for ex, out in zip(examples, outputs):
        try:
            rewards.append(one(ex, out))
        except Exception as e:
            rewards.append(ScoreError(f"{type(e).__name__}: {e}"[:500]))
    return rewards

# -----------------------------------------------------------------------------
# Eq. 1 and Eq. 2


def group_advantages(rewards, mode="mean", baseline=None):
    """Eq. 1 over the last dim (the G joint actions of one prompt). mean: A = R - mean R (the paper;
    no division by the std, after Dr. GRPO); rloo: R minus the mean of the other G - 1; std: the
    original GRPO z-score (R - mean) / std, 0 where the group's std is 0; none: A = R (REINFORCE);
    remax: R - `baseline`, one per group: its greedy joint answer's reward (ReMax, Li et al. 2023). rewards:
    [..., G], a tensor or lists, G >= 2 (else ValueError); std is unbiased (G - 1). -> float32, same shape."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    G = rewards.shape[-1]
    if G < 2:
        raise ValueError(f"group_advantages needs a group of at least 2, got {G}")
    if mode == "none":
        return rewards
    if mode == "remax":
        return rewards - torch.as_tensor(baseline, dtype=torch.float32)[..., None]
    centered = rewards - rewards.mean(-1, keepdim=True)
    if mode == "rloo":  # R - (sum - R) / (G - 1) = G / (G - 1) * (R - mean)
        return centered * G / (G - 1)
    if mode == "std":
        std = rewards.std(-1, keepdim=True)  # unbiased, as TRL's GRPO
        return torch.where(std > 1e-6, centered / std.clamp(min=1e-6), torch.zeros_like(centered))
    return centered


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
    """log pi_theta(a_t | h, a_<t) of every completion token (Eq. 2) at the sampling temperature
    (greedy: T = 1): row_logprobs' values, with less work. rollout: a sampler.Rollout, its prompt ids
    and mask [rows, P] left-padded, its completion ids and mask [rows, T]; where its floors are given
    (a top-k/top-p cut), each token's softmax is over the logits / T at or above its floor, the
    distribution that drew it. -> float32 [rows, T] with grad; the positions after a row's EOS are
    to be masked by the caller."""
    T = temperature if temperature > 0 else 1.0
    # A group's G rows continue the same prompt, so the prompt runs once for several of its rows, in
    # one forward pass with their completions after it, each attending to the prompt and to itself
    # (Prefix Grouper, Liu et al. 2025). That saves the prompt's repeats, and the gradient is the same,
    # since the prompt's keys and values are computed with it.
    ids, mask, positions, predicting = shared_prompt_rows(model, rollout)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True,
                use_cache=False, **forward_kwargs(model, last=1))
    hidden = out.hidden_states[-1].flatten(0, 1)[predicting]  # [rows, T, H], each predicting a token
    # The logits over the whole vocabulary are made a chunk of positions at a time and never all kept
    # (sampler.token_logprobs), since with 150k tokens they are the largest tensors of the pass.
    return token_logprobs(model, hidden, rollout.completion_ids, T, check=out, floors=rollout.floors)


def policy_loss(logprobs, mask, advantages, loss_type="seq_sum", normalizer=None):
    """Eq. 2 as a loss to minimise, -A^(g) * log pi(a^(g) | h), one advantage per sequence:
    seq_sum    -mean_s(A_s * sum_t m*lp)             (the paper: a completion's summed log-probs)
    token_mean -sum_{s,t}(A_s * m * lp) / sum(m)     (DAPO: every token weighs the same)
    seq_mean   -mean_s(A_s * sum_t(m*lp) / sum_t m)  (original GRPO)
    logprobs, mask: [rows, T], mask 1 up to and including EOS; advantages: [rows], a tensor or a list;
    normalizer: the whole batch's count (loss_normalizer; default this batch's). -> a scalar, with grad."""
    mask = mask.to(logprobs.dtype)
    adv = torch.as_tensor(advantages, dtype=logprobs.dtype, device=logprobs.device).reshape(-1)
    masked = (logprobs * mask).sum(-1)  # per sequence; 0 * lp gives padding no gradient
    if loss_type == "seq_mean":
        masked = masked / mask.sum(-1).clamp(min=1)
    total = (adv * masked).sum()  # seq_sum and token_mean differ only in the denominator
    return -total / (normalizer if normalizer is not None else loss_normalizer(mask, loss_type))


def loss_normalizer(mask, loss_type):
    """policy_loss's denominator: tokens for token_mean, sequences otherwise."""
    return float(mask.sum()) if loss_type == "token_mean" else mask.shape[0]



def micro_batches(num_rows, group_size, micro_batch_size):
    """Row ranges [start, stop) of at most micro_batch_size rows: as many whole groups as fit, since a
    micro-batch runs each group's prompt once, else parts of a group (correct, a little slower)."""
    step = micro_batch_size
    if group_size <= micro_batch_size:
        step = micro_batch_size // group_size * group_size
    return [(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]

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

    def place(self, node):
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
    rollouts = []
    for i, agent in enumerate(agents):
        prompts = [group.prompts[i] for group in groups]
        rollouts.append(sample_agent(agent, i, prompts, size, cfg, [group.seed for group in groups]))
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


def expand_nodes(turn, mode):
    """The nodes of `turn` that get children at the next turn. all: every node not solved. best: each
    group's best node (ties to the first) unless the whole group is solved (the paper-era rule:
    revising a solved best answer teaches the agents to keep what is right)."""
    if mode == "all":
        return [node for node in range(len(turn.outputs)) if not turn.solved[node]]
    values = turn.values()
    all_solved = torch.tensor(turn.solved).view(values.shape).all(-1)  # whether a group's every node is
    return [turn.node(k, int(values[k].argmax())) for k in range(len(turn.groups)) if not all_solved[k]]


def team_feedback(env, examples, turn, nodes, cfg, expert=None):
    """The env's feedback on each node's joint answer, one text per agent (Sec. 3). expert: an expert
    model first reviews each agent's part of every node, greedily, all in one generate call."""
    n = len(turn.rollouts)
    cases = [(examples[turn.groups[turn.place(node)[0]].example], turn.outputs[node]) for node in nodes]
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
        group_index, action = turn.place(node)
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
    threshold = cfg.termination_threshold
    if threshold is None:
        threshold = getattr(env, "max_reward", math.inf)
    groups = []
    for b, ex in enumerate(examples):
        groups.append(Group(b, None, list(env.prompts(ex)), [[] for _ in agents], mix_seed(seeds[b], 1)))
    size = cfg.num_generations
    turns = []
    for t in range(1, cfg.num_turns + 1):
        remax = t == 1 and cfg.advantage == "remax"
        turn = sample_turn(agents, env, examples, groups, size, cfg, threshold, greedy=remax)
        turns.append(turn)
        nodes = expand_nodes(turn, cfg.expand)
        if t == cfg.num_turns or not nodes:
            break
        notes = team_feedback(env, examples, turn, nodes, cfg, expert)
        groups = revision_groups(env, examples, turn, nodes, notes, t)
        size = children or cfg.num_generations
    return turns


def episode_returns(turns, gamma, num_turns):
    """Per turn, each node's return, [groups, J], from the last turn back: node_return of a revised
    node, solved_return of a solved one (over the turns it skips), else its reward."""
    returns = [None] * len(turns)
    for t in reversed(range(len(turns))):
        turn, values = turns[t], []
        for node, reward in enumerate(turn.rewards):
            group = turn.children.get(node)
            if group is not None:
                values.append(node_return(reward, returns[t + 1][group].tolist(), gamma))
            elif turn.solved[node]:
                values.append(solved_return(reward, num_turns - 1 - t, gamma))
            else:  # A leaf not solved is at the last turn, or (--expand best) was not revised.
                values.append(float(reward))
        returns[t] = torch.tensor(values).view(len(turn.groups), len(turn.joint))
    return returns


def episode_advantages(turns, cfg):
    """Eq. 1 among siblings: per turn, per agent, an advantage per rollout row. all: on the returns
    (every sibling is revised or solved: one horizon); best: on each turn's rewards (only the best has
    a next turn: a return would favour it). cross: a completion's credit is its joint actions' mean."""
    if cfg.expand == "all":
        values = episode_returns(turns, cfg.discount, cfg.num_turns)
    else:
        values = [turn.values() for turn in turns]
    advantages = []
    for turn, turn_values in zip(turns, values):
        # remax compares with the greedy joint answer, which only turn 1 has, so later turns use the mean.
        mode = "mean" if cfg.advantage == "remax" and not turn.baseline else cfg.advantage
        credits = credited_returns(turn_values, turn.joint, len(turn.rollouts), turn.size)
        advantages.append([group_advantages(credit, mode, turn.baseline).view(-1) for credit in credits])
    return advantages

# -----------------------------------------------------------------------------
# Sec. 2 steps 4-6: the update. Eq. 2 for every agent, then one step of its own optimizer each (AdamW,
# models.make_optimizer).


class Hooks:
    """What train_step asks of its caller, for one process alone (train.py passes its own): ready(turns),
    the last word before any weight changes; sum(values), max(values) and sum_gradients(model), over the
    processes."""

    def ready(self, turns):
        return True

    def sum(self, values):
        return [float(value) for value in values]

    def max(self, values):
        return [float(value) for value in values]

    def sum_gradients(self, model):
        pass


def train_step(agents, env, examples, cfg, seeds, expert=None, hooks=None):
    """One MAGRPO step on a batch of examples, seeds one per example: the team's episodes, Eq. 1, Eq. 2's
    update of every agent. -> (turns, metrics); metrics None when hooks.ready(turns) stopped the step."""
    hooks = hooks or Hooks()
    # Sec. 2 steps 1-3: each agent samples G completions of its own prompt, their g-th ones form a
    # joint action, and the env scores it. With several turns (Sec. 3), feedback and revision grow
    # each example's episode into a tree of such groups.
    turns = rollout_team(agents, env, examples, cfg, seeds, expert)
    if not hooks.ready(turns):
        return turns, None
    # Eq. 1 gives each completion its advantage among its siblings, the completions of one prompt. A
    # group whose advantages are all 0 teaches nothing, and their count explains a loss of 0.
    zero_groups = 0
    for turn, advantages in zip(turns, episode_advantages(turns, cfg)):
        turn.advantages = advantages
        zero_groups += turn.zero_advantage_groups()
    metrics = {"zero_adv_groups": int(hooks.sum([zero_groups])[0])}
    # Eq. 2, steps 4-6: every agent's own policy gradient on the shared reward's advantages, then its
    # own AdamW step. Each turn is a part of the loss, with its weight (--turn-weights).
    weights = cfg.turn_weights or [1.0] * cfg.num_turns
    for i, agent in enumerate(agents):
        agent.model.eval()  # Dropout is off, so the gradient is of the very policy that sampled.
        agent.model.zero_grad(set_to_none=True)
        # Each turn's loss is divided by its whole batch's count, so that the micro-batches add up to it.
        counts = [0.0] * cfg.num_turns
        for t, turn in enumerate(turns):
            counts[t] = loss_normalizer(turn.rollouts[i].completion_mask, cfg.loss_type)
        total, drift, tokens, drift_max = 0.0, 0.0, 0.0, 0.0
        for turn, weight, normalizer in zip(turns, weights, hooks.sum(counts)):
            rollout = turn.rollouts[i]
            for start, stop in micro_batches(len(rollout), rollout.num_generations, cfg.micro_batch_size):
                advantages = turn.advantages[i][start:stop]
                if not advantages.any():  # These rows' loss and gradient would be 0 anyway.
                    continue
                rows = rollout.rows(start, stop)
                if cfg.logprob == "full":  # Eq. 2 of the distribution before top-k/top-p's cut, as TRL's
                    rows.floors = None
                logprobs = completion_logprobs(agent.model, rows, cfg.temperature)
                loss = weight * policy_loss(logprobs, rows.completion_mask, advantages, cfg.loss_type,
                                            normalizer)
                loss.backward()
                total = total + loss.detach()
                # The sampler's log-probs should be these, and a drift means it sampled another policy.
                gaps = (logprobs.detach() - rows.logprobs).abs() * rows.completion_mask
                drift, drift_max = drift + float(gaps.sum()), max(drift_max, float(gaps.max()))
                tokens += float(rows.completion_mask.sum())
        for name, value in optimizer_step(agent, total, hooks).items():
            metrics[f"{name}_{i}"] = value
        drift, tokens = hooks.sum([drift, tokens])
        metrics[f"logprob_drift_{i}"] = drift / tokens if tokens else None
        metrics[f"logprob_drift_max_{i}"] = hooks.max([drift_max])[0] if tokens else None
    return turns, metrics


def optimizer_step(agent, loss, hooks):
    """An agent's gradients summed over the processes, their norm (logged only; the paper clips
    nothing), and its optimizer's step, skipped with a warning if the loss or the norm is not finite."""
    model = agent.model
    hooks.sum_gradients(model)
    (loss,) = hooks.sum([loss])
    grads = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    grad_norm = torch.stack(grads).norm().item() if grads else 0.0
    skipped = not (math.isfinite(loss) and math.isfinite(grad_norm))
    if skipped:
        warnings.warn(f"non-finite loss ({loss}) or grad norm ({grad_norm}): skipping this agent's step")
    else:
        agent.optimizer.step()  # Parameters without a gradient (all advantages 0) are left alone.
    model.zero_grad(set_to_none=True)
    return {"loss": loss, "grad_norm": grad_norm, "skipped": int(skipped)}
