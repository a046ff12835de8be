"""
MAGRPO: Multi-Agent Group Relative Policy Optimization, one function per idea.

Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning" (Liu et al., arXiv 2508.04652).
n agents cooperate on one task; each agent i sees only its own prompt h_i and samples G completions
from its own policy; the g-th completions of all agents form the g-th joint action, which the
environment scores with one shared reward R^(g) (Sec. 2). Then, for every agent:

    Eq. 1   A^(g) = R^(g) - mean_g' R^(g')                      -> group_advantages
    Eq. 2   J(theta_i) = E[ A^(g) * log pi_theta_i(a_i^(g) | h_i) ] -> completion_logprobs, policy_loss

and one AdamW step per agent per batch (train_step). On-policy: no ratio, no clipping, no KL.

The functions a course blanks out: generate, completion_logprobs, group_advantages, policy_loss.
Try it:  python train.py            (CPU demo, two tiny agents, ~1 minute)
Test it: python -m pytest tests/ -q
"""
import inspect
import itertools
import logging
import math
import os
import warnings
from dataclasses import dataclass

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
    """Position ids for left-padded rows: 0 at each row's first real token (Sec. 7 pitfall: without
    this, padded rows see shifted positions and batched output differs from unbatched)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def sample_token(logits, temperature=1.0, top_p=1.0, generator=None):
    """One token per row from softmax(logits / temperature), restricted to the nucleus: the smallest
    set of most likely tokens whose probability reaches top_p. temperature == 0 is greedy."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # mass before this token already reaches top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model, tokenizer, prompts, num_generations=1, max_new_tokens=256, temperature=1.0,
             top_p=1.0, seed=None):
    """Sample `num_generations` completions for each prompt (Sec. 2, step 1: each agent samples a
    group of G completions from its own policy). A plain decode loop over model(...) with a KV cache:
    prefill each prompt once, repeat its cache G times, then one token per step for the rows that
    have not yet emitted EOS (finished rows are dropped from the running batch)."""
    from transformers import DynamicCache  # local import keeps `import magrpo` light for the math tests
    device, G = model.device, num_generations
    eos = torch.tensor(eos_token_ids(model, tokenizer), device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(eos[0])
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)

    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    if not ids or max_new_tokens < 1 or not all(ids):
        raise ValueError("generate needs at least one prompt, no empty prompt, and max_new_tokens >= 1")
    prompt_ids, prompt_mask = left_pad(ids, pad_id, device)
    B = len(ids)

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
        token = sample_token(logits, temperature, top_p, generator)
        completion[alive, t] = token
        if temperature > 0:  # log softmax(logits / T) of the drawn token, before any nucleus cut
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
                   completion, completion_mask, logprobs, texts, G)


def decode_completion(tokenizer, ids, length, eos_ids):
    """Text of one completion (a list of ids): its first `length` tokens, without a final EOS."""
    ids = ids[:length]
    if ids and ids[-1] in eos_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=True)


# -----------------------------------------------------------------------------
# Eq. 1 and Eq. 2


def completion_logprobs(model, rollout, temperature=1.0):
    """log pi_theta(a_t | h, a_<t) of every completion token, with grad (the log-prob term of Eq. 2).
    Logits are divided by the sampling temperature so the loss scores the distribution the tokens
    were drawn from (Sec. 2 correctness point; with top_p < 1, that distribution before the
    nucleus cut, as TRL's GRPO). Greedy (temperature 0) scores at T = 1.
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


LOSS_TYPES = ("seq_sum", "token_mean", "seq_mean")
ADVANTAGE_MODES = ("mean", "rloo", "std")


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


# -----------------------------------------------------------------------------
# One MAGRPO update of all agents (Sec. 2, steps 1-6)


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


class MasterWeightAdamW:
    """AdamW over fp32 master copies of low-precision (bf16/fp16) weights. At RL learning rates an
    update is far below bf16's resolution and would round away (Sec. 7 pitfall); the master copy
    accumulates it, and the model's own weights are refreshed from it after every step."""

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


def make_optimizer(model, learning_rate, weight_decay=0.0):
    """AdamW per agent (Sec. 2, step 6): plain for fp32 weights, with fp32 master weights otherwise."""
    params = [p for p in model.parameters() if p.requires_grad]
    if all(p.dtype == torch.float32 for p in params):
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
    return MasterWeightAdamW(params, lr=learning_rate, weight_decay=weight_decay)


JOINT_MODES = ("aligned", "cross")


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


def credited_returns(rewards, joint, num_agents, num_generations):
    """The return each agent's completion is credited with, [B, G] per agent: the mean of the
    shared rewards of the joint actions it takes part in (aligned: exactly its one joint action).
    `rewards` is [B, len(joint)], in the order of `joint`."""
    credit = []
    for i in range(num_agents):
        member = torch.zeros(len(joint), num_generations)  # member[j, g]: joint action j uses agent i's g
        member[torch.arange(len(joint)), torch.tensor([idx[i] for idx in joint])] = 1.0
        credit.append(rewards @ member / member.sum(0))
    return credit


def global_grad_norm(model):
    """The L2 norm of all gradients together, computed in fp32 (bf16 sums lose digits)."""
    norms = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(norms).norm().item() if norms else 0.0


def update_agent(agent, rollout, advantages, temperature=1.0, loss_type="seq_sum", micro_batch_size=8):
    """Eq. 2 for one agent: accumulate the policy-gradient loss over micro-batches (memory does not
    grow with G), then one optimizer step. The loss is normalised once over the whole batch. A
    non-finite loss or gradient skips the step with a warning rather than corrupting the weights.
    Returns a dict of what happened (loss, grad_norm, skipped)."""
    model, opt = agent.model, agent.optimizer
    model.eval()  # dropout off: the gradient must be of the very policy that sampled (as TRL does)
    opt.zero_grad(set_to_none=True)
    normalizer = loss_normalizer(rollout.completion_mask, loss_type)
    total = 0.0
    for start in range(0, len(rollout), micro_batch_size):
        mb = rollout.rows(start, start + micro_batch_size)
        lp = completion_logprobs(model, mb, temperature)
        loss = policy_loss(lp, mb.completion_mask, advantages[start:start + micro_batch_size],
                           loss_type, normalizer)
        loss.backward()
        total = total + loss.detach()
    total = float(total)
    grad_norm = global_grad_norm(model)  # logged only: the paper clips no gradients
    if not (math.isfinite(total) and math.isfinite(grad_norm)):
        warnings.warn(f"non-finite loss ({total}) or grad norm ({grad_norm}): skipping this agent's step")
        opt.zero_grad(set_to_none=True)
        return {"loss": total, "grad_norm": grad_norm, "skipped": 1}
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"loss": total, "grad_norm": grad_norm, "skipped": 0}


def sample_agents(agents, env, examples, num_generations, max_new_tokens, temperature=1.0,
                  top_p=1.0, seed=None):
    """Sec. 2 step 1 (and decentralised execution, Sec. 1): every agent samples from its own
    policy for its own prompt of each example, seeing nothing of the others. One Rollout per agent."""
    return [generate(agent.model, agent.tokenizer, [agent.format(env.prompts(ex)[i]) for ex in examples],
                     num_generations, max_new_tokens, temperature, top_p, None if seed is None else seed + i)
            for i, agent in enumerate(agents)]


def train_step(agents, env, examples, num_generations=4, max_new_tokens=256, temperature=1.0,
               top_p=1.0, loss_type="seq_sum", advantage="mean", micro_batch_size=8, seed=None,
               joint_mode="aligned"):
    """One MAGRPO iteration on a batch of examples (Sec. 2):
    1. every agent samples G completions for its own prompt of each example;
    2. joint actions (aligned, or cross: every combination); 3. the env's shared reward for each;
    4. Eq. 1 within each example's group, on the return credited to each completion;
    5-6. Eq. 2 and one AdamW step for every agent.
    Returns the step's metrics."""
    rollouts = sample_agents(agents, env, examples, num_generations, max_new_tokens, temperature,
                             top_p, seed)
    joint = joint_actions(len(agents), num_generations, joint_mode)
    texts = [tuple(r.texts[b][g] for r, g in zip(rollouts, idx)) for b in range(len(examples)) for idx in joint]
    scores = env.rewards([ex for ex in examples for _ in joint], texts)
    rewards = torch.tensor([float(s) for s in scores]).view(len(examples), len(joint))
    advantages = [group_advantages(c, advantage).view(-1)
                  for c in credited_returns(rewards, joint, len(agents), num_generations)]
    zero_groups = int(torch.stack([a.view(len(examples), -1) == 0 for a in advantages]).all(0).all(-1).sum())
    metrics = {"reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
               "reward_max": rewards.max().item(), "zero_adv_groups": zero_groups}
    for i, (agent, rollout, adv) in enumerate(zip(agents, rollouts, advantages)):
        metrics[f"completion_len_{i}"] = rollout.completion_mask.sum(-1).float().mean().item()
        if bool((adv == 0).all()):  # no learning signal in any group: nothing to update
            metrics.update({f"loss_{i}": 0.0, f"grad_norm_{i}": 0.0, f"skipped_{i}": 0})
            continue
        out = update_agent(agent, rollout, adv.to(rollout.completion_ids.device), temperature,
                           loss_type, micro_batch_size)
        metrics.update({f"{k}_{i}": v for k, v in out.items()})
    metrics["samples"] = texts[0]
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
