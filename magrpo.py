"""
MAGRPO: Multi-Agent Group Relative Policy Optimization, one function per idea.

Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning" (Liu et al., arXiv 2508.04652).
n agents cooperate on one task; each agent i sees only its own prompt h_i and samples G completions
from its own policy; the g-th completions of all agents form the g-th joint action, which the
environment scores with one shared reward R^(g) (Sec. 2). Then, for every agent:

    Eq. 1   A^(g) = R^(g) - mean_g' R^(g')                      -> group_advantages
    Eq. 2   J(theta_i) = E[ A^(g) * log pi_theta_i(a_i^(g) | h_i) ] -> completion_logprobs, policy_loss

and one AdamW step per agent per batch (update_team). On-policy: no ratio, no clipping, no KL.
Multi-turn (Sec. 3): each joint action is a node of a tree; the env's feedback on a node's joint
answer goes into every agent's next prompt, G children are sampled, and a node's return is its
reward plus gamma times the mean return of its children (node_return). Eq. 1 then runs on the
returns of each group of siblings (rollout_team, episode_advantages).

The functions a course blanks out: sample_token, generate, completion_logprobs, group_advantages,
policy_loss, node_return.
Try it:  python train.py                  (CPU demo, two tiny agents, ~1 minute)
         python train.py --num-turns 2    (the same with a revision turn after feedback)
Test it: python -m pytest -q
"""
import dataclasses
import inspect
import itertools
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass, field

import torch

# -----------------------------------------------------------------------------
# Sampling: a hand-written batched decode loop with a KV cache


@dataclass
class Rollout:
    """The output of `generate`: B prompts x G completions, rows in prompt-major order
    (row b * G + g is the g-th completion of prompt b)."""
    prompt_ids: torch.Tensor       # [B*G, P] left-padded
    prompt_mask: torch.Tensor      # [B*G, P] 1 on real prompt tokens
    completion_ids: torch.Tensor   # [B*G, T] pad after the first EOS
    completion_mask: torch.Tensor  # [B*G, T] 1 up to and including the first EOS, 0 after
    logprobs: torch.Tensor         # [B*G, T] log softmax(logits / T) of each sampled token (0 for greedy)
    texts: list                    # B lists of G decoded completions, without EOS/pad
    num_generations: int
    seconds: float = 0.0           # wall time of the generate call

    def __len__(self):
        return self.completion_ids.shape[0]

    def rows(self, start, stop):
        """Rows [start, stop) as a smaller Rollout, with all-padding columns trimmed away so a
        micro-batch costs only what its own longest prompt and completion need."""
        pm, cm = self.prompt_mask[start:stop], self.completion_mask[start:stop]
        p0 = int((pm.sum(0) > 0).nonzero()[0]) if pm.any() else pm.shape[1]
        t1 = int((cm.sum(0) > 0).nonzero()[-1]) + 1 if cm.any() else 0
        return Rollout(self.prompt_ids[start:stop, p0:], pm[:, p0:],
                       self.completion_ids[start:stop, :t1], cm[:, :t1],
                       self.logprobs[start:stop, :t1], [], self.num_generations)


def eos_token_ids(model, tokenizer):
    """Every id that ends a completion: the tokenizer's EOS plus the model's generation_config EOS
    (instruct models often have two, e.g. Qwen's <|im_end|> and <|endoftext|>)."""
    ids = {tokenizer.eos_token_id}
    cfg = getattr(model, "generation_config", None)
    extra = getattr(cfg, "eos_token_id", None) if cfg is not None else None
    ids |= set(extra) if isinstance(extra, (list, tuple)) else {extra}
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer has no eos_token and the model's generation_config names none")
    return sorted(ids)


def left_pad(rows, pad_id, device):
    """Token lists -> (ids, mask) tensors, left-padded so every row's last token is at the end,
    where decoding continues (done here, so a tokenizer needs no pad token or padding side)."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


def last_logits_only(model, n):
    """model(...) kwargs that compute logits for the last n positions only, when the model supports
    it: a 150k-token vocabulary makes full-prompt logits the largest tensor of the whole step."""
    return {"logits_to_keep": n} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def positions_from_mask(mask):
    """Position ids for left-padded rows: 0 at each row's first real token (without this, padded
    rows see shifted positions and batched output differs from unbatched)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


# Seeds. Every prompt carries its own seed (from the run's seed, the step, the example's index in the
# global batch, the agent, the turn), and row g of a prompt draws its t-th token from a uniform number
# that is a hash of (that seed, g, t). So a completion never depends on which other prompts share its
# generate call, on rows that finished early, or on how a batch is split over calls or processes.
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment


def _int64(x):
    """A 64-bit pattern as the signed value torch's int64 holds."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def mix_seed(*parts):
    """One 63-bit seed from integers (splitmix64 over the parts): mix_seed(seed, step, index, agent)."""
    x = 0
    for p in parts:
        x = ((x ^ (int(p) & _MASK64)) + _GOLDEN) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x >> 1


def _shr(x, k):  # logical right shift of an int64 tensor (>> is arithmetic on signed values)
    return (x >> k) & ((1 << (64 - k)) - 1)


def row_uniforms(keys, t):
    """The uniform number in (0, 1) that row `keys[r]` uses for its t-th token: splitmix64's finaliser
    over (key, t) on int64 tensors (multiplication wraps around, as the hash wants)."""
    x = keys + _int64((t + 1) * _GOLDEN)
    x = (x ^ _shr(x, 30)) * _int64(0xBF58476D1CE4E5B9)
    x = (x ^ _shr(x, 27)) * _int64(0x94D049BB133111EB)
    x = x ^ _shr(x, 31)
    return (_shr(x, 11).double() + 0.5) / 2.0 ** 53  # the top 53 bits, centred in their interval


def sample_token(logits, temperature=1.0, top_p=1.0, top_k=0, uniform=None):
    """One token per row from softmax(logits / temperature), restricted to the top_k most likely
    tokens (0: all) and then to the nucleus: the smallest set of most likely tokens whose probability
    reaches top_p. temperature == 0 is greedy. `uniform` ([rows], in (0, 1)) is the random number
    of each row (default: fresh torch.rand); the token is the first whose cumulative probability
    exceeds it (inverse-CDF sampling), so the same number always gives the same token."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # mass before this token already reaches top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(outside, 0.0))
    if uniform is None:
        uniform = torch.rand(probs.shape[0], dtype=torch.float64, device=probs.device)
    cdf = probs.double().cumsum(-1)
    target = uniform.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def prompt_seeds(seed, n):
    """One seed per prompt: a list as given, or from a single int (prompt b: mix_seed(seed, b))."""
    if isinstance(seed, (list, tuple)):
        if len(seed) != n:
            raise ValueError(f"generate got {len(seed)} seeds for {n} prompts")
        return [int(s) for s in seed]
    return [mix_seed(seed, b) for b in range(n)]


@torch.no_grad()
def generate(model, tokenizer, prompts, num_generations=1, max_new_tokens=256, temperature=1.0,
             top_p=1.0, top_k=0, seed=None):
    """Sample `num_generations` completions for each prompt (Sec. 2, step 1: each agent samples a
    group of G completions from its own policy). A plain decode loop over model(...) with a KV cache:
    prefill each prompt once, repeat its cache G times, then one token per step for the rows that
    have not yet emitted EOS (finished rows are dropped from the running batch).
    seed: None (torch's global RNG), an int, or one int per prompt (see mix_seed)."""
    from transformers import DynamicCache  # local import keeps `import magrpo` light for the math tests
    t_start = time.perf_counter()
    device, G = model.device, num_generations
    eos = torch.tensor(eos_token_ids(model, tokenizer), device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(eos[0])

    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    if not ids or max_new_tokens < 1 or G < 1 or not all(ids):
        raise ValueError("generate needs at least one prompt, no empty prompt, G >= 1 and max_new_tokens >= 1")
    prompt_ids, prompt_mask = left_pad(ids, pad_id, device)
    B = len(ids)
    keys = None
    if seed is not None:  # row b * G + g: hash of (prompt b's seed, g)
        keys = torch.tensor([_int64(mix_seed(s, g)) for s in prompt_seeds(seed, B) for g in range(G)],
                            dtype=torch.long, device=device)

    # Prefill once per prompt, then copy the cache G times: the G completions share their prompt.
    cache = DynamicCache()
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions_from_mask(prompt_mask),
                past_key_values=cache, use_cache=True, **last_logits_only(model, 1))
    cache = out.past_key_values
    cache.batch_repeat_interleave(G)
    logits = out.logits[:, -1, :].float().repeat_interleave(G, dim=0)
    mask = prompt_mask.repeat_interleave(G, dim=0)
    next_pos = mask.sum(-1, keepdim=True)  # next position id = number of real tokens so far

    N = B * G
    completion = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((N, max_new_tokens), device=device)
    lengths = torch.full((N,), max_new_tokens, dtype=torch.long, device=device)  # incl. EOS
    alive = torch.arange(N, device=device)  # original row index of each running row
    for t in range(max_new_tokens):
        uniform = None if keys is None or temperature == 0 else row_uniforms(keys[alive], t)
        token = sample_token(logits, temperature, top_p, top_k, uniform)
        completion[alive, t] = token
        if temperature > 0:  # log softmax(logits / T) of the drawn token, before any top-k/top-p cut
            scaled = logits / temperature
            logprobs[alive, t] = scaled.gather(-1, token[:, None]).squeeze(-1) - torch.logsumexp(scaled, -1)
        done = torch.isin(token, eos)
        lengths[alive[done]] = t + 1
        n_done = int(done.sum())  # the loop's one device sync per token
        if t == max_new_tokens - 1 or n_done == len(alive):
            break
        if n_done:  # drop finished rows from the running batch and from the cache
            keep = (~done).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            alive, token, mask, next_pos = alive[keep], token[keep], mask[keep], next_pos[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        cache, logits, next_pos = out.past_key_values, out.logits[:, -1, :].float(), next_pos + 1

    steps = torch.arange(max_new_tokens, device=device)
    completion_mask = (steps[None, :] < lengths[:, None]).long()
    completion = completion.masked_fill(completion_mask == 0, pad_id)
    logprobs = logprobs * completion_mask
    rows, lens, eos_ids = completion.tolist(), lengths.tolist(), set(eos.tolist())
    texts = [[decode_completion(tokenizer, rows[b * G + g], lens[b * G + g], eos_ids)
              for g in range(G)] for b in range(B)]
    return Rollout(prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0),
                   completion, completion_mask, logprobs, texts, G, time.perf_counter() - t_start)


def decode_completion(tokenizer, ids, length, eos_ids):
    """Text of one completion (a list of ids): its first `length` tokens, without a final EOS."""
    ids = ids[:length]
    if ids and ids[-1] in eos_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=True)

# -----------------------------------------------------------------------------
# Eq. 1, Eq. 2 and the multi-turn return


def completion_logprobs(model, rollout, temperature=1.0):
    """log pi_theta(a_t | h, a_<t) of every completion token, with grad (the log-prob term of Eq. 2).
    Logits are divided by the sampling temperature so the loss scores the distribution the tokens
    were drawn from (with top_p < 1 or top_k, that distribution before the cut, as TRL's GRPO).
    Greedy (temperature 0) scores at T = 1.
    Returns [rows, T] like `completion_ids`; positions after EOS hold values to be masked out."""
    T = temperature if temperature > 0 else 1.0
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    L = rollout.completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask),
                   **last_logits_only(model, L + 1)).logits
    logits = logits[:, -(L + 1):-1, :].float() / T  # the logit at position t predicts token t+1
    token_logits = logits.gather(-1, rollout.completion_ids[..., None]).squeeze(-1)
    return token_logits - torch.logsumexp(logits, dim=-1)


def group_advantages(rewards, mode="mean"):
    """Eq. 1, the group-relative advantage, over the last dim (the G joint actions of one prompt).
    mode="mean": A^(g) = R^(g) - mean_g' R^(g') (the paper; no division by the std, after Dr. GRPO);
    mode="rloo": R^(g) minus the mean of the other G-1 rewards (leave-one-out baseline);
    mode="std":  (R^(g) - mean) / std, the original GRPO z-score, 0 where the group's std is 0."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    G = rewards.shape[-1]
    if G < 2:
        raise ValueError(f"group_advantages needs a group of at least 2, got {G}")
    centered = rewards - rewards.mean(-1, keepdim=True)
    if mode == "mean":
        return centered
    if mode == "rloo":  # R - (sum - R)/(G-1) = G/(G-1) * (R - mean)
        return centered * G / (G - 1)
    if mode == "std":
        std = rewards.std(-1, keepdim=True)  # unbiased, as TRL's GRPO
        return torch.where(std > 1e-6, centered / std.clamp(min=1e-6), torch.zeros_like(centered))
    raise ValueError(f"unknown advantage mode {mode!r}: use mean, rloo or std")


def policy_loss(logprobs, mask, advantages, loss_type="seq_sum", normalizer=None):
    """Eq. 2 as a loss to minimise: -A^(g) * log pi(a^(g) | h), one advantage per sequence.
    loss_type="seq_sum"   : -mean_s(A_s * sum_t m*lp)          (the paper: sum of a completion's log-probs)
    loss_type="token_mean": -sum_{s,t}(A_s * m * lp) / sum(m)  (DAPO: every token weighs the same)
    loss_type="seq_mean"  : -mean_s(A_s * sum_t(m*lp) / sum_t m)  (original GRPO)
    `mask` is 1 up to and including EOS: padding after it gets no gradient. `normalizer` is the
    denominator (sequences, or tokens for token_mean) counted once over the whole batch, so that
    micro-batch losses add up to the full-batch loss; by default this batch's own count."""
    mask = mask.to(logprobs.dtype)
    adv = torch.as_tensor(advantages, dtype=logprobs.dtype, device=logprobs.device).reshape(-1)
    masked = (logprobs * mask).sum(-1)  # sum_t m * lp, per sequence; 0 * lp kills padding's grad
    if loss_type in ("seq_sum", "token_mean"):  # they differ only in the denominator
        total = (adv * masked).sum()
    elif loss_type == "seq_mean":
        total = (adv * masked / mask.sum(-1).clamp(min=1)).sum()
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}: use one of {', '.join(LOSS_TYPES)}")
    return -total / (normalizer if normalizer is not None else loss_normalizer(mask, loss_type))


def loss_normalizer(mask, loss_type):
    """The denominator of policy_loss over the whole batch (count once, before micro-batching):
    tokens for token_mean, sequences otherwise."""
    return float(mask.sum()) if loss_type == "token_mean" else mask.shape[0]


def node_return(reward, child_returns, gamma):
    """Sec. 3: the return of a node of the multi-turn tree, R_t = r_t + gamma * mean(R_{t+1} of its
    children); a leaf (last turn, terminated, or not expanded) returns its own reward."""
    child_returns = [float(r) for r in child_returns]
    if not child_returns:
        return float(reward)
    return float(reward) + gamma * sum(child_returns) / len(child_returns)


def solved_return(reward, turns_left, gamma):
    """The return of a solved node (its reward reached the termination threshold, so it is not
    revised): an absorbing state that keeps its reward for the turns it skips, r + gamma r + ...
    over `turns_left` more turns, so it is compared with its revised siblings over one horizon."""
    value = float(reward)
    for _ in range(turns_left):
        value = node_return(reward, [value], gamma)
    return value


# -----------------------------------------------------------------------------
# The knobs of a run

LOSS_TYPES = ("seq_sum", "token_mean", "seq_mean")
ADVANTAGE_MODES = ("mean", "rloo", "std")
JOINT_MODES = ("aligned", "cross")
EXPAND_MODES = ("best", "all")
FEEDBACK_MODES = ("level", "plain", "expert")


@dataclass
class Config:
    """What one MAGRPO step does. The names are TRL GRPOConfig's where one applies, and train.py's
    flags are exactly these fields (--num-generations sets num_generations). Checked on creation:
    a bad value raises ValueError("--flag-name: what is wrong")."""
    num_generations: int = 4            # G, completions per agent per prompt (Sec. 2 step 1)
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0: no top-k cut
    joint: str = "aligned"              # aligned: G joint actions; cross: all G^n (Sec. 2 step 2)
    advantage: str = "mean"             # Eq. 1 as the paper ("mean"), or rloo / std
    loss_type: str = "seq_sum"          # Eq. 2's normalisation: seq_sum (paper), token_mean, seq_mean
    micro_batch_size: int = 8           # rows per log-prob forward/backward (memory, not maths)
    num_turns: int = 1                  # T (Sec. 3); 1 is the single-turn algorithm
    expand: str = "best"                # nodes that get children: the best of each group, or all
    discount: float = 0.9               # gamma of node_return (expand all; best compares turn rewards)
    termination_threshold: float = None  # a node whose reward reaches it is not expanded (None: env max)
    turn_weights: tuple = None          # each turn's loss scaled by these (None: all 1)
    feedback: str = "level"             # what the env says between turns: level, plain or expert
    feedback_max_new_tokens: int = 256  # bound on the expert's review

    def __post_init__(self):
        if self.turn_weights is not None:
            self.turn_weights = tuple(float(w) for w in self.turn_weights)
        checks = [
            ("num_generations", self.num_generations >= 1, "must be >= 1"),
            ("max_new_tokens", self.max_new_tokens >= 1, "must be >= 1"),
            ("micro_batch_size", self.micro_batch_size >= 1, "must be >= 1"),
            ("feedback_max_new_tokens", self.feedback_max_new_tokens >= 1, "must be >= 1"),
            ("temperature", self.temperature >= 0, "must be >= 0 (0 is greedy)"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be >= 0 (0: no top-k cut)"),
            ("joint", self.joint in JOINT_MODES, f"use one of {', '.join(JOINT_MODES)}"),
            ("advantage", self.advantage in ADVANTAGE_MODES, f"use one of {', '.join(ADVANTAGE_MODES)}"),
            ("loss_type", self.loss_type in LOSS_TYPES, f"use one of {', '.join(LOSS_TYPES)}"),
            ("num_turns", self.num_turns >= 1, "must be >= 1"),
            ("expand", self.expand in EXPAND_MODES, f"use one of {', '.join(EXPAND_MODES)}"),
            ("discount", 0 <= self.discount <= 1, "must be in [0, 1]"),
            ("feedback", self.feedback in FEEDBACK_MODES, f"use one of {', '.join(FEEDBACK_MODES)}"),
            ("turn_weights", self.turn_weights is None or len(self.turn_weights) == self.num_turns,
             f"give one weight per turn ({self.num_turns})"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"--{name.replace('_', '-')}: {why}, got {getattr(self, name)!r}")

    def turn_weight(self, t):
        """The loss weight of turn t (1-based)."""
        return 1.0 if self.turn_weights is None else self.turn_weights[t - 1]


# -----------------------------------------------------------------------------
# A team's episode (Sec. 2 steps 1-3; Sec. 3): sample, join, score, and between turns feedback


@dataclass
class Agent:
    """One policy pi_theta_i with its own tokenizer and its own optimizer (agents share nothing:
    a team may mix different models)."""
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


def joint_actions(num_agents, num_generations, mode="aligned"):
    """Which completions form the joint actions of one prompt (Sec. 2, step 2), as index tuples
    (g_0, ..., g_{n-1}): agent i contributes its g_i-th completion.
    mode="aligned": the g-th completion of every agent forms joint action g (G joint actions);
    mode="cross":   every combination (G^n joint actions)."""
    if mode == "aligned":
        return [(g,) * num_agents for g in range(num_generations)]
    if mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"unknown joint mode {mode!r}: use aligned or cross")


def credited_returns(returns, joint, num_agents, num_generations):
    """The return each agent's completion is credited with, [B, G] per agent: the mean of the
    shared returns of the joint actions it takes part in (aligned: exactly its one joint action).
    `returns` is [B, len(joint)], in the order of `joint`."""
    credit = []
    for i in range(num_agents):
        member = torch.zeros(len(joint), num_generations)  # member[j, g]: joint action j uses agent i's g
        member[torch.arange(len(joint)), torch.tensor([idx[i] for idx in joint])] = 1.0
        credit.append(returns @ member / member.sum(0))
    return credit


@dataclass
class Group:
    """One prompt per agent, each sampled `size` times (Sec. 2 step 1): an example's turn-1 prompts,
    or at a later turn the revision prompts that follow one expanded node (Sec. 3)."""
    example: int            # index of the example in the batch
    parent: int             # the node of the previous turn this group revises (None at turn 1)
    prompts: list           # one env prompt per agent
    histories: list         # per agent: [(its own answer, the feedback it got), ...] of earlier turns
    seed: int               # the group's sampling seed; agent i samples with mix_seed(seed, i)


@dataclass
class Turn:
    """Everything sampled and scored at one turn for the whole batch. Node n = k * J + j is the
    j-th joint action of group k (J = len(joint)); rollout rows k * size + g are group k's."""
    groups: list
    size: int               # completions per agent per group
    rollouts: list          # one Rollout per agent
    joint: list             # index tuples of one group's joint actions
    outputs: list           # per node: one text per agent
    rewards: list           # per node: the env's reward (float() of it is the number)
    terminated: list        # per node: its reward reached the termination threshold
    children: dict = field(default_factory=dict)  # expanded node -> its group at the next turn

    def values(self):
        """The rewards as numbers, [groups, J]."""
        return torch.tensor([float(r) for r in self.rewards]).view(len(self.groups), len(self.joint))


def sample_agent(agent, i, prompts, size, cfg, seeds):
    """Agent i samples `size` completions for each of its prompts, in one generate call; prompt b
    with seed mix_seed(seeds[b], i)."""
    return generate(agent.model, agent.tokenizer, [agent.format(p) for p in prompts], size, cfg.max_new_tokens,
                    cfg.temperature, cfg.top_p, cfg.top_k, seed=[mix_seed(s, i) for s in seeds])


def sample_team(agents, prompts, size, cfg, seeds):
    """Sec. 2 step 1 with decentralised execution: agent i samples `size` completions for each of
    its own prompts prompts[i] from its own policy, seeing nothing of the others. One Rollout per
    agent; seeds: one per prompt position, shared by the agents."""
    return [sample_agent(agent, i, prompts[i], size, cfg, seeds) for i, agent in enumerate(agents)]


@dataclass
class ScoreError:
    """The reward of a joint action whose scoring raised: 0, with the error kept for the logs."""
    error: str

    def __float__(self):
        return 0.0


def score_joint(env, examples, outputs, one=None):
    """The shared reward of each (example, joint output) (Sec. 2 step 3): env.rewards on the whole
    batch (an env may score it in parallel); if that raises, or with a per-sample scorer `one`
    (default env.reward), sample by sample, where a sample whose scoring raises gets a ScoreError:
    one bad sample costs only itself, and is counted (score_errors), never silently 0."""
    if one is None:
        try:
            rewards = list(env.rewards(examples, outputs))
            if len(rewards) == len(outputs):
                return rewards
        except Exception:
            pass  # find the culprit below
        one = env.reward
    rewards = []
    for ex, out in zip(examples, outputs):
        try:
            rewards.append(one(ex, out))
        except Exception as e:
            rewards.append(ScoreError(f"{type(e).__name__}: {e}"[:500]))
    return rewards


def sample_turn(agents, env, examples, groups, size, cfg):
    """Sample every group of a turn (one generate call per agent), form the joint actions and
    score them all with one env.rewards call (Sec. 2 steps 1-3)."""
    n = len(agents)
    rollouts = sample_team(agents, [[g.prompts[i] for g in groups] for i in range(n)], size, cfg,
                           [g.seed for g in groups])
    joint = joint_actions(n, size, cfg.joint)
    outputs = [tuple(r.texts[k][j] for r, j in zip(rollouts, idx)) for k in range(len(groups)) for idx in joint]
    rewards = score_joint(env, [examples[g.example] for g in groups for _ in joint], outputs)
    return Turn(groups, size, rollouts, joint, outputs, rewards, [False] * len(outputs))


def expand_nodes(turn, mode, threshold):
    """The nodes of `turn` that get children (Sec. 3); a node whose reward reached the threshold is
    solved (marked in turn.terminated). "all": every node that is not solved. "best": the best node
    of each group (ties to the first), unless every node of the group is solved (the paper-era
    rule: revising the best answer, even a solved one, teaches the agents to keep what is right)."""
    values, J = turn.values(), len(turn.joint)
    turn.terminated = [float(v) >= threshold - 1e-9 for v in values.view(-1)]
    if mode == "all":
        return [n for n in range(len(turn.outputs)) if not turn.terminated[n]]
    return [k * J + int(values[k].argmax()) for k in range(len(turn.groups))
            if not all(turn.terminated[k * J:(k + 1) * J])]


def team_feedback(env, examples, turn, nodes, cfg, expert=None):
    """The env's feedback on each node's joint answer, one text per agent (Sec. 3). In "expert"
    mode an expert model (an Agent) first reviews each agent's part of every node, greedily, all
    in one generate call, and each agent gets the review of its own part."""
    J, n = len(turn.joint), len(turn.rollouts)
    cases = [(examples[turn.groups[node // J].example], turn.outputs[node]) for node in nodes]
    reviews = [None] * len(nodes)
    if cfg.feedback == "expert":
        if expert is None:
            raise ValueError("--feedback expert needs an expert model (--feedback-model)")
        prompts = [expert.format(env.expert_prompt(ex, outputs, i))
                   for ex, outputs in cases for i in range(n)]
        r = generate(expert.model, expert.tokenizer, prompts, 1, cfg.feedback_max_new_tokens, temperature=0)
        reviews = [[texts[0] for texts in r.texts[k * n:(k + 1) * n]] for k in range(len(nodes))]
    return [env.feedback(ex, outputs, cfg.feedback, reward=turn.rewards[node], reviews=texts)
            for (ex, outputs), node, texts in zip(cases, nodes, reviews)]


def rollout_team(agents, env, examples, cfg, seeds, expert=None, children=None):
    """One episode per example (Sec. 2 steps 1-3, and Sec. 3 for cfg.num_turns > 1): returns the
    list of Turns. Turn 1: every agent samples cfg.num_generations completions of its own prompt and
    the env scores the joint actions. Between turns the nodes chosen by cfg.expand (and not yet at
    the termination threshold) get the env's feedback, and each one becomes a group of the next
    turn: every agent's prompt is its own turn-1 prompt, its own earlier answers and the feedback
    (never a partner's prompt or answer, unless the feedback quotes it), sampled `children` times
    (default: G). seeds: one per example, e.g. mix_seed(run seed, step, example index)."""
    threshold = cfg.termination_threshold
    if threshold is None:
        threshold = getattr(env, "max_reward", math.inf)
    n, size = len(agents), cfg.num_generations
    groups = [Group(b, None, list(env.prompts(ex)), [[] for _ in range(n)], mix_seed(seeds[b], 1))
              for b, ex in enumerate(examples)]
    turns = []
    for t in range(1, cfg.num_turns + 1):
        turn = sample_turn(agents, env, examples, groups, size, cfg)
        turns.append(turn)
        nodes = expand_nodes(turn, cfg.expand, threshold)
        if t == cfg.num_turns or not nodes:
            break
        feedback = team_feedback(env, examples, turn, nodes, cfg, expert)
        J, groups = len(turn.joint), []
        for node, notes in zip(nodes, feedback):
            parent = turn.groups[node // J]
            histories = [h + [(turn.outputs[node][i], notes[i])] for i, h in enumerate(parent.histories)]
            ex = examples[parent.example]
            turn.children[node] = len(groups)
            groups.append(Group(parent.example, node, [env.revision_prompt(ex, i, histories[i]) for i in range(n)],
                                histories, mix_seed(parent.seed, t, node % J)))
        size = children or cfg.num_generations
    return turns


def episode_returns(turns, gamma, num_turns):
    """Per turn, the return of every node as a [groups, J] tensor, from the last turn back: a revised
    node's is node_return over its children's; a solved node's solved_return over the turns it
    skips (of `num_turns`); any other node's (the last turn's) its reward."""
    returns = [None] * len(turns)
    for t in reversed(range(len(turns))):
        turn, values = turns[t], []
        for node, reward in enumerate(turn.rewards):
            k = turn.children.get(node)
            if k is not None:
                values.append(node_return(reward, returns[t + 1][k].tolist(), gamma))
            else:
                values.append(solved_return(reward, num_turns - 1 - t if turn.terminated[node] else 0, gamma))
        returns[t] = torch.tensor(values).view(len(turn.groups), len(turn.joint))
    return returns


def episode_advantages(turns, cfg):
    """Eq. 1 among every group of siblings: per turn, per agent, one advantage per rollout row
    ([groups * size]). expand "all": on the returns (every sibling is revised or solved, so all
    cover the same turns); "best": on each turn's own rewards, as the paper-era runs (only the best
    sibling has a next turn: a return would favour it for being revised). In cross mode a completion
    is credited with the mean over the joint actions it takes part in before the baseline is taken."""
    if cfg.expand == "all":
        values = episode_returns(turns, cfg.discount, cfg.num_turns)
    else:
        values = [turn.values() for turn in turns]
    out = []
    for turn, returns in zip(turns, values):
        credit = credited_returns(returns, turn.joint, len(turn.rollouts), turn.size)
        out.append([group_advantages(c, cfg.advantage).view(-1) for c in credit])
    return out

# -----------------------------------------------------------------------------
# The update (Sec. 2 steps 4-6): Eq. 1 on the returns, Eq. 2, one AdamW step per agent


class MasterWeightAdamW:
    """AdamW over fp32 master copies of low-precision (bf16/fp16) weights. At RL learning rates an
    update is far below bf16's resolution and would round away; the master copy accumulates it,
    and the model's own weights are refreshed from it after every step."""

    def __init__(self, params, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        self.inner = torch.optim.AdamW(self.master, **kwargs)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for m, p in zip(self.master, self.params):
            m.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for m, p in zip(self.master, self.params):
            p.copy_(m)

    def state_dict(self):
        return {"inner": self.inner.state_dict(), "master": [m.detach().clone() for m in self.master]}

    @torch.no_grad()
    def load_state_dict(self, state):
        for m, p, saved in zip(self.master, self.params, state["master"]):
            m.copy_(saved)
            p.copy_(saved)
        self.inner.load_state_dict(state["inner"])


def make_optimizer(model, learning_rate, weight_decay=0.0):
    """AdamW per agent (Sec. 2, step 6) over its trainable parameters: plain for fp32 weights, with
    fp32 master weights otherwise."""
    params = [p for p in model.parameters() if p.requires_grad]
    if all(p.dtype == torch.float32 for p in params):
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
    return MasterWeightAdamW(params, lr=learning_rate, weight_decay=weight_decay)


def global_grad_norm(model):
    """The L2 norm of all gradients together, computed in fp32 (bf16 sums lose digits)."""
    norms = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(norms).norm().item() if norms else 0.0


# Data parallelism (torchrun, train.py): every process samples and scores its own share of the
# batch's prompts; the loss's denominators and then the gradients are summed over the processes,
# so each one takes the very step a single process would take on the whole batch, and all keep
# identical weights. Alone, these sums are the values themselves.


def data_parallel():
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def all_sum(values, device="cpu"):
    """The element-wise sum over the data-parallel processes of a list of numbers."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if data_parallel():
        torch.distributed.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def sum_gradients(model):
    """Each parameter's gradient summed over the processes (summed, not averaged: each process's
    loss is already divided by the whole batch's count). A gradient no process has stays None."""
    if not data_parallel():
        return
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    has = all_sum([float(p.grad is not None) for p in params], device)
    for p, n in zip(params, has):
        if n:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            torch.distributed.all_reduce(grad)
            p.grad = grad


def update_agent(agent, parts, cfg):
    """Eq. 2 for one agent: parts = [(rollout or None, advantages, weight)], one per turn. Each
    turn's loss is normalised once over that turn's whole batch (all processes) and scaled by its
    weight; the losses of every micro-batch of every turn accumulate into one gradient (memory does
    not grow with G), then one optimizer step. Rows whose advantage is 0 carry no gradient and are
    not run. A non-finite loss or gradient skips the step with a warning rather than corrupting
    the weights. Returns {"loss", "grad_norm", "skipped"}."""
    model, opt, mbs = agent.model, agent.optimizer, cfg.micro_batch_size
    model.eval()  # dropout off: the gradient must be of the very policy that sampled (as TRL does)
    opt.zero_grad(set_to_none=True)
    normalizers = all_sum([0.0 if r is None else float(loss_normalizer(r.completion_mask, cfg.loss_type))
                           for r, _, _ in parts])
    total = 0.0
    for (rollout, advantages, weight), normalizer in zip(parts, normalizers):
        if rollout is None:
            continue
        advantages = advantages.to(rollout.completion_ids.device)
        for start in range(0, len(rollout), mbs):
            adv = advantages[start:start + mbs]
            if not adv.any():
                continue
            mb = rollout.rows(start, start + mbs)
            lp = completion_logprobs(model, mb, cfg.temperature)
            loss = weight * policy_loss(lp, mb.completion_mask, adv, cfg.loss_type, normalizer)
            loss.backward()
            total = total + loss.detach()
    sum_gradients(model)
    (total,) = all_sum([float(total)])
    grad_norm = global_grad_norm(model)  # logged only: the paper clips no gradients
    if not (math.isfinite(total) and math.isfinite(grad_norm)):
        warnings.warn(f"non-finite loss ({total}) or grad norm ({grad_norm}): skipping this agent's step")
        opt.zero_grad(set_to_none=True)
        return {"loss": total, "grad_norm": grad_norm, "skipped": 1}
    opt.step()  # parameters without a gradient (all advantages 0) are left alone
    opt.zero_grad(set_to_none=True)
    return {"loss": total, "grad_norm": grad_norm, "skipped": 0}


def update_team(agents, turns, cfg):
    """Sec. 2 steps 4-6 for every agent on an episode: the advantages of every turn (Eq. 1 on the
    returns of each sibling group), then update_agent. Returns the per-agent metrics and
    zero_adv_groups: groups whose advantages are 0 for every agent (no signal: count them, the
    loss being ~0 is expected with centred advantages)."""
    advantages = episode_advantages(turns, cfg)
    zero = sum(int(torch.stack([a.view(len(turn.groups), -1) == 0 for a in adv]).all(0).all(-1).sum())
               for turn, adv in zip(turns, advantages))
    metrics = {"zero_adv_groups": int(all_sum([zero])[0])}
    for i, agent in enumerate(agents):
        parts = [(turns[t].rollouts[i], advantages[t][i], cfg.turn_weight(t + 1)) if t < len(turns)
                 else (None, None, 0.0) for t in range(cfg.num_turns)]  # every process: one part per turn
        out = update_agent(agent, parts, cfg)
        metrics.update({f"{k}_{i}": v for k, v in out.items()})
        lengths = torch.cat([turn.rollouts[i].completion_mask.sum(-1).float().cpu() for turn in turns])
        total, count = all_sum([lengths.sum().item(), len(lengths)])
        metrics[f"completion_len_{i}"] = total / count
    return metrics


def episode_summary(turns):
    """What episode_metrics needs, as plain lists (a data-parallel run gathers them from every
    process): per turn, every node's reward, its levels, whether it reached the threshold, and
    per revised group its children's mean reward minus its parent's; the scoring failures."""
    out = []
    for t, turn in enumerate(turns):
        values = turn.values()
        gains = [] if t == 0 else [(values[k].mean() - float(turns[t - 1].rewards[g.parent])).item()
                                   for k, g in enumerate(turn.groups)]
        out.append({"rewards": values.view(-1).tolist(), "gains": gains, "terminated": list(turn.terminated),
                    "levels": [dict(getattr(r, "levels", None) or {}) for r in turn.rewards],
                    "sandbox_errors": sum(getattr(r, "sandbox_error", None) is not None for r in turn.rewards),
                    "score_errors": sum(isinstance(r, ScoreError) for r in turn.rewards)})
    return out


def merge_summaries(summaries):
    """Several processes' episode summaries as one, turn by turn, in process order."""
    turns = max(len(s) for s in summaries)
    return [{k: sum((s[t][k] for s in summaries if t < len(s)), [] if k not in ("sandbox_errors", "score_errors") else 0)
             for k in summaries[0][0]} for t in range(turns)]


def level_means(levels):
    """The mean of each reward level over a list of `levels` dicts (a level a reward lacks, gated
    off, counts 0)."""
    names = dict.fromkeys(k for lv in levels for k in lv)
    return {k: sum(float(lv.get(k, 0.0)) for lv in levels) / len(levels) for k in names}


def episode_metrics(turns, num_turns, summary=None):
    """What an episode scored: reward_mean/std/max and level_<name> of turn 1 (the single-turn
    numbers), and per turn t: reward_mean_turn{t}, reward_max_turn{t}, terminated_turn{t} (share of
    nodes at the threshold, which are not revised), level_<name>_turn{t}, and for t > 1
    improvement_turn{t} (mean over revised nodes of their children's mean reward minus their own);
    None for a turn no node reached. sandbox_errors counts rewards whose sandbox could not run,
    score_errors those whose scoring raised (both count as 0). summary: episode_summary's lists
    instead of `turns` (merge_summaries of every process's, in a data-parallel run)."""
    summary = summary if summary is not None else episode_summary(turns)
    first = torch.tensor(summary[0]["rewards"])
    m = {"reward_mean": first.mean().item(), "reward_std": first.std().item() if first.numel() > 1 else 0.0,
         "reward_max": first.max().item(), **{f"level_{k}": v for k, v in level_means(summary[0]["levels"]).items()}}
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
        m.update({f"level_{k}_turn{t}": v for k, v in level_means(turn["levels"]).items()})
    m["sandbox_errors"] = sum(turn["sandbox_errors"] for turn in summary)
    m["score_errors"] = sum(turn["score_errors"] for turn in summary)
    return m


def train_step(agents, env, examples, cfg, seeds, expert=None):
    """One MAGRPO iteration on a batch of examples (Sec. 2; Sec. 3 when cfg.num_turns > 1):
    sample and score an episode per example (rollout_team), then update every agent (update_team).
    seeds: one per example. Returns the step's metrics, with `samples`: the first joint output of
    the last turn."""
    turns = rollout_team(agents, env, examples, cfg, seeds, expert)
    metrics = {**episode_metrics(turns, cfg.num_turns), **update_team(agents, turns, cfg)}
    metrics["samples"] = turns[-1].outputs[0]
    return metrics

# -----------------------------------------------------------------------------
# Models: the built-in tiny model (CPU demo, tests) and real ones by hub name or local path

TINY = "tiny"  # --model tiny: a random-init model built from a config, no download


def tiny_tokenizer():
    """A byte-level tokenizer made in code: the 256 bytes plus EOS and PAD, so any text (prose or
    code) round-trips. It is a PreTrainedTokenizerFast, so save_pretrained/from_pretrained work."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"<|endoftext|>": len(vocab), "<|pad|>": len(vocab) + 1})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|pad|>", padding_side="left")


def tiny_model(tokenizer, arch="qwen2", hidden=64, layers=2, heads=4, init_std=0.02, seed=0):
    """A small random-init causal LM (Qwen2, Llama or GPT-2 class) for the tokenizer's vocabulary.
    The default is ~0.1M parameters: the CPU demo trains two of them in under a minute. Tests use a
    larger init_std so that greedy outputs are not one repeated token."""
    import transformers as tf
    common = dict(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id,
                  initializer_range=init_std, tie_word_embeddings=True)
    if arch == "gpt2":
        config = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=1024, **common)
        cls = tf.GPT2LMHeadModel
    else:
        cfg_cls, cls = {"qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
                        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM)}[arch]
        config = cfg_cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         max_position_embeddings=1024, **common)
    torch.manual_seed(seed)
    model = cls(config).eval()  # eval mode throughout: no dropout, in sampling or in the update
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_agent_model(name_or_path, device="cpu", dtype="float32", seed=0):
    """(model, tokenizer) for one agent: the built-in tiny model for "tiny", else from_pretrained by
    hub name or local directory (e.g. a train.py --out DIR/agent_0). Raises ValueError with one line
    saying what is wrong when it cannot be loaded."""
    if name_or_path == TINY:
        tok = tiny_tokenizer()
        return tiny_model(tok, seed=seed).to(device, DTYPES[dtype]), tok
    from transformers import AutoModelForCausalLM, AutoTokenizer
    quiet_transformers()
    looks_local = os.path.isabs(name_or_path) or name_or_path.startswith(".") or name_or_path.count("/") > 1
    if looks_local and not os.path.isdir(name_or_path):
        raise ValueError(f"{name_or_path!r} is not a directory")
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retry warnings would bury our one-line error
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype])
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"cannot load {name_or_path!r} (not a local model directory, and not "
                         f"reachable on the hub: {first})") from None
    finally:
        hub_log.setLevel(level)
    if tok.pad_token is None:  # many base models ship without one; EOS is the usual stand-in
        tok.pad_token = tok.eos_token
    return model.to(device), tok


def quiet_transformers():
    """No progress bar for every shard transformers loads or writes (a checkpoint per step would
    bury the training bar)."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()


def save_agent(agent, path):
    """An agent as transformers saves a model (config, weights, tokenizer): it loads back with
    from_pretrained, or as --model PATH. A LoRA agent as peft saves an adapter (save_adapter) with
    the tokenizer: it loads back with load_agent (its base named in adapter_config.json), or peft."""
    quiet_transformers()
    if is_lora(agent.model):
        save_adapter(agent.model, path)
    else:
        agent.model.save_pretrained(path)
    agent.tokenizer.save_pretrained(path)


# -----------------------------------------------------------------------------
# LoRA agents: n adapters on one shared frozen base (--lora-r)
#
# Full fine-tuning gives every agent its own weights, gradients and AdamW state (~16 bytes per
# parameter in fp32), so n agents cost n models. The paper trains each agent's whole model; LoRA
# (Hu et al., 2021) trains instead a low-rank update W + (alpha / r) * B A of chosen linear layers,
# with W frozen. Agents that start from the same base then differ only in their adapters, so they
# can share one copy of W: n agents cost about one base plus n small adapters. MAGRPO is unchanged
# (Eq. 1 and Eq. 2 per agent, one optimizer step per agent): only what the optimizer moves differs.
#
# How the base is shared without any global "active adapter" switch: each agent's model is a
# structural copy of the base (shared_copy) whose parameters and buffers ARE the base's tensors,
# with its target linear layers wrapped in LoRALinear. So an agent is an ordinary HF model (its own
# config and generation_config) that runs as base + its own adapter, weights never merged: generate,
# completion_logprobs and update_agent need no change, and make_optimizer, which takes the
# parameters with requires_grad, gets the adapter's alone.

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # peft's file names
# peft's defaults for Qwen2/Llama-style models: every attention and MLP projection; GPT-2 has Conv1D
# layers with other names.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_TARGETS_BY_MODEL_TYPE = {"gpt2": ("c_attn", "c_proj", "c_fc")}


class LoRAError(ValueError):
    """A bad LoRA setting; its message names its own flag (--lora-r, --lora-target-modules, ...)."""


@dataclass
class LoRAConfig:
    """An adapter's shape (peft's LoraConfig names): rank r, lora_alpha (the update is scaled by
    alpha / r; None: 2r) and target_modules (None: the architecture's attention and MLP projections)."""
    r: int
    alpha: float = None
    target_modules: tuple = None

    def __post_init__(self):
        self.alpha = float(2 * self.r if self.alpha is None else self.alpha)


class LoRALinear(torch.nn.Module):
    """A frozen linear layer plus a trainable low-rank update (LoRA, Hu et al. 2021):
        y = base(x) + (x A^T B^T) * alpha / r,   A: [r, in], B: [out, r].
    A starts as peft's default (kaiming-uniform, i.e. U(-1/sqrt(in), 1/sqrt(in))) and B at zero, so
    a new adapter adds exactly 0: a new agent is its base, logit for logit. The adapter is stored in
    fp32 whatever the base's dtype: it is small, and fp32 lets plain AdamW update it (a bf16 weight
    would round RL-sized updates away, see MasterWeightAdamW). `base` is an nn.Linear, or GPT-2's Conv1D,
    which stores its weight transposed ([in, out], peft's fan_in_fan_out). No dropout: update_agent
    runs the model in eval mode (the gradient must be of the very policy that sampled), where
    peft's lora_dropout does nothing."""

    def __init__(self, base, r, alpha, generator=None):
        from transformers.pytorch_utils import Conv1D
        super().__init__()
        self.base, self.r, self.alpha, self.scaling = base, r, alpha, alpha / r
        self.fan_in_fan_out = isinstance(base, Conv1D)
        in_f, out_f = base.weight.shape if self.fan_in_fan_out else base.weight.shape[::-1]
        bound = 1.0 / math.sqrt(in_f)
        a = (torch.rand(r, in_f, generator=generator) * 2 - 1) * bound  # on the CPU: same numbers on any device
        self.lora_A = torch.nn.Parameter(a.to(base.weight.device))
        self.lora_B = torch.nn.Parameter(torch.zeros(out_f, r, device=base.weight.device))

    def forward(self, x):
        # In x's dtype, as the base computes: a cast of x to fp32 would be one more copy of every
        # adapted layer's input kept for the backward pass (~40% more activation memory in bf16).
        a, b = self.lora_A.to(x.dtype), self.lora_B.to(x.dtype)
        return self.base(x) + (x @ a.T) @ b.T * self.scaling  # r-wide in the middle: cheap

    def delta_weight(self):
        """(alpha / r) * B A, laid out like the base's weight: what merging adds to it."""
        delta = (self.lora_B @ self.lora_A) * self.scaling
        return delta.T if self.fan_in_fan_out else delta

    def extra_repr(self):
        return f"r={self.r}, alpha={self.alpha:g}"


def is_lora(model):
    """Whether `model` is an agent built by add_lora (base + adapter)."""
    return any(isinstance(m, LoRALinear) for m in model.modules())


def is_adapter(path):
    """Whether `path` is a directory holding a saved adapter (save_adapter, or peft's)."""
    return isinstance(path, str) and os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def default_lora_targets(model):
    return LORA_TARGETS_BY_MODEL_TYPE.get(getattr(model.config, "model_type", None), LORA_TARGETS)


def lora_targets(model, targets):
    """The names of the linear layers that get an adapter: those whose name is one of `targets` or
    ends in "." + one (peft's rule). Every target must name at least one nn.Linear or Conv1D, and none
    may share its weight with another layer (a tied lm_head: merging would change the embeddings)."""
    from collections import Counter
    from transformers.pytorch_utils import Conv1D
    model_type = getattr(model.config, "model_type", "?")
    linear = [n for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))]
    hits = lambda name: [t for t in targets if name == t or name.endswith("." + t)]  # noqa: E731
    missing = [t for t in targets if not any(t in hits(n) for n in linear)]
    if missing:
        names = sorted({n.rsplit(".", 1)[-1] for n in linear})
        raise LoRAError(f"--lora-target-modules: no linear layer named {missing[0]!r} in this {model_type} model "
                        f"(its linear layers: {', '.join(names)})")
    chosen = [n for n in linear if hits(n)]
    owners = Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
    for name in chosen:
        if owners[id(model.get_submodule(name).weight)] > 1:
            raise LoRAError(f"--lora-target-modules: {name} shares its weight with another layer (tied "
                            "embeddings): leave it out")
    return chosen


def shared_copy(model, fresh=()):
    """A structural copy of `model` whose parameters and buffers ARE the original's tensors (same
    storage, same objects): new module objects, config and generation_config, no new weights;
    except the tensors in `fresh`, which are copied."""
    import copy
    fresh = {id(t) for t in fresh}
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers()) if id(t) not in fresh}
    return copy.deepcopy(model, memo)


def add_lora(base, lora, seed=0, lora_config=None):
    """A new agent: base + a new adapter (LoRAConfig `lora`), as a shared_copy of `base` whose
    target layers are wrapped in LoRALinear. Every base parameter is frozen (requires_grad False,
    shared by all the agents on this base); the adapters' A matrices are drawn from `seed` (a
    generator of their own: the global RNG is left alone). `lora_config` (a dict) is what
    save_adapter writes to adapter_config.json; it is kept on the model as model.lora_config."""
    base.requires_grad_(False)
    model = shared_copy(base)
    names = lora.target_modules or default_lora_targets(model)
    targets = lora_targets(model, names)
    generator = torch.Generator().manual_seed(int(seed))
    for name in targets:
        parent, _, child = name.rpartition(".")
        module = model.get_submodule(parent)
        setattr(module, child, LoRALinear(getattr(module, child), lora.r, lora.alpha, generator))
    model.lora_config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.r, "lora_alpha": lora.alpha,
                         "lora_dropout": 0.0, "bias": "none",
                         "target_modules": list(names),
                         "fan_in_fan_out": any(m.fan_in_fan_out for m in model.modules() if isinstance(m, LoRALinear)),
                         **(lora_config or {})}
    return model


def shared_base(name, device, dtype, seed, bases):
    """(base model, tokenizer) for `name`, loaded once per (name, device, dtype) in the dict `bases`
    (for the tiny model also per seed: its random init is its identity). One team passes one dict,
    so its agents on one device share one frozen base; agents on another device get their own."""
    if name != TINY and os.path.isdir(name):
        name = os.path.abspath(name)  # ./m and m are one base; the adapter config stays valid elsewhere
    key = (name, str(torch.device(device)), dtype, seed if name == TINY else None)
    if key not in bases:
        model, tok = load_agent_model(name, device, dtype, seed=seed)
        bases[key] = (model.requires_grad_(False), tok)
    return bases[key]


def base_record(name, seed):
    """What an adapter's config needs to rebuild its base: peft's base_model_name_or_path, and for
    the random-init tiny model the seed it was built from."""
    if name == TINY:
        return {"base_model_name_or_path": TINY, "magrpo_base_seed": seed}
    return {"base_model_name_or_path": os.path.abspath(name) if os.path.isdir(name) else name}


def load_lora_model(name, device, dtype, seed, lora=None, bases=None, base_seed=None):
    """(model, tokenizer) of a LoRA agent: a saved adapter directory (save_adapter's, or peft's) loads
    as its base + that adapter, trainable, and then `lora` must match it; any other model name
    becomes base + a new adapter of shape `lora`, A drawn from `seed`. The base (for tiny, built from
    base_seed, default seed) comes from `bases` (see shared_base; None: not shared)."""
    import json
    bases = {} if bases is None else bases
    if not is_adapter(name):
        base_seed = seed if base_seed is None else base_seed
        base, tok = shared_base(name, device, dtype, base_seed, bases)
        return add_lora(base, lora, seed, base_record(name, base_seed)), tok
    with open(os.path.join(name, ADAPTER_CONFIG)) as f:
        config = json.load(f)
    unsupported = [k for k in ("use_dora", "use_rslora", "rank_pattern", "alpha_pattern", "modules_to_save",
                               "layers_to_transform") if config.get(k)] + \
        (["bias"] if config.get("bias", "none") != "none" else []) + \
        (["target_modules as a regex"] if isinstance(config.get("target_modules"), str) else [])
    if config.get("peft_type", "LORA") != "LORA" or unsupported:
        raise ValueError(f"{name!r}: an adapter with {', '.join(unsupported) or config.get('peft_type')}, "
                         "which this loader does not support")
    saved = LoRAConfig(config["r"], config["lora_alpha"], tuple(config["target_modules"]))
    if lora is not None and (lora.r, lora.alpha) != (saved.r, saved.alpha):
        raise LoRAError(f"--lora-r: {name} holds an adapter with r={saved.r}, lora_alpha={saved.alpha:g}, "
                        f"not r={lora.r}, lora_alpha={lora.alpha:g}: it is trained further as it is")
    base_name, base_seed = config["base_model_name_or_path"], config.get("magrpo_base_seed", seed)
    base, tok = shared_base(base_name, device, dtype, base_seed, bases)
    try:
        model = add_lora(base, saved, seed, {k: v for k, v in config.items() if k not in ("r", "lora_alpha")})
    except LoRAError as e:  # its target_modules do not fit its base: about the directory, not a flag
        raise ValueError(f"{name!r} does not fit its base {base_name!r}: {str(e).split(': ', 1)[1]}") from None
    load_adapter_weights(model, os.path.join(name, ADAPTER_WEIGHTS))
    return model, tok


def adapter_state(model):
    """The adapter's tensors under peft's names (base_model.model.<layer>.lora_A.weight), so peft
    and this code read each other's adapter files."""
    return {f"base_model.model.{name}.lora_{ab}.weight": getattr(m, f"lora_{ab}")
            for name, m in model.named_modules() if isinstance(m, LoRALinear) for ab in "AB"}


@torch.no_grad()
def load_adapter_weights(model, path):
    from safetensors.torch import load_file
    saved, params = load_file(path), adapter_state(model)
    if saved.keys() != params.keys():
        extra, missing = sorted(saved.keys() - params.keys()), sorted(params.keys() - saved.keys())
        raise ValueError(f"{path} does not fit its adapter config: "
                         f"{'missing ' + missing[0] if missing else 'unexpected ' + extra[0]}")
    for key, p in params.items():
        if saved[key].shape != p.shape:
            raise ValueError(f"{path}: {key} is {tuple(saved[key].shape)}, the model wants {tuple(p.shape)}")
        p.copy_(saved[key])


def save_adapter(model, path):
    """OUT/agent_i as peft lays an adapter out: adapter_model.safetensors (A and B of every adapted
    layer, fp32, a few MB) and adapter_config.json (r, lora_alpha, target_modules,
    base_model_name_or_path, ...). The base is not written: loading names it."""
    import json
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in adapter_state(model).items()},
              os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(path, ADAPTER_CONFIG), "w") as f:
        json.dump(model.lora_config, f, indent=1)


@torch.no_grad()
def merged_model(model):
    """A plain HF model equal to base + adapter: every adapted layer's weight is W + (alpha / r) B A
    (computed in fp32, stored in W's dtype: in bf16 that rounds, and the exact agent remains the
    base + its adapter) and the LoRA wrappers are gone. The shared base is left alone: the adapted weights
    are fresh tensors; the rest (embeddings, norms) stays shared with it."""
    adapted = [m for m in model.modules() if isinstance(m, LoRALinear)]
    merged = shared_copy(model, fresh=[t for m in adapted for t in (m.base.weight, m.lora_A, m.lora_B)])
    for name, m in list(merged.named_modules()):
        if isinstance(m, LoRALinear):
            m.base.weight.copy_((m.base.weight.float() + m.delta_weight()).to(m.base.weight.dtype))
            parent, _, child = name.rpartition(".")
            setattr(merged.get_submodule(parent), child, m.base)
    del merged.lora_config
    return merged


def save_merged(agent, path):
    """A LoRA agent as a full HF model (merged_model), with its tokenizer: it loads with
    from_pretrained or as --model PATH, with no adapter code."""
    quiet_transformers()
    merged_model(agent.model).save_pretrained(path)
    agent.tokenizer.save_pretrained(path)


# -----------------------------------------------------------------------------
# Checkpoints of a train.py run (written by train.py; eval.py reads them too)

CHECKPOINT_STATE = "trainer_state.json"  # in every checkpoint-<step>: the step, the args, every file's size


def checkpoint_problem(path):
    """None if checkpoint directory `path` is complete, else what is wrong with it: its state file
    lists every file with its size, so a missing or truncated file is found without reading it."""
    import json
    try:
        with open(os.path.join(path, CHECKPOINT_STATE)) as f:
            state = json.load(f)
        files = state["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no readable {CHECKPOINT_STATE} ({type(e).__name__})"
    for rel, size in files.items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            return f"{rel} is missing"
        if os.path.getsize(full) != size:
            return f"{rel} is truncated ({os.path.getsize(full)} of {size} bytes)"
    return None


def checkpoints(out):
    """The checkpoint-<step> directories under `out`, newest first, as (step, path)."""
    found = []
    for name in os.listdir(out) if os.path.isdir(out) else []:
        step = name.removeprefix("checkpoint-")
        if step != name and step.isdigit() and os.path.isdir(os.path.join(out, name)):
            found.append((int(step), os.path.join(out, name)))
    return sorted(found, reverse=True)


def latest_checkpoint(out):
    """(step, path) of the newest complete checkpoint under `out`, or None. A broken one (a file
    missing or truncated: a disk that filled up, a copy cut short) is skipped with a warning."""
    for step, path in checkpoints(out):
        problem = checkpoint_problem(path)
        if problem is None:
            return step, path
        warnings.warn(f"skipping {path}: {problem}; trying the one before")
    return None


# -----------------------------------------------------------------------------
# Command-line pieces that train.py and eval.py share (one declaration, one loader)


def add_agent_flags(p):
    p.add_argument("--model", action="append", help="hub name or local path; 'tiny' (default) is the "
                   "built-in random-init model; repeat or give a comma list for one model per agent")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ...; a comma list for one per "
                   "agent; auto: agent i on GPU i mod the GPU count, else the CPU")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)}")
    p.add_argument("--chat-template", action="store_true", help="wrap prompts in the tokenizer's chat template")


def add_sampling_flags(p, temperature, top_p):
    p.add_argument("--max-new-tokens", type=int, help="tokens per completion (paper: 256)")
    p.add_argument("--temperature", type=float, default=temperature)
    p.add_argument("--top-p", type=float, default=top_p)
    p.add_argument("--top-k", type=int, default=0, help="0: no top-k cut")


def add_turn_flags(p):
    """Multi-turn (Sec. 3): the flags both training and evaluation need."""
    p.add_argument("--num-turns", type=int, default=1, help="T: answer, get feedback, revise (1: single turn)")
    p.add_argument("--feedback", default="level", help=f"between turns: {', '.join(FEEDBACK_MODES)}")
    p.add_argument("--feedback-model", help="--feedback expert: the reviewing model (hub name or path)")
    p.add_argument("--feedback-max-new-tokens", type=int, default=256, help="bound on the expert's review")
    p.add_argument("--termination-threshold", type=float,
                   help="a joint answer whose reward reaches it is solved (default: the env's max)")


def config_from_flags(args, **overrides):
    """A Config from the flags that name its fields (the others keep its defaults)."""
    names = [f.name for f in dataclasses.fields(Config)]
    values = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
    return Config(**{**values, **overrides})


def model_names(args):
    """--model given repeated and/or as comma lists, flattened; the tiny model by default."""
    return [m.strip() for spec in (args.model or [TINY]) for m in spec.split(",") if m.strip()]


def per_agent(values, n, flag):
    """A flag given once or as a list -> one value per agent."""
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise ValueError(f"{flag}: gave {len(values)} values for {n} agents")
    return values


def agent_devices(device, n, local_rank=0, local_world=1):
    """One device per agent from --device; "auto" puts agent i on GPU i mod the GPU count (two 3B
    agents with their optimizers do not fit on one 80 GB GPU), else on the CPU. Under torchrun
    with `local_world` processes on a node, process `local_rank` spreads its agents over its own
    share of the node's GPUs (e.g. 4 GPUs, 2 processes: agents 0, 1 on GPUs 0, 1 or 2, 3)."""
    gpus = torch.cuda.device_count()
    devices = [d.strip() for d in device.split(",") if d.strip()]
    if devices == ["auto"]:
        if not gpus:
            return ["cpu"] * n
        share = gpus // local_world
        if share < 1:
            raise ValueError(f"--device: {local_world} processes on this node but {gpus} GPUs")
        return [f"cuda:{local_rank * share + i % share}" for i in range(n)]
    return per_agent(devices, n, "--device")


def load_agent(name, device, dtype, seed, flag="--model", chat_template=False, lora=None, bases=None,
               base_seed=None):
    """An Agent (no optimizer yet) for one model name; a bad one raises ValueError naming the flag.
    LoRA (see load_lora_model): a saved adapter directory loads as its base + its adapter; with
    `lora` (a LoRAConfig) any other model becomes base + a new adapter. `bases`: one dict per team,
    so that its LoRA agents on one base and device share one copy of it."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: unknown {dtype!r}: use one of {', '.join(DTYPES)}")
    try:
        if lora is not None or is_adapter(name):
            model, tok = load_lora_model(name, device, dtype, seed, lora, bases, base_seed)
        else:
            model, tok = load_agent_model(name, device, dtype, seed=seed)
    except LoRAError:
        raise  # it names its own flag
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"{flag}: {e}") from None
    if chat_template and tok.chat_template is None:
        raise ValueError(f"--chat-template: the tokenizer of {name!r} has no chat template")
    return Agent(model, tok, chat_template=chat_template)


def load_expert(args, device):
    """--feedback expert's reviewer, or None. It reads its prompt through its chat template when it
    has one (an instruct model), raw otherwise; greedy, at most --feedback-max-new-tokens tokens."""
    if args.feedback != "expert":
        if args.feedback_model:
            raise ValueError("--feedback-model: only used with --feedback expert")
        return None
    if not args.feedback_model:
        raise ValueError("--feedback: expert needs --feedback-model NAME_OR_PATH (a local causal LM)")
    expert = load_agent(args.feedback_model, device, args.dtype, seed=12345, flag="--feedback-model")
    expert.chat_template = expert.tokenizer.chat_template is not None
    return expert


def chains(turns, num_turns):
    """For an episode sampled with one child per revised node (evaluation), the node that each
    turn-1 node has become at every turn: per turn-1 node, [(turn index, node) for turn 1..T]. A node
    that was not revised (it reached the threshold) stands for itself at the later turns."""
    out = []
    for n in range(len(turns[0].rewards)):
        path = [(0, n)]
        for t in range(1, num_turns):
            prev_t, prev = path[-1]
            k = turns[prev_t].children.get(prev) if prev_t == t - 1 else None
            path.append((t, k * len(turns[t].joint)) if k is not None else (prev_t, prev))
        out.append(path)
    return out
