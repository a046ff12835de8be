"""
MAGRPO: Multi-Agent Group Relative Policy Optimization, one function per idea, in the paper's order.

Paper: Liu et al., arXiv 2508.04652. n agents cooperate on one task; each agent i sees only its own
prompt h_i and samples G completions from its own policy (generate); the g-th completions of all
agents form the g-th joint action (joint_actions), scored with one shared reward R^(g) (score_joint):

    Eq. 1   A^(g) = R^(g) - mean_g' R^(g')                           -> group_advantages
    Eq. 2   J(theta_i) = E[ A^(g) * log pi_theta_i(a_i^(g) | h_i) ]  -> completion_logprobs, policy_loss

and one AdamW step per agent per batch (update_team). On-policy: no ratio, no clipping, no KL.
Multi-turn (Sec. 3): the env's feedback on a joint answer goes into each agent's next prompt
(rollout_team); a node's return adds gamma times its children's mean (node_return); Eq. 1 compares
siblings (episode_advantages). README: "Multi-turn", "The paper, equation by equation".
A course blanks sample_token, generate, completion_logprobs, group_advantages, policy_loss or
node_return; pytest -k NAME runs its tests. Try it: python train.py (CPU demo, ~30 s), --num-turns 2.
"""
import dataclasses
import inspect
import itertools
import math
import re
import time
import warnings
from dataclasses import dataclass, field

import torch

# -----------------------------------------------------------------------------
# The knobs of one step, checked on creation; each field is a flag of train.py (--num-generations),
# its help the field's comment: declared once, here.


@dataclass
class Config:
    num_generations: int = 4  # G, completions per agent per prompt (Sec. 2 step 1)
    max_new_tokens: int = 256  # tokens per completion at most
    temperature: float = 1.0  # sampling temperature (0: greedy)
    top_p: float = 1.0  # nucleus sampling: keep the most likely tokens up to this mass
    top_k: int = 0  # sample among the k most likely tokens only (0: off)
    joint: str = "aligned"  # joint actions: aligned (G of them, the paper) or cross (G^n)
    advantage: str = "mean"  # Eq. 1's baseline: mean (the paper), rloo, std, none or remax
    loss_type: str = "seq_sum"  # Eq. 2's normalisation: seq_sum (paper), token_mean, seq_mean
    micro_batch_size: int = 8  # rows per log-prob forward/backward (memory, not maths)
    num_turns: int = 1  # T: answer, get feedback, revise (Sec. 3; 1: single turn)
    expand: str = "best"  # multi-turn: revise the best joint answer of each group, or all
    discount: float = 0.9  # gamma of node_return, with --expand all (best: turn rewards)
    termination_threshold: float = None  # a joint answer whose reward reaches it is solved (None: env max)
    turn_weights: tuple = None  # comma list, each turn's loss weight (e.g. 1.2,0.8; None: all 1)
    feedback: str = "level"  # between turns: level, plain or expert
    feedback_max_new_tokens: int = 256  # bound on the expert's review (--feedback expert)

    CHOICES = {"joint": ("aligned", "cross"), "advantage": ("mean", "rloo", "std", "none", "remax"),
               "loss_type": ("seq_sum", "token_mean", "seq_mean"), "expand": ("best", "all"),
               "feedback": ("level", "plain", "expert")}

    def __post_init__(self):
        weights = self.turn_weights
        if weights is not None:  # a list, or a flag's comma list
            try:
                self.turn_weights = tuple(map(float, weights.split(",") if isinstance(weights, str)
                                              else weights))
            except ValueError:
                self.check("turn_weights", False, "want a comma list of numbers")
        for name, choices in self.CHOICES.items():
            self.check(name, getattr(self, name) in choices, f"use one of {', '.join(choices)}")
        for name in "num_generations", "max_new_tokens", "micro_batch_size", "num_turns":
            self.check(name, getattr(self, name) >= 1, "must be >= 1")
        self.check("feedback_max_new_tokens", self.feedback_max_new_tokens >= 1, "must be >= 1")
        self.check("temperature", self.temperature >= 0, "must be >= 0 (0 is greedy)")
        self.check("top_p", 0 < self.top_p <= 1, "must be in (0, 1]")
        self.check("top_k", self.top_k >= 0, "must be >= 0 (0: no top-k cut)")
        self.check("discount", 0 <= self.discount <= 1, "must be in [0, 1]")
        self.check("turn_weights", self.turn_weights is None or len(self.turn_weights) == self.num_turns,
                   f"give one weight per turn ({self.num_turns})")

    def check(self, name, ok, why):
        if not ok:
            raise ValueError(f"--{name.replace('_', '-')}: {why}, got {getattr(self, name)!r}")


def add_config_flags(parser, names=None):
    """--flag-name for Config's fields (all, or `names`), default None (train.py and eval.py fill
    their own defaults), help from the field's comment."""
    comments = dict(re.findall(r"^ +(\w+): \w+ = [^#\n]*# (.*)$", inspect.getsource(Config), re.M))
    for f in dataclasses.fields(Config):
        if names is None or f.name in names:
            kind = f.type if f.type in (int, float) else str
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind,
                                help=f"{comments[f.name]} (default {f.default})".replace("%", "%%"))


def config_from_flags(args, **overrides):
    """A Config from the flags that name its fields and were given (the others: Config's defaults)."""
    values = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(Config)}
    return Config(**{**{k: v for k, v in values.items() if v is not None}, **overrides})

# -----------------------------------------------------------------------------
# Sec. 2 step 1: each agent samples G completions of its own prompt (batched decoding, KV cache)


@dataclass
class Rollout:
    """The output of `generate`: B prompts x G completions, row b * G + g the g-th of prompt b."""
    prompt_ids: torch.Tensor  # [B*G, P] left-padded
    prompt_mask: torch.Tensor  # [B*G, P] 1 on real prompt tokens
    completion_ids: torch.Tensor  # [B*G, T] pad after the first EOS
    completion_mask: torch.Tensor  # [B*G, T] 1 up to and including the first EOS, 0 after
    logprobs: torch.Tensor  # [B*G, T] log softmax(logits / T) of each sampled token (0: greedy)
    texts: list  # B lists of G decoded completions, without EOS/pad
    num_generations: int
    seconds: float = 0.0  # wall time of the generate call

    def __len__(self):
        return self.completion_ids.shape[0]

    def rows(self, start, stop):
        """Rows [start, stop), all-padding columns trimmed: a micro-batch costs what it needs."""
        pm, cm = self.prompt_mask[start:stop], self.completion_mask[start:stop]
        p0 = int((pm.sum(0) > 0).nonzero()[0]) if pm.any() else pm.shape[1]
        t1 = int((cm.sum(0) > 0).nonzero()[-1]) + 1 if cm.any() else 0
        return Rollout(self.prompt_ids[start:stop, p0:], pm[:, p0:], self.completion_ids[start:stop, :t1],
                       cm[:, :t1], self.logprobs[start:stop, :t1], [], self.num_generations)


def eos_token_ids(model, tokenizer):
    """The ids that end a completion: the tokenizer's EOS and generation_config's (e.g. Qwen's two)."""
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(extra if isinstance(extra, (list, tuple)) else [extra])} - {None}
    if not ids:
        raise ValueError("the tokenizer has no eos_token and the model's generation_config names none")
    return sorted(ids)


def left_pad(rows, pad_id, device):
    """Token lists -> (ids, mask), left-padded so that decoding continues at every row's end."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


def positions_from_mask(mask):
    """Position ids of left-padded rows, 0 at each row's first token (batched equals unbatched)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def last_logits_only(model, n):
    """model(...) kwargs for the last n positions' logits only (a 150k vocabulary's full logits are
    a step's largest tensor), where supported."""
    keeps = "logits_to_keep" in inspect.signature(model.forward).parameters
    return {"logits_to_keep": n} if keeps else {}


# Seeds: every prompt has its own (from the run's seed, the step, the example, the agent, the turn),
# and row g draws its t-th token from a uniform hashed from (that seed, g, t): a completion never
# depends on the other prompts of its call, on rows that finished early, or on how a batch is split.
_MASK64, _GOLDEN = (1 << 64) - 1, 0x9E3779B97F4A7C15  # splitmix64's increment


def mix_seed(*parts):
    """One 63-bit seed from integers (splitmix64 over the parts): mix_seed(seed, step, index, agent)."""
    x = 0
    for p in parts:
        x = ((x ^ (int(p) & _MASK64)) + _GOLDEN) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x >> 1


def _int64(x):  # a 64-bit pattern as the signed value an int64 tensor holds
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def _shr(x, k):  # logical right shift of an int64 tensor (>> is arithmetic on signed values)
    return (x >> k) & ((1 << (64 - k)) - 1)


def row_uniforms(keys, t):
    """The uniform number in (0, 1) of row `keys[r]` for its t-th token: splitmix64's finaliser over
    (key, t) on int64 tensors (the multiplications wrap around, as the hash wants)."""
    x = keys + _int64((t + 1) * _GOLDEN)
    x = (x ^ _shr(x, 30)) * _int64(0xBF58476D1CE4E5B9)
    x = (x ^ _shr(x, 27)) * _int64(0x94D049BB133111EB)
    x = x ^ _shr(x, 31)
    return (_shr(x, 11).double() + 0.5) / 2.0 ** 53  # the top 53 bits, centred in their interval


def sample_token(logits, temperature=1.0, top_p=1.0, top_k=0, uniform=None):
    """One token per row from softmax(logits / temperature) cut to the top_k tokens (0: all), then to
    the nucleus (the fewest tokens whose probability reaches top_p); temperature 0 is greedy. The token
    is the first whose cumulative probability exceeds the row's `uniform` (default torch.rand)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # the mass before this token reaches top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(outside, 0.0))
    if uniform is None:
        uniform = torch.rand(probs.shape[0], dtype=torch.float64, device=probs.device)
    cdf = probs.double().cumsum(-1)
    target = uniform.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


@torch.no_grad()
def generate(model, tokenizer, prompts, num_generations=1, max_new_tokens=256, temperature=1.0,
             top_p=1.0, top_k=0, seed=None):
    """G = num_generations completions of each prompt (Sec. 2 step 1): a decode loop with a KV cache,
    each prompt prefilled once, its cache repeated G times, a token a step for the rows still running.
    seed: None (torch's RNG), an int, or one int per prompt (see mix_seed)."""
    from transformers import DynamicCache  # here: `import magrpo` stays light for the maths tests
    t_start = time.perf_counter()
    device, G = model.device, num_generations
    eos = torch.tensor(eos_token_ids(model, tokenizer), device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(eos[0])
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    if not ids or max_new_tokens < 1 or G < 1 or not all(ids):
        raise ValueError("generate needs a prompt, no empty prompt, G >= 1 and max_new_tokens >= 1")
    prompt_ids, prompt_mask = left_pad(ids, pad_id, device)
    B, N = len(ids), len(ids) * G
    keys = None
    if seed is not None:  # row b * G + g: a hash of (prompt b's seed, g)
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [mix_seed(seed, b) for b in range(B)]
        if len(seeds) != B:
            raise ValueError(f"generate got {len(seeds)} seeds for {B} prompts")
        keys = torch.tensor([_int64(mix_seed(int(s), g)) for s in seeds for g in range(G)], device=device)

    cache = DynamicCache()
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, past_key_values=cache, use_cache=True,
                position_ids=positions_from_mask(prompt_mask), **last_logits_only(model, 1))
    cache = out.past_key_values
    cache.batch_repeat_interleave(G)  # the G completions of a prompt share its prefill
    logits = out.logits[:, -1, :].float().repeat_interleave(G, dim=0)
    mask = prompt_mask.repeat_interleave(G, dim=0)
    next_pos = mask.sum(-1, keepdim=True)  # the next position id: the number of real tokens so far
    completion = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((N, max_new_tokens), device=device)
    lengths = torch.full((N,), max_new_tokens, dtype=torch.long, device=device)  # EOS included
    alive = torch.arange(N, device=device)  # the original row of each running row
    for t in range(max_new_tokens):
        uniform = None if keys is None or temperature == 0 else row_uniforms(keys[alive], t)
        token = sample_token(logits, temperature, top_p, top_k, uniform)
        completion[alive, t] = token
        if temperature > 0:  # log softmax(logits / T) of the drawn token, before any top-k/top-p cut
            scaled = logits / temperature
            logprobs[alive, t] = scaled.gather(-1, token[:, None])[:, 0] - torch.logsumexp(scaled, -1)
        done = torch.isin(token, eos)
        n_done = int(done.sum())  # the loop's one device sync per token (a boolean index is another)
        if n_done:
            lengths[alive[done]] = t + 1
        if t == max_new_tokens - 1 or n_done == len(alive):
            break
        if n_done:  # drop the finished rows from the running batch and from the cache
            keep = (~done).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            alive, token, mask, next_pos = alive[keep], token[keep], mask[keep], next_pos[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        cache, logits, next_pos = out.past_key_values, out.logits[:, -1, :].float(), next_pos + 1

    completion_mask = (torch.arange(max_new_tokens, device=device)[None, :] < lengths[:, None]).long()
    completion = completion.masked_fill(completion_mask == 0, pad_id)
    rows, lens, eos_ids = completion.tolist(), lengths.tolist(), set(eos.tolist())
    ends = [n - (row[n - 1] in eos_ids) for row, n in zip(rows, lens)]  # a final EOS is not text
    texts = [[tokenizer.decode(rows[r][:ends[r]], skip_special_tokens=True) for r in range(b * G, b * G + G)]
             for b in range(B)]
    return Rollout(prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0), completion,
                   completion_mask, logprobs * completion_mask, texts, G, time.perf_counter() - t_start)

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
    credit = []
    for i in range(num_agents):
        member = torch.zeros(len(joint), num_generations)  # member[j, g]: joint action j uses agent i's g
        member[torch.arange(len(joint)), torch.tensor([idx[i] for idx in joint])] = 1.0
        credit.append(returns @ member / member.sum(0))
    return credit


@dataclass
class ScoreError:
    """The reward of a joint action whose scoring raised: 0, the error kept for logs and feedback."""
    error: str

    def __float__(self):
        return 0.0


def score_joint(env, examples, outputs, one=None):
    """The shared reward of each (example, joint output): env.rewards on the batch, else one by one
    with `one` (default env.reward), a sample whose scoring raises getting a ScoreError."""
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
    remax: R - `baseline`, one per group: its greedy joint answer's reward (ReMax, Li et al. 2023)."""
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


def completion_logprobs(model, rollout, temperature=1.0):
    """log pi_theta(a_t | h, a_<t) of every completion token, with grad (Eq. 2), at the sampling
    temperature (the distribution the tokens came from, before a top-p/k cut, as TRL's GRPO; greedy:
    T = 1). [rows, T]; what follows EOS is to be masked."""
    T = temperature if temperature > 0 else 1.0
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    L = rollout.completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask),
                   **last_logits_only(model, L + 1)).logits
    logits = logits[:, -(L + 1):-1, :].float() / T  # the logit at position t predicts token t + 1
    token_logits = logits.gather(-1, rollout.completion_ids[..., None]).squeeze(-1)
    return token_logits - torch.logsumexp(logits, dim=-1)


def policy_loss(logprobs, mask, advantages, loss_type="seq_sum", normalizer=None):
    """Eq. 2 as a loss to minimise, -A^(g) * log pi(a^(g) | h), one advantage per sequence:
    seq_sum    -mean_s(A_s * sum_t m*lp)             (the paper: a completion's summed log-probs)
    token_mean -sum_{s,t}(A_s * m * lp) / sum(m)     (DAPO: every token weighs the same)
    seq_mean   -mean_s(A_s * sum_t(m*lp) / sum_t m)  (original GRPO)
    mask: 1 up to EOS. normalizer: counted once over the whole batch (loss_normalizer), so that
    micro-batch losses add up to the batch's (default: this batch's)."""
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

# -----------------------------------------------------------------------------
# Sec. 3: the return of a node of the multi-turn tree


def node_return(reward, child_returns, gamma):
    """R_t = r_t + gamma * mean(R_{t+1} of the node's children); a node without children: r_t."""
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
# A team's episode (Sec. 2 steps 1-3; Sec. 3): sample, join, score, and between turns feedback


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


@dataclass
class Group:
    """One prompt per agent, sampled `size` times: turn 1's, or a later turn's after one node."""
    example: int  # index of the example in the batch
    parent: int  # the node of the previous turn this group revises (None at turn 1)
    prompts: list  # one env prompt per agent
    histories: list  # per agent: [(its own answer, the feedback it got), ...] of earlier turns
    seed: int  # the group's sampling seed; agent i samples with mix_seed(seed, i)


@dataclass
class Turn:
    """One turn of the batch. Node n = k * J + j: group k's j-th joint action; rows k * size + g."""
    groups: list
    size: int  # completions per agent per group
    rollouts: list  # one Rollout per agent
    joint: list  # index tuples of one group's joint actions
    outputs: list  # per node: one text per agent
    rewards: list  # per node: the env's reward (float() of it is the number)
    terminated: list  # per node: its reward reached the termination threshold (solved)
    children: dict = field(default_factory=dict)  # revised node -> its group at the next turn
    baseline: list = None  # remax, turn 1: per group, the reward of the greedy joint answer
    advantages: list = None  # per agent, each row's advantage in Eq. 2 (update_team sets it)

    def values(self):
        """The rewards as numbers, [groups, J]."""
        return torch.tensor([float(r) for r in self.rewards]).view(len(self.groups), len(self.joint))


def sample_agent(agent, i, prompts, size, cfg, seeds):
    """Agent i samples `size` completions of each of its prompts in one generate call (prompt b
    seeded mix_seed(seeds[b], i)): decentralised, it sees nothing of the others."""
    texts = [agent.format(p) for p in prompts]
    return generate(agent.model, agent.tokenizer, texts, size, cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                    cfg.top_k, seed=[mix_seed(s, i) for s in seeds])


def sample_turn(agents, env, examples, groups, size, cfg, greedy=False):
    """Sample every group of a turn (a generate call per agent), join and score (Sec. 2 steps 1-3).
    greedy (remax): the reward of the agents' greedy joint answer is the group's baseline."""
    def sample(size, cfg):
        return [sample_agent(agent, i, [g.prompts[i] for g in groups], size, cfg, [g.seed for g in groups])
                for i, agent in enumerate(agents)]
    rollouts, joint = sample(size, cfg), joint_actions(len(agents), size, cfg.joint)
    outputs = [tuple(r.texts[k][j] for r, j in zip(rollouts, idx)) for k in range(len(groups))
               for idx in joint]
    rewards = score_joint(env, [examples[g.example] for g in groups for _ in joint], outputs)
    turn = Turn(groups, size, rollouts, joint, outputs, rewards, [False] * len(outputs))
    if greedy:
        texts = [r.texts for r in sample(1, dataclasses.replace(cfg, temperature=0.0))]
        answers = [tuple(t[k][0] for t in texts) for k in range(len(groups))]
        turn.baseline = [float(r) for r in score_joint(env, [examples[g.example] for g in groups], answers)]
    return turn


def expand_nodes(turn, mode, threshold):
    """The nodes of `turn` that get children; one whose reward reached the threshold is solved. all:
    every node not solved. best: each group's best (ties to the first) unless the whole group is solved
    (the paper-era rule: revising a solved best answer teaches the agents to keep what is right)."""
    values, J = turn.values(), len(turn.joint)
    turn.terminated = [float(v) >= threshold - 1e-9 for v in values.view(-1)]
    if mode == "all":
        return [n for n in range(len(turn.outputs)) if not turn.terminated[n]]
    return [k * J + int(values[k].argmax()) for k in range(len(turn.groups))
            if not all(turn.terminated[k * J:(k + 1) * J])]


def team_feedback(env, examples, turn, nodes, cfg, expert=None):
    """The env's feedback on each node's joint answer, one text per agent (Sec. 3). expert: an expert
    model first reviews each agent's part of every node, greedily, all in one generate call."""
    J, n = len(turn.joint), len(turn.rollouts)
    cases = [(examples[turn.groups[node // J].example], turn.outputs[node]) for node in nodes]
    reviews = [None] * len(nodes)
    if cfg.feedback == "expert":
        prompts = [expert.format(env.expert_prompt(ex, out, i)) for ex, out in cases for i in range(n)]
        r = generate(expert.model, expert.tokenizer, prompts, 1, cfg.feedback_max_new_tokens, temperature=0)
        reviews = [[texts[0] for texts in r.texts[k * n:(k + 1) * n]] for k in range(len(nodes))]
    return [env.feedback(ex, outputs, cfg.feedback, reward=turn.rewards[node], reviews=texts)
            for (ex, outputs), node, texts in zip(cases, nodes, reviews)]


def rollout_team(agents, env, examples, cfg, seeds, expert=None, children=None):
    """One episode per example (Sec. 2 steps 1-3; Sec. 3) -> its Turns. Each node of expand_nodes gets
    the env's feedback and becomes a group: each agent's prompt holds its own answers and feedback (not
    a partner's), sampled `children` times (default G). seeds: one per example."""
    threshold = cfg.termination_threshold
    threshold = getattr(env, "max_reward", math.inf) if threshold is None else threshold
    n, size = len(agents), cfg.num_generations
    groups = [Group(b, None, list(env.prompts(ex)), [[] for _ in range(n)], mix_seed(seeds[b], 1))
              for b, ex in enumerate(examples)]
    turns = []
    for t in range(1, cfg.num_turns + 1):
        turn = sample_turn(agents, env, examples, groups, size, cfg, t == 1 and cfg.advantage == "remax")
        turns.append(turn)
        nodes = expand_nodes(turn, cfg.expand, threshold)
        if t == cfg.num_turns or not nodes:
            break
        J, groups = len(turn.joint), []
        for node, notes in zip(nodes, team_feedback(env, examples, turn, nodes, cfg, expert)):
            parent = turn.groups[node // J]
            histories = [h + [(turn.outputs[node][i], notes[i])] for i, h in enumerate(parent.histories)]
            prompts = [env.revision_prompt(examples[parent.example], i, histories[i]) for i in range(n)]
            turn.children[node] = len(groups)
            groups.append(Group(parent.example, node, prompts, histories, mix_seed(parent.seed, t, node % J)))
        size = children or cfg.num_generations
    return turns


def episode_returns(turns, gamma, num_turns):
    """Per turn, each node's return, [groups, J], from the last turn back: node_return of a revised
    node, solved_return of a solved one (over the turns it skips), else its reward."""
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
    """Eq. 1 among siblings: per turn, per agent, an advantage per rollout row. all: on the returns
    (every sibling is revised or solved: one horizon); best: on each turn's rewards (only the best has
    a next turn: a return would favour it). cross: a completion's credit is its joint actions' mean."""
    if cfg.expand == "all":
        values = episode_returns(turns, cfg.discount, cfg.num_turns)
    else:
        values = [turn.values() for turn in turns]
    mode = [cfg.advantage if cfg.advantage != "remax" or turn.baseline else "mean" for turn in turns]
    return [[group_advantages(c, m, turn.baseline).view(-1)  # remax after turn 1: no greedy answer, mean
             for c in credited_returns(v, turn.joint, len(turn.rollouts), turn.size)]
            for turn, v, m in zip(turns, values, mode)]

# -----------------------------------------------------------------------------
# Sec. 2 steps 4-6: the update, Eq. 2 for every agent, one AdamW step each


class MasterWeightAdamW:
    """AdamW over fp32 master copies of low-precision (bf16) weights: an update at RL learning rates
    is below bf16's resolution and would round away; the master copy keeps it."""

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
    """AdamW per agent (Sec. 2 step 6) over its trainable parameters; fp32 master weights if low-precision."""
    params = [p for p in model.parameters() if p.requires_grad]
    if all(p.dtype == torch.float32 for p in params):
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
    return MasterWeightAdamW(params, lr=learning_rate, weight_decay=weight_decay)


# Data parallelism (torchrun): each process samples its share of the batch; the loss denominators, then
# the gradients, are summed over the processes, so all take the whole batch's step (alone: no-ops).
def data_parallel():
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def all_sum(values, device="cpu"):
    """The element-wise sum of a list of numbers over the processes."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if data_parallel():
        torch.distributed.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def sum_gradients(model):
    """Each gradient summed over the processes (each loss is already divided by the whole batch's
    count). A gradient no process has stays None."""
    if not data_parallel():
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p, n in zip(params, all_sum([float(p.grad is not None) for p in params], params[0].device)):
        if n:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            torch.distributed.all_reduce(grad)
            p.grad = grad


def update_agent(agent, parts, cfg):
    """Eq. 2 for one agent: parts = [(rollout or None, advantages, weight)] per turn, each turn's loss
    normalised over its whole batch (all processes) and weighted; micro-batches accumulate one gradient
    (rows with advantage 0 are not run), then one step, skipped with a warning if not finite."""
    model, opt, mbs = agent.model, agent.optimizer, cfg.micro_batch_size
    model.eval()  # dropout off: the gradient must be of the very policy that sampled (as TRL does)
    opt.zero_grad(set_to_none=True)
    normalizers = all_sum([0.0 if r is None else float(loss_normalizer(r.completion_mask, cfg.loss_type))
                           for r, _, _ in parts])
    total = 0.0
    for (rollout, advantages, weight), normalizer in zip(parts, normalizers):
        for start in range(0, len(rollout) if rollout is not None else 0, mbs):
            adv = advantages[start:start + mbs].to(rollout.completion_ids.device)
            if not adv.any():
                continue
            mb = rollout.rows(start, start + mbs)
            lp = completion_logprobs(model, mb, cfg.temperature)
            loss = weight * policy_loss(lp, mb.completion_mask, adv, cfg.loss_type, normalizer)
            loss.backward()
            total = total + loss.detach()
    sum_gradients(model)
    (total,) = all_sum([float(total)])
    grads = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    grad_norm = torch.stack(grads).norm().item() if grads else 0.0  # logged only: the paper clips nothing
    skipped = not (math.isfinite(total) and math.isfinite(grad_norm))
    if skipped:
        warnings.warn(f"non-finite loss ({total}) or grad norm ({grad_norm}): skipping this agent's step")
    else:
        opt.step()  # parameters without a gradient (all advantages 0) are left alone
    opt.zero_grad(set_to_none=True)
    return {"loss": total, "grad_norm": grad_norm, "skipped": int(skipped)}


def update_team(agents, turns, cfg):
    """Sec. 2 steps 4-6: every turn's advantages, then update_agent for each agent -> per-agent metrics,
    and zero_adv_groups (groups with no signal: all advantages 0)."""
    advantages = episode_advantages(turns, cfg)
    for turn, adv in zip(turns, advantages):
        turn.advantages = adv
    zero = sum(int(torch.stack([a.view(len(turn.groups), -1) == 0 for a in adv]).all(0).all(-1).sum())
               for turn, adv in zip(turns, advantages))
    metrics = {"zero_adv_groups": int(all_sum([zero])[0])}
    for i, agent in enumerate(agents):
        weights = cfg.turn_weights or [1.0] * cfg.num_turns
        parts = [(turns[t].rollouts[i], advantages[t][i], weights[t]) if t < len(turns) else (None, None, 0.0)
                 for t in range(cfg.num_turns)]  # one part per turn on every process, sampled or not
        metrics.update({f"{k}_{i}": v for k, v in update_agent(agent, parts, cfg).items()})
        lengths = torch.cat([turn.rollouts[i].completion_mask.sum(-1).float().cpu() for turn in turns])
        total, count = all_sum([lengths.sum().item(), len(lengths)])
        metrics[f"completion_len_{i}"] = total / count
    return metrics
