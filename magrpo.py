"""
MAGRPO: Multi-Agent Group Relative Policy Optimization, one function per idea, in the paper's order.

Paper: Liu et al., arXiv 2508.04652. n agents cooperate on one task; each agent i sees only its own
prompt h_i and samples G completions from its own policy (generate); the g-th completions of all
agents form the g-th joint action (joint_actions), scored with one shared reward R^(g) (score_joint):

    Eq. 1   A^(g) = R^(g) - mean_g' R^(g')                           -> group_advantages
    Eq. 2   J(theta_i) = E[ A^(g) * log pi_theta_i(a_i^(g) | h_i) ]  -> completion_logprobs, policy_loss

and one AdamW step per agent per batch. On-policy: no ratio, no clipping, no KL. Multi-turn (Sec. 3):
the env's feedback on a joint answer goes into each agent's next prompt (rollout_team); a node's
return adds gamma times its children's mean (node_return); Eq. 1 compares siblings
(episode_advantages). train_step is one whole step, the function to read first.

A course blanks sample_token, decode_step, completion_logprobs, group_advantages, policy_loss or
node_return; pytest -k NAME runs its tests. Try it: python train.py (CPU demo, ~30 s), --num-turns 2.
"""
import dataclasses
import functools
import inspect
import itertools
import math
import time
import warnings
from dataclasses import dataclass, field

import torch

# -----------------------------------------------------------------------------
# The knobs of one step. Each Config field is also a flag of train.py and eval.py (num_generations
# -> --num-generations), its help written beside it: declared once, here. The defaults are the
# paper's (Sec. 2); envs.DEFAULTS holds the few that depend on the run (the tiny model, the env).


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
               "feedback": ("level", "plain", "expert")}

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


def add_config_flags(parser, names=None):
    """--flag-name for Config's fields (all, or `names`), default None so that train.py and eval.py
    can tell a flag the user gave from one they fill in."""
    for f in dataclasses.fields(Config):
        if names is None or f.name in names:
            kind = f.type if f.type in (int, float) else str
            text = f"{f.metadata['help']} (default {f.default})".replace("%", "%%")  # argparse formats %
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, help=text)


def config_from_flags(args, **overrides):
    """A Config from the flags that name its fields and were given (the others: Config's defaults)."""
    values = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(Config)}
    given = {name: value for name, value in values.items() if value is not None}
    return Config(**{**given, **overrides})

# -----------------------------------------------------------------------------
# Seeds. Every prompt of a step has a seed of its own (mix_seed of the run's seed, the step, the
# example, the agent, the turn), and row g of that prompt draws its t-th token with a uniform number
# hashed from (that seed, g, t) (row_uniforms). So a completion never depends on the other prompts of
# its generate call, on rows that finished early, or on how a batch is split among processes: a
# resumed or a data-parallel run samples exactly what one uninterrupted process would.

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment, the golden ratio in 64 bits
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's two multipliers


def mix_seed(*parts):
    """One 63-bit seed from integers, splitmix64 over the parts: mix_seed(seed, step, index, agent)."""
    x = 0
    for part in parts:
        x = ((x ^ (int(part) & _MASK64)) + _GOLDEN) & _MASK64
        x = ((x ^ (x >> 30)) * _MIX1) & _MASK64
        x = ((x ^ (x >> 27)) * _MIX2) & _MASK64
        x ^= x >> 31
    return x >> 1


def _int64(x):
    """A 64-bit pattern as the signed value an int64 tensor holds."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def _shr(x, k):
    """Logical right shift of an int64 tensor (torch's >> is arithmetic on signed values)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def row_keys(seed, num_prompts, num_generations, device):
    """The hash key of each row b * G + g: mix_seed(prompt b's seed, g). seed: None (no keys: torch's
    RNG), an int (prompt b's seed is mix_seed(seed, b)) or one int per prompt."""
    if seed is None:
        return None
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [mix_seed(seed, b) for b in range(num_prompts)]
    if len(seeds) != num_prompts:
        raise ValueError(f"generate got {len(seeds)} seeds for {num_prompts} prompts")
    rows = itertools.product(seeds, range(num_generations))  # (prompt b's seed, g) in row order
    return torch.tensor([_int64(mix_seed(int(s), g)) for s, g in rows], device=device)


def row_uniforms(keys, t):
    """The uniform number in (0, 1) of each row's t-th token: splitmix64's finaliser over (key, t) on
    int64 tensors (the multiplications wrap around, as the hash wants)."""
    x = keys + _int64((t + 1) * _GOLDEN)
    x = (x ^ _shr(x, 30)) * _int64(_MIX1)
    x = (x ^ _shr(x, 27)) * _int64(_MIX2)
    x = x ^ _shr(x, 31)
    return (_shr(x, 11).double() + 0.5) / 2.0 ** 53  # the top 53 bits, centred in their interval

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
        """Rows [start, stop), with the columns that are padding in all of them cut off, so that a
        micro-batch of short rows costs what they need, not what the longest row of the batch needs."""
        prompt_mask, completion_mask = self.prompt_mask[start:stop], self.completion_mask[start:stop]
        first = prompt_mask.shape[1] - int(prompt_mask.sum(-1).max())  # prompts are padded on the left
        end = int(completion_mask.sum(-1).max())  # completions on the right
        return Rollout(self.prompt_ids[start:stop, first:], prompt_mask[:, first:],
                       self.completion_ids[start:stop, :end], completion_mask[:, :end],
                       self.logprobs[start:stop, :end], [], self.num_generations)


def eos_token_ids(model, tokenizer):
    """The ids that end a completion: the tokenizer's EOS and generation_config's (e.g. Qwen's two)."""
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    extra = extra if isinstance(extra, (list, tuple)) else [extra]
    ids = {tokenizer.eos_token_id, *extra} - {None}
    if not ids:
        raise ValueError("the tokenizer has no eos_token and the model's generation_config names none")
    return sorted(ids)


def left_pad(rows, pad_id, device):
    """Token lists -> (ids, mask), left-padded so that decoding continues at every row's end."""
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad_id] * (width - len(row)) + row for row in rows], device=device)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], device=device)
    return ids, mask


def positions_from_mask(mask):
    """Position ids of left-padded rows, 0 at each row's first real token: without them a padded row
    would see its tokens at shifted positions, and batched decoding would differ from unbatched."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@functools.lru_cache(maxsize=None)
def _forward_parameters(model_class):
    return set(inspect.signature(model_class.forward).parameters)


def forward_kwargs(model, cache=None, last=None):
    """model(...)'s keyword arguments for a KV `cache` and for the logits of the `last` positions only
    (with a 150k vocabulary the full logits are a step's largest tensor), as this model takes them."""
    accepted = _forward_parameters(type(model))
    kwargs = {}
    if cache is not None:  # transformers 5 names it `cache` (the old name warns on every call)
        kwargs["cache" if "cache" in accepted else "past_key_values"] = cache
        kwargs["use_cache"] = True
    if last is not None and "logits_to_keep" in accepted:
        kwargs["logits_to_keep"] = last
    return kwargs


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
    # Inverse-CDF sampling in float64; the cut probabilities need no renormalising, since the uniform
    # number is scaled by the row's remaining mass.
    cdf = probs.double().cumsum(-1)
    target = uniform.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]
    token = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return token.clamp(max=probs.shape[-1] - 1)  # (a uniform at the very top of the cdf)


def decode_step(model, cache, tokens, mask, positions):
    """One step of the decode loop: each running row's newest token, at its position id, goes through
    the model with the KV cache of the row's earlier tokens; the cache grows by that token.
    tokens, positions: [rows]; mask: [rows, earlier + 1], 0 on left padding. -> next logits [rows, vocab]."""
    return model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                 **forward_kwargs(model, cache)).logits[:, -1, :].float()


def completion_texts(tokenizer, completion, lengths, eos_ids, num_generations):
    """The texts of generate's rows: each row's tokens up to its length, without a final EOS (it ends
    the text but is no part of it) -> B lists of G texts."""
    texts = []
    for tokens, length in zip(completion, lengths):
        end = length - 1 if tokens[length - 1] in eos_ids else length
        texts.append(tokenizer.decode(tokens[:end], skip_special_tokens=True))
    return [texts[b:b + num_generations] for b in range(0, len(texts), num_generations)]


@torch.no_grad()
def generate(model, tokenizer, prompts, num_generations=1, max_new_tokens=256, temperature=1.0,
             top_p=1.0, top_k=0, seed=None):
    """G = num_generations completions of each prompt (Sec. 2 step 1): each prompt is prefilled once
    and its KV cache repeated G times, then decode_step runs a token at a time for the rows still
    running. seed: None (torch's RNG), an int, or one int per prompt (row_keys)."""
    from transformers import DynamicCache  # here: `import magrpo` stays light for the maths tests
    t_start = time.perf_counter()
    device, G = model.device, num_generations
    eos = torch.tensor(eos_token_ids(model, tokenizer), device=device)
    pad_id = tokenizer.pad_token_id
    pad_id = int(eos[0]) if pad_id is None else pad_id  # many base models have none; it is masked anyway
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    if not ids or max_new_tokens < 1 or G < 1 or not all(ids):
        raise ValueError("generate needs a prompt, no empty prompt, G >= 1 and max_new_tokens >= 1")
    prompt_ids, prompt_mask = left_pad(ids, pad_id, device)
    keys = row_keys(seed, len(ids), G, device)
    N = len(ids) * G
    # Prefill: each prompt runs once, and its G completions share its cache.
    cache = DynamicCache()
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask,
                position_ids=positions_from_mask(prompt_mask), **forward_kwargs(model, cache, last=1))
    cache.batch_repeat_interleave(G)
    logits = out.logits[:, -1, :].float().repeat_interleave(G, dim=0)
    mask = prompt_mask.repeat_interleave(G, dim=0)
    positions = mask.sum(-1)  # a row's next position id: the number of its real tokens so far
    completion = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((N, max_new_tokens), device=device)
    lengths = torch.full((N,), max_new_tokens, dtype=torch.long, device=device)  # EOS included
    alive = torch.arange(N, device=device)  # the original row of each running row
    for t in range(max_new_tokens):
        uniform = row_uniforms(keys[alive], t) if keys is not None and temperature > 0 else None
        token = sample_token(logits, temperature, top_p, top_k, uniform)
        completion[alive, t] = token
        if temperature > 0:  # the sampler's own log-prob: log softmax(logits / T), before a top-k/p cut
            scaled = logits / temperature
            logprobs[alive, t] = scaled.gather(-1, token[:, None])[:, 0] - torch.logsumexp(scaled, -1)
        done = torch.isin(token, eos)
        n_done = int(done.sum())  # the loop's one device sync per token
        if n_done:  # finished rows leave the batch and the cache: they cost nothing from here on
            lengths[alive[done]] = t + 1  # (guarded: a boolean index would sync too)
            keep = (~done).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            alive, token, mask, positions = alive[keep], token[keep], mask[keep], positions[keep]
        if t == max_new_tokens - 1 or len(alive) == 0:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = decode_step(model, cache, token, mask, positions)
        positions = positions + 1

    completion_mask = (torch.arange(max_new_tokens, device=device)[None, :] < lengths[:, None]).long()
    texts = completion_texts(tokenizer, completion.tolist(), lengths.tolist(), set(eos.tolist()), G)
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
    # members[i][j, g] = 1: joint action j uses agent i's g-th completion
    members = torch.nn.functional.one_hot(torch.tensor(joint).T, num_generations).float()
    return [returns @ members[i] / members[i].sum(0) for i in range(num_agents)]


@dataclass
class ScoreError:
    """The reward of a joint action whose scoring raised: 0, the error kept for logs and feedback."""
    error: str

    def __float__(self):
        return 0.0


def score_joint(env, examples, outputs, one=None):
    """The shared reward of each (example, joint output): env.rewards on the batch, else one by one
    with `one` (default env.reward), a sample whose scoring raises getting a ScoreError: one broken
    answer must cost its own reward, not the step."""
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
    temperature: the distribution the tokens came from, before any top-p/k cut, as TRL's GRPO
    (greedy: T = 1). -> [rows, T]; the positions after a row's EOS are to be masked by the caller."""
    from transformers import DynamicCache
    T = temperature if temperature > 0 else 1.0
    P = rollout.prompt_ids.shape[1]
    # A group's G rows continue the same prompt: each distinct prompt runs once (Prefix Grouper, Liu
    # et al. 2025), with gradients, since its keys and values depend on the weights too.
    prompts, prompt_of_row = torch.unique(torch.cat([rollout.prompt_ids, rollout.prompt_mask], dim=1),
                                          dim=0, return_inverse=True)
    prompt_mask = prompts[:, P:]
    cache = DynamicCache()
    out = model(input_ids=prompts[:, :P], attention_mask=prompt_mask,
                position_ids=positions_from_mask(prompt_mask), **forward_kwargs(model, cache, last=1))
    # A prompt's last logit predicts its rows' first token (the last position: a model that does
    # not take logits_to_keep returns every position's logits).
    first = out.logits[prompt_of_row, -1:]
    # Each row attends to its prompt's cache (repeated by indexing: autograd adds up the rows'
    # gradients of each prompt, so the result equals running every row whole), then runs its tokens.
    cache.batch_select_indices(prompt_of_row)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    positions = positions_from_mask(mask)[:, P:]
    rest = model(input_ids=rollout.completion_ids, attention_mask=mask, position_ids=positions,
                 **forward_kwargs(model, cache)).logits
    logits = torch.cat([first, rest[:, :-1]], dim=1).float() / T  # position t's logit predicts token t + 1
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
# A team's episode (Sec. 2 steps 1-3; Sec. 3): sample, join, score, and between turns feedback.
# The episode is a tree: at turn 1 each example is a group of G joint actions (its nodes); a node
# that is revised becomes a group of the next turn, whose prompts hold that node's answers and the
# env's feedback on them.


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
    """One turn of the batch: its groups, each of `size` completions per agent (rollout rows) and
    len(joint) joint actions (its nodes). The methods below name the tree's indices."""
    groups: list
    size: int  # completions per agent per group
    rollouts: list  # one Rollout per agent
    joint: list  # index tuples of one group's joint actions
    outputs: list  # per node: one text per agent
    rewards: list  # per node: the env's reward (float() of it is the number)
    terminated: list  # per node: its reward reached the termination threshold (solved)
    children: dict = field(default_factory=dict)  # revised node -> its group at the next turn
    baseline: list = None  # remax, turn 1: per group, the reward of the greedy joint answer
    advantages: list = None  # per agent, each row's advantage in Eq. 2 (train_step sets it)

    def node(self, group, action):
        """The node of group `group`'s joint action number `action` (an index into `joint`)."""
        return group * len(self.joint) + action

    def place(self, node):
        """(its group, its joint action's number): node's inverse."""
        return divmod(node, len(self.joint))

    def row(self, group, g):
        """The rollout row of group `group`'s g-th completion (the same in every agent's rollout)."""
        return group * self.size + g

    def values(self):
        """The rewards as numbers, [groups, J]."""
        return torch.tensor([float(r) for r in self.rewards]).view(len(self.groups), len(self.joint))

    def zero_advantage_groups(self):
        """How many groups have every agent's every advantage 0 (their rows, as `row` numbers them)."""
        per_group = torch.stack(self.advantages).view(len(self.advantages), len(self.groups), self.size)
        return int((per_group == 0).all(-1).all(0).sum())


def sample_agent(agent, i, prompts, size, cfg, seeds):
    """Agent i samples `size` completions of each of its prompts in one generate call (prompt b
    seeded mix_seed(seeds[b], i)): decentralised, it sees nothing of the others."""
    texts = [agent.format(p) for p in prompts]
    return generate(agent.model, agent.tokenizer, texts, size, cfg.max_new_tokens, cfg.temperature,
                    cfg.top_p, cfg.top_k, seed=[mix_seed(s, i) for s in seeds])


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
    terminated = [float(r) >= threshold - 1e-9 for r in rewards]
    turn = Turn(groups, size, rollouts, joint, outputs, rewards, terminated)
    if greedy:  # ReMax's baseline: the reward of the agents' greedy joint answer, one per group
        greedy_cfg = dataclasses.replace(cfg, temperature=0.0, joint="aligned")
        greedy_turn = sample_turn(agents, env, examples, groups, 1, greedy_cfg, threshold)
        turn.baseline = [float(r) for r in greedy_turn.rewards]
    return turn


def expand_nodes(turn, mode):
    """The nodes of `turn` that get children at the next turn. all: every node not solved. best: each
    group's best node (ties to the first) unless the whole group is solved (the paper-era rule:
    revising a solved best answer teaches the agents to keep what is right)."""
    if mode == "all":
        return [node for node in range(len(turn.outputs)) if not turn.terminated[node]]
    values = turn.values()
    solved = torch.tensor(turn.terminated).view(values.shape).all(-1)  # per group: all its nodes
    return [turn.node(k, int(values[k].argmax())) for k in range(len(turn.groups)) if not solved[k]]


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
    """One episode per example (Sec. 2 steps 1-3; Sec. 3) -> its Turns. After each turn the nodes of
    expand_nodes get the env's feedback and are revised, each sampled `children` times (default G).
    seeds: one per example."""
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
            elif turn.terminated[node]:
                values.append(solved_return(reward, num_turns - 1 - t, gamma))
            else:  # a leaf not solved: the last turn's (or, with --expand best, one not revised)
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
        # remax compares with the greedy joint answer, which only turn 1 has: later turns use the mean
        mode = "mean" if cfg.advantage == "remax" and not turn.baseline else cfg.advantage
        credits = credited_returns(turn_values, turn.joint, len(turn.rollouts), turn.size)
        advantages.append([group_advantages(credit, mode, turn.baseline).view(-1) for credit in credits])
    return advantages

# -----------------------------------------------------------------------------
# Sec. 2 steps 4-6: the update, Eq. 2 for every agent, one step of its own optimizer each (AdamW:
# train.make_optimizer)


# Data parallelism (torchrun): each process samples its share of the batch; the loss denominators, then
# the gradients, are summed over the processes, so all take the whole batch's step (alone: no-ops).
def data_parallel():
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def all_sum(values, device="cpu"):
    """The element-wise sum of a list of numbers over the processes (float64: a count or a sum of
    losses loses nothing on the way)."""
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
    has_grad = all_sum([float(p.grad is not None) for p in params], params[0].device)
    for p, processes_with_grad in zip(params, has_grad):
        if processes_with_grad:
            p.grad = p.grad if p.grad is not None else torch.zeros_like(p)  # another process has one
            torch.distributed.all_reduce(p.grad)


def update_agent(agent, parts, cfg):
    """Eq. 2 for one agent: parts = [(rollout or None, advantages, weight)] per turn, each turn's loss
    normalised over its whole batch (all processes) and weighted; micro-batches accumulate one gradient
    (rows with advantage 0 are not run), then one step, skipped with a warning if not finite."""
    model, optimizer, mbs = agent.model, agent.optimizer, cfg.micro_batch_size
    model.eval()  # dropout off: the gradient must be of the very policy that sampled (as TRL does)
    model.zero_grad(set_to_none=True)
    # Each turn's denominator, counted once over the whole batch: the micro-batches' losses add up to its.
    counts = [float(loss_normalizer(r.completion_mask, cfg.loss_type)) if r is not None else 0.0
              for r, _, _ in parts]  # (None: a turn this process's episodes never reached)
    total = 0.0
    for (rollout, advantages, weight), normalizer in zip(parts, all_sum(counts)):
        if rollout is None:
            continue
        for start, stop in micro_batches(len(rollout), rollout.num_generations, mbs):
            adv = advantages[start:stop].to(rollout.completion_ids.device)
            if not adv.any():  # no signal: the rows' loss and gradient are 0 anyway
                continue
            mb = rollout.rows(start, stop)
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
        optimizer.step()  # parameters without a gradient (all advantages 0) are left alone
    model.zero_grad(set_to_none=True)
    return {"loss": total, "grad_norm": grad_norm, "skipped": int(skipped)}


def micro_batches(num_rows, group_size, micro_batch_size):
    """Row ranges [start, stop) of at most micro_batch_size rows, cut between groups where they can:
    as many whole groups as fit (a micro-batch runs each group's prompt once), else parts of a group
    (each part runs the prompt again: correct, a little slower)."""
    step = micro_batch_size
    if group_size <= micro_batch_size:
        step = micro_batch_size // group_size * group_size
    return [(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]


def completion_lengths(turns, i):
    """Agent i's completion lengths in tokens (EOS included), every turn's rows of this process."""
    return torch.cat([turn.rollouts[i].completion_mask.sum(-1).cpu() for turn in turns])


def train_step(agents, env, examples, cfg, seeds, expert=None, before_update=None):
    """One MAGRPO step on a batch of examples, seeds one per example: the team's episodes, Eq. 1's
    advantages, Eq. 2's update of every agent. -> (turns, metrics of the update); before_update(turns)
    is the caller's last word before any weight changes: False skips the update (metrics None)."""
    # Sec. 2 steps 1-3: each agent samples G completions of its own prompt, their g-th ones form a
    # joint action, and the env scores it. With several turns (Sec. 3), feedback and revision grow
    # each example's episode into a tree of such groups.
    turns = rollout_team(agents, env, examples, cfg, seeds, expert)
    if before_update is not None and not before_update(turns):
        return turns, None
    # Eq. 1: each completion's advantage among its siblings, the completions of the same prompt. A group
    # in which every agent's every advantage is 0 (e.g. all rewards equal) teaches nothing, and a loss
    # of 0 is then expected, so the number of them is what to watch.
    zero_groups = 0
    for turn, advantages in zip(turns, episode_advantages(turns, cfg)):
        turn.advantages = advantages
        zero_groups += turn.zero_advantage_groups()
    metrics = {"zero_adv_groups": int(all_sum([zero_groups])[0])}
    # Eq. 2, steps 5-6: every agent's own policy gradient on the shared reward's advantages, and its
    # own AdamW step. Each turn is a part of the loss, with its weight (--turn-weights).
    weights = cfg.turn_weights or [1.0] * cfg.num_turns
    for i, agent in enumerate(agents):
        parts = [(turn.rollouts[i], turn.advantages[i], weight) for turn, weight in zip(turns, weights)]
        # a part per turn on every process, sampled or not (torchrun: the processes' sums line up)
        parts += [(None, None, 0.0)] * (cfg.num_turns - len(turns))
        for name, value in update_agent(agent, parts, cfg).items():
            metrics[f"{name}_{i}"] = value
        lengths = completion_lengths(turns, i).float()  # the mean length is over every process's rows
        total, count = all_sum([lengths.sum().item(), len(lengths)])
        metrics[f"completion_len_{i}"] = total / count
    return turns, metrics
