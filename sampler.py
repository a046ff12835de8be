"""
The sampler: how tokens come out of a model, batched, with a KV cache (Sec. 2 step 1 of the paper,
"each agent samples G completions of its own prompt"). magrpo.py calls `generate` once per agent and
turn. The sampling is no part of MAGRPO, and a reader of the paper can take it as given; four parts
serve Eq. 2's log-prob pass (magrpo.completion_logprobs): shared_prompt_rows, token_logprobs,
kept_floor, the top-k/top-p cut that the log-probs share with sample_token, and kept_logprobs, the
log-prob under that cut, which the sampler records for each token it draws.

    rollout = generate(model, tokenizer, ["def add(a, b):"], num_generations=4, seed=0)
    rollout.texts[0]                        # the prompt's 4 completions
    python tests/bench_generate.py          # against transformers' model.generate, on the CPU

generate prefills each prompt once into a KV cache allocated once for its G rows (prefill), then runs
decode_step a token at a time, in steps of one shape that --compile can capture; sample_token draws
each token from the row's own seeded uniform number, so a completion never depends on its batch.
Greedy output equals model.generate's (tests/test_sampler.py). token_logprobs serves the log-prob
pass of Eq. 2 (magrpo.completion_logprobs) without holding the logits of every position.

These equalities hold in float32: a completion independent of its batch, greedy output equal to
model.generate's, a compiled step's tokens equal to the eager one's. In bfloat16 they hold only
approximately, since a matmul's rounding depends on the shapes and on the kernel: greedy tokens may
part from model.generate's after a few hundred tokens, a compiled step may sample other tokens than
the eager one, and the sampler's log-probs differ from the trainer's by a few hundredths of a nat
(train.py logs it as logprob_drift_i).
"""
import contextlib
import functools
import inspect
import itertools
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CHECK_EVERY = 8  # decode steps between two looks at which rows have finished (a host sync each)
BLOCK = 1024  # sample_token's cumulative sums: of blocks of this many tokens, then inside one
LOGITS_BYTES = 2 ** 28  # token_logprobs' float32 logits at a time (256 MB)

# -----------------------------------------------------------------------------
# Seeds. Every prompt of a step has a seed of its own (mix_seed of the run's seed, the step, the
# example, the agent, the turn), and row g of that prompt draws its t-th token with a uniform number
# hashed from (that seed, g, t) (row_uniforms). So a completion never depends on the other prompts of
# its generate call, on rows that finished early, or on how a batch is split among processes. A
# resumed run samples exactly what the uninterrupted one would, and from the same weights torchrun's
# processes sample what one process would.

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
    int64 tensors (the multiplications wrap around, as the hash wants). t: an int, or a tensor of steps
    that broadcasts with keys (keys[:, None] and arange(T) give every row's T numbers at once)."""
    x = keys + torch.as_tensor(t, device=keys.device).add(1).mul(_int64(_GOLDEN))
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
    logprobs: torch.Tensor  # [B*G, T] log-prob of each sampled token, in the distribution that drew it
    texts: list  # B lists of G decoded completions, without EOS/pad
    num_generations: int
    seconds: float = 0.0  # wall time of the generate call
    floors: torch.Tensor = None  # [B*G, T] top-k/top-p's cut: logits / T above it were kept (kept_floor)
    adapters: torch.Tensor = None  # [B*G] a Team's rows (models.Team): the agent whose adapter each takes

    def __len__(self):
        return self.completion_ids.shape[0]

    def rows(self, start, stop, cut=True):
        """Rows [start, stop), with the columns that are padding in all of them cut off, so that a
        micro-batch of short rows costs what they need, not what the longest row of the batch needs;
        without the top-k/top-p cut's floors unless `cut`."""
        prompt_mask, completion_mask = self.prompt_mask[start:stop], self.completion_mask[start:stop]
        first = prompt_mask.shape[1] - int(prompt_mask.sum(-1).max())  # prompts are padded on the left
        end = int(completion_mask.sum(-1).max())  # completions on the right
        floors = None if self.floors is None or not cut else self.floors[start:stop, :end]
        return Rollout(self.prompt_ids[start:stop, first:], prompt_mask[:, first:],
                       self.completion_ids[start:stop, :end], completion_mask[:, :end],
                       self.logprobs[start:stop, :end], [], self.num_generations, floors=floors)

    def split(self):
        """A Team's rollout (generate with adapters) as one Rollout per agent, each as its own call gives it
        but for the width of its completions, cut to its longest."""
        rollouts, start, G = [], 0, self.num_generations
        for count in torch.bincount(self.adapters).tolist():
            rollouts.append(self.rows(start, start + count))
            rollouts[-1].texts = self.texts[start // G:(start + count) // G]
            rollouts[-1].seconds = self.seconds
            start += count
        return rollouts


def joined(rollouts, adapters):
    """Agents' rows as one Rollout for a Team's pass, rollout k's rows tagged adapters[k]: prompts padded
    on the left, completions on the right, to the widest (the padding masked)."""
    def cat(name, left=False, value=0):
        tensors = [getattr(rollout, name) for rollout in rollouts]
        width = max(tensor.shape[1] for tensor in tensors)
        return torch.cat([F.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]), value=value)
                          for t in tensors])
    tags = [torch.full((len(rollout),), k) for rollout, k in zip(rollouts, adapters)]
    floors = None if rollouts[0].floors is None else cat("floors", value=-math.inf)
    return Rollout(cat("prompt_ids", True), cat("prompt_mask", True), cat("completion_ids"),
                   cat("completion_mask"), cat("logprobs"), [], rollouts[0].num_generations, floors=floors,
                   adapters=torch.cat(tags).to(rollouts[0].prompt_ids.device))


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
    """The names of a model class's forward parameters, looked up once per class."""
    return set(inspect.signature(model_class.forward).parameters)


def forward_kwargs(model, cache=None, last=None, slot=None):
    """model(...)'s keyword arguments for a KV `cache` (a transformers Cache, or generate's own, a list
    of each layer's (keys, values), written at `slot`), and for the logits of the `last` positions
    only (with a 150k vocabulary the full logits are a step's largest tensor), as this model takes them."""
    if isinstance(cache, list):  # generate's own cache, which cached_attention reads and writes at slot
        return {"kv_cache": cache, "slot": slot, "use_cache": False}
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
    the nucleus of what is left (the fewest tokens whose probability reaches top_p); temperature 0 is
    greedy (argmax). The token is the first, in vocabulary order, whose cumulative kept probability
    exceeds the row's `uniform` times the kept mass, so that a seed draws the same tokens everywhere.
    logits: [rows, vocab], any float dtype; uniform: [rows] in (0, 1), float64 (default torch.rand).
    The cut is kept_floor's: the tokens whose logits / temperature are above the row's floor.
    -> [rows] token ids (long)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_p < 1.0 or 0 < top_k < logits.shape[-1]:  # One function makes the cut, for Eq. 2's pass too.
        logits = logits.masked_fill(logits < kept_floor(logits, 1.0, top_p, top_k)[:, None], -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if uniform is None:
        uniform = torch.rand(probs.shape[0], dtype=torch.float64, device=probs.device)
    # Inverse-CDF sampling in float64 (the cut probabilities need no renormalising, since the uniform
    # number is scaled by the row's remaining mass), in two levels, so that no float64 copy of [rows,
    # vocab] is made: the cumulative mass of blocks of BLOCK tokens finds the block that holds the
    # target, then the cumulative sum inside that block alone finds the token.
    rows, vocab = probs.shape
    blocks = F.pad(probs, (0, -vocab % BLOCK)).view(rows, -1, BLOCK)
    ends = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # [rows, blocks]: the mass up to each block's end
    target = uniform.to(ends)[:, None] * ends[:, -1:]
    block = torch.searchsorted(ends, target, right=True).clamp(max=ends.shape[1] - 1)  # [rows, 1]
    inside = blocks.gather(1, block[:, :, None].expand(-1, -1, BLOCK))[:, 0].double().cumsum(-1)
    before = F.pad(ends, (1, 0)).gather(1, block)  # the mass of the blocks before it
    token = block * BLOCK + torch.searchsorted(before + inside, target, right=True)
    return token.squeeze(-1).clamp(max=vocab - 1)  # (a uniform at the very top of the cdf)


def kept_floor(logits, temperature=1.0, top_p=1.0, top_k=0):
    """The top-k, then top-p cut of sample_token (which calls it) and of Eq. 2's log-probs: a floor per
    row between the logits / temperature kept (top_k most likely, then the fewest of those whose
    renormalised probability reaches top_p, ties at the edge kept) and those dropped (-inf: none
    dropped). Halfway between the smallest kept and the largest dropped, so that a trainer whose logits
    round a little differently keeps the same tokens."""
    scaled = cut = logits.float() / temperature
    kept = torch.full_like(scaled[:, 0], -math.inf)  # the smallest logit kept
    if top_k and top_k < scaled.shape[-1]:
        kept = scaled.topk(top_k, dim=-1).values[:, -1]
        cut = scaled.masked_fill(scaled < kept[:, None], -math.inf)
    if top_p < 1.0:
        sorted_p, order = torch.softmax(cut, dim=-1).sort(-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p
        kept = cut.gather(-1, order).masked_fill(outside, math.inf).amin(-1)
    dropped = scaled.masked_fill(scaled >= kept[:, None], -math.inf).amax(-1)
    return (kept + dropped) / 2


def decode_step(model, cache, tokens, mask, positions, slot=None):
    """One step of the decode loop: each row's newest token, at its position id, goes through the model
    with the KV cache of the row's earlier tokens, and the cache takes the token's keys and values.
    tokens, positions: [rows] (long); cache: a transformers Cache holding the earlier tokens, with mask
    [rows, cache positions] 0 on left padding and on positions not written yet; or generate's own
    (prefill), with mask [rows, 1, 1, cache positions] 0 on the row's tokens and -inf elsewhere, and
    slot [1] the cache position the token is written to (cached_attention).
    -> the next-token logits [rows, vocab], float32."""
    return model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                 **forward_kwargs(model, cache, slot=slot)).logits[:, -1, :].float()


def shared_prompt_rows(model, rollout):
    """A rollout's rows laid out for one forward pass in which each prompt runs once for up to k of its
    rows (magrpo.completion_logprobs): sequence s is a prompt, left-padded to P, then k blocks of T
    positions, the completions of k rows, each attending to the prompt and to itself (a 4D mask in the
    model's dtype, 0 where a position attends, -inf elsewhere). k is the most rows that cost less in
    one sequence of L = P + k T positions than apart, a layer's cost taken as 12 H L + L^2 (its
    matmuls, ~24 H^2 L flops, against its attention's, ~2 H L^2, over 2 H; H the hidden size).
    -> (ids [S, L], mask [S, 1, L, L], position ids [S, L], [rows, T]: the flat index in [S * L] of
    the position whose hidden state predicts each completion token)"""
    P, T, H = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1], model.config.hidden_size
    keys = [rollout.prompt_ids, rollout.prompt_mask]
    if rollout.adapters is not None:  # A Team's: a sequence holds one agent's rows, through its adapter.
        keys.insert(0, rollout.adapters[:, None])
    prompts, prompt_of_row = torch.unique(torch.cat(keys, dim=1), dim=0, return_inverse=True)
    adapter_of_prompt, prompts = prompts[:, 0], prompts[:, -2 * P:]
    k = max(1, int(torch.bincount(prompt_of_row).max()))
    while k > 1 and 12 * H * (P + k * T) + (P + k * T) ** 2 > k * (12 * H * (P + T) + (P + T) ** 2):
        k -= 1
    # Each row's sequence and block: its prompt's rows in order, k to a sequence.
    sequences, sequence_of_row, block_of_row, count = {}, [], [], {}
    for p in prompt_of_row.tolist():
        rank = count[p] = count.get(p, -1) + 1
        sequence_of_row.append(sequences.setdefault((p, rank // k), len(sequences)))
        block_of_row.append(rank % k)
    device = rollout.prompt_ids.device
    prompt_of_sequence = torch.tensor([p for p, _ in sequences], device=device)
    if rollout.adapters is not None:
        model.team.select(adapter_of_prompt[prompt_of_sequence])
    sequence, block = torch.tensor(sequence_of_row, device=device), torch.tensor(block_of_row, device=device)
    S, L = len(sequences), P + k * T
    at = sequence * k + block  # each row's block among the S * k blocks of all sequences
    completion = rollout.completion_ids.new_zeros(S * k, T).index_copy(0, at, rollout.completion_ids)
    completion_mask = rollout.completion_mask.new_zeros(S * k, T).index_copy(0, at, rollout.completion_mask)
    prompt_mask = prompts[prompt_of_sequence, P:]
    ids = torch.cat([prompts[prompt_of_sequence, :P], completion.view(S, k * T)], dim=1)
    # A completion token's position id counts its prompt's real tokens and its own block's before it.
    ahead = torch.cat([prompt_mask.repeat_interleave(k, dim=0), completion_mask], dim=1)
    blocks = positions_from_mask(ahead)[:, P:].reshape(S, k * T)
    positions = torch.cat([positions_from_mask(prompt_mask), blocks], dim=1)
    # Position i attends to j <= i that is real and in the prompt or in i's block; and always to itself.
    owner = torch.arange(-1, k, device=device).repeat_interleave(torch.tensor([P] + [T] * k, device=device))
    i = torch.arange(L, device=device)
    visible = (i[None, :] <= i[:, None]) & ((owner[None, :] == -1) | (owner[None, :] == owner[:, None]))
    real = torch.cat([prompt_mask, completion_mask.view(S, -1)], dim=1).bool()
    visible = (visible & real[:, None, :]) | torch.eye(L, dtype=torch.bool, device=device)
    mask = torch.where(visible[:, None], torch.tensor(0.0, dtype=model.dtype, device=device), -math.inf)
    # The prompt's last position predicts a completion's first token; its block's t-th, token t + 1.
    predicting = (sequence * L + P + block * T - 1)[:, None] + torch.arange(T, device=device)
    predicting[:, 0] = sequence * L + P - 1
    return ids, mask, positions, predicting


def token_logprobs(model, hidden, tokens, temperature=1.0, check=None, floors=None):
    """log softmax(logits / T) at `tokens` [rows, n], from the final hidden states [rows, n, H] that
    predict them. The output layer runs on as many positions at a time as LOGITS_BYTES of float32
    logits hold, and again in the backward pass (checkpointing), so the [rows, n, vocab] logits are
    never all held: with a 150k vocabulary they would be 0.6 MB per token. check: the model's own
    output on these rows, whose last logits must be its output layer's of its last hidden state (a
    logit scale or softcap would break that). floors [rows, n]: each token's softmax is over the logits
    / T at or above its floor (Rollout.floors: top-k/top-p's cut; None: all)."""
    head = model.get_output_embeddings()
    if check is not None:
        made = head(check.hidden_states[-1][:, -1]).float()
        if not torch.allclose(made, check.logits[:, -1].float(), rtol=1e-3, atol=1e-3):
            raise ValueError(f"{type(model).__name__}'s logits are not its output layer's of its last hidden "
                             "state (a logit scale or softcap?): token_logprobs does not support it")
    chunk = max(1, LOGITS_BYTES // (4 * tokens.shape[0] * head.weight.shape[0]))
    parts = [tokens.new_zeros(tokens.shape[0], 0, dtype=torch.float32)]
    for start in range(0, tokens.shape[1], chunk):
        floor = None if floors is None else floors[:, start:start + chunk]
        parts.append(checkpoint(_chunk_logprobs, head, hidden[:, start:start + chunk],
                                tokens[:, start:start + chunk], temperature, floor, use_reentrant=False))
    return torch.cat(parts, dim=1)


def _chunk_logprobs(head, hidden, tokens, temperature, floors):
    return kept_logprobs(head(hidden).float(), tokens, temperature, floors)


def kept_logprobs(logits, tokens, temperature, floors=None):
    """log softmax(logits / T) at `tokens`, over the logits / T at or above each token's floor (the
    top-k/top-p cut, kept_floor; None: all), the token itself always kept, whatever the rounding of
    the sampler's pass and the trainer's: generate and token_logprobs both compute it here.
    logits [..., vocab] (float32); tokens, floors [...]."""
    scaled = logits / temperature
    chosen = scaled.gather(-1, tokens[..., None]).squeeze(-1)
    if floors is not None:
        scaled = scaled.masked_fill(scaled < torch.minimum(floors, chosen)[..., None], -math.inf)
    return chosen - torch.logsumexp(scaled, dim=-1)


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
             top_p=1.0, top_k=0, seed=None, compile=False, adapters=None):
    """G = num_generations completions of each prompt (Sec. 2 step 1): each prompt is prefilled once into
    a cache preallocated for its G rows, then decode_step runs a token at a time. seed: None (torch's
    RNG), an int, or one int per prompt (row_keys). compile: torch.compile the decode step (a CUDA graph
    on a GPU), on rows and a cache padded to a few sizes (bucket), every row kept to the end. adapters:
    a models.Team's model, one agent per prompt, whose adapter its rows take (Rollout.split)."""
    t_start = time.perf_counter()
    device, G = model.device, num_generations
    eos = torch.tensor(eos_token_ids(model, tokenizer), device=device)
    # Many base models have no pad token; EOS stands in for it, and it is masked anyway.
    pad_id = int(eos[0]) if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    if not ids or max_new_tokens < 1 or G < 1 or not all(ids):
        raise ValueError("generate needs a prompt, no empty prompt, G >= 1 and max_new_tokens >= 1")
    prompt_ids, prompt_mask = left_pad(ids, pad_id, device)
    N, P = len(ids) * G, prompt_ids.shape[1]
    # Compiled, a run makes a few graphs, not one per call: the rows are padded with copies of the last
    # row and the cache with masked positions, which change no real row's tokens (tests/test_sampler.py).
    rows, length = (bucket(N, 8), bucket(P + max_new_tokens, 256)) if compile else (N, P + max_new_tokens)
    source = torch.arange(rows, device=device).clamp(max=N - 1)  # the real row each row copies
    keys = row_keys(seed, len(ids), G, device)
    steps = torch.arange(max_new_tokens, device=device)
    uniforms = row_uniforms(keys[source, None], steps) if keys is not None and temperature > 0 else None
    if adapters is not None:  # a Team's model (models.Team.select): the prefill's rows are the prompts
        adapters = torch.tensor(adapters, device=device)
        model.team.select(adapters)
    logits, cache = prefill(model, prompt_ids, prompt_mask, source // G, length)
    if adapters is not None:  # and the decode steps' rows each of the prompts' G
        adapters = adapters[source // G]
        model.team.select(adapters)
    mask, positions, slot = decode_inputs(prompt_mask[source // G], length, model.dtype)
    completion = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((rows, max_new_tokens), device=device)
    cut = temperature > 0 and (top_p < 1.0 or 0 < top_k < model.config.vocab_size)
    floors = torch.full((rows, max_new_tokens), -math.inf, device=device) if cut else None
    alive = torch.arange(rows, device=device)  # the original row of each row in the batch
    done = torch.zeros(rows, dtype=torch.bool, device=device)  # whether each row of the batch is done
    step = compiled(decode_step, torch.device(device).type) if compile else decode_step
    with attention(model, CACHED):
        for t in range(max_new_tokens):
            uniform = None if uniforms is None else uniforms[:, t]
            token, logprob, floor = sample_with_logprob(logits, temperature, top_p, top_k, uniform, cut)
            if cut:
                floors[alive, t] = floor
            # A row that is done runs on, masked: it writes padding, and its tokens are never read.
            token = token.masked_fill(done, pad_id)
            completion[alive, t] = token
            logprobs[alive, t] = logprob.masked_fill(done, 0.0)
            done = done | torch.isin(token, eos)
            if t == max_new_tokens - 1:
                break
            # The host looks at the rows once every CHECK_EVERY tokens, not at every token: it stops when
            # all are done and, uncompiled, drops the finished rows from the batch and the cache (a copy).
            if (t + 1) % CHECK_EVERY == 0:
                count = int((~done).sum())  # the loop's one host sync
                if count == 0:
                    break
                if count < len(alive) and not compile:
                    keep = (~done).nonzero().squeeze(-1)
                    cache = [(layer_keys[keep], layer_values[keep]) for layer_keys, layer_values in cache]
                    alive, token, mask, done = alive[keep], token[keep], mask[keep], done[keep]
                    positions, uniforms = positions[keep], None if uniforms is None else uniforms[keep]
                    if adapters is not None:
                        model.team.select(adapters[alive])
            mask[..., P + t] = 0.0  # the token's own position, where the step writes its keys and values
            logits = step(model, cache, token, mask, positions, slot)
            positions, slot = positions + 1, slot + 1

    # A row ends at its first EOS, included (padding after it may be EOS too), or at max_new_tokens.
    ends = torch.isin(completion, eos)
    lengths = torch.where(ends.any(-1), ends.int().argmax(-1) + 1, max_new_tokens)
    completion, logprobs, lengths = completion[:N], logprobs[:N], lengths[:N]  # the real rows
    completion_mask = (torch.arange(max_new_tokens, device=device)[None, :] < lengths[:, None]).long()
    texts = completion_texts(tokenizer, completion.tolist(), lengths.tolist(), set(eos.tolist()), G)
    return Rollout(prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0), completion,
                   completion_mask, logprobs * completion_mask, texts, G, time.perf_counter() - t_start,
                   floors[:N] if cut else None, None if adapters is None else adapters[:N])


def prefill(model, prompt_ids, prompt_mask, prompt_of_row, length):
    """Each prompt runs once, and its keys and values go to each of its rows (prompt_of_row: [rows],
    the prompt of each) in a KV cache of `length` positions, allocated once: a list of each layer's
    (keys, values), plain tensors [rows, KV heads, length, head dim], which cached_attention reads and
    writes. -> (each row's next-token logits [rows, vocab], float32; the cache)"""
    from transformers import DynamicCache  # Imported here, so that `import magrpo` stays light.
    prompt_cache = DynamicCache()
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask,
                position_ids=positions_from_mask(prompt_mask), **forward_kwargs(model, prompt_cache, last=1))
    free = (0, 0, 0, length - prompt_ids.shape[1])  # the positions after the prompt, zeros
    cache = [(F.pad(layer.keys[prompt_of_row], free), F.pad(layer.values[prompt_of_row], free))
             for layer in prompt_cache.layers]
    if torch.device(model.device).type == "cuda":  # A CUDA graph reads the cache where it is, not a copy.
        for tensor in itertools.chain(*cache):
            torch._dynamo.mark_static_address(tensor, guard=False)
    return out.logits[prompt_of_row, -1, :].float(), cache


def decode_inputs(prompt_mask, length, dtype):
    """The inputs of generate's first decode step but its tokens, in shapes that stay the same to the
    last step (one graph, compiled): the attention mask [rows, 1, 1, length] of every position a row
    will have, added to the attention scores, 0 on the row's real prompt tokens and -inf elsewhere
    (generate opens each new token's position as the step writes it); each row's position id, the
    number of its real tokens; and slot [1], the cache position the next token is written to.
    prompt_mask: [rows, P], 1 on real tokens. -> (mask, positions, slot)"""
    rows, P = prompt_mask.shape
    mask = torch.full((rows, 1, 1, length), -math.inf, dtype=dtype, device=prompt_mask.device)
    mask[:, 0, 0, :P] = torch.where(prompt_mask == 1, 0.0, -math.inf)
    return mask, prompt_mask.sum(-1), torch.tensor([P], device=prompt_mask.device)


def sample_with_logprob(logits, temperature, top_p, top_k, uniform, cut):
    """sample_token's token of each row; the sampler's own log-prob of it, computed as the trainer's
    (kept_logprobs: over the logits that the top-k/top-p cut kept, at T = 1 for greedy decoding); and
    the floor of that cut (kept_floor), None if there is no `cut`. -> (token, logprob, floor)"""
    token = sample_token(logits, temperature, top_p, top_k, uniform)
    floor = kept_floor(logits, temperature, top_p, top_k) if cut else None
    return token, kept_logprobs(logits, token, temperature if temperature > 0 else 1.0, floor), floor


CACHED = "magrpo_cached"  # decode_attention's name in transformers' AttentionInterface


def cached_attention(query, key, value, cache, slot, mask, scale=None):
    """One layer's attention for each row's newest token, on generate's own KV cache (Sec. 2 step 1):
    the token's key and value are written into the layer's cache at position `slot`, then its query
    attends to the row's cache, softmax(q K^T * scale + mask) V (scale None: 1 / sqrt(head dim)).
    With fewer KV heads than query heads (grouped-query attention), query head h reads KV head
    h // (heads / KV heads), as transformers' repeat_kv lays them out.
    query [rows, heads, 1, head dim]; key, value [rows, KV heads, 1, head dim]; cache: the layer's
    (keys, values), each [rows, KV heads, positions, head dim], written in place (the next step reads
    it); slot [1] (long); mask [rows, 1, 1, positions], 0 where the token attends, -inf elsewhere.
    -> [rows, 1, heads, head dim], the layout transformers' attention hooks return."""
    keys, values = cache
    keys.index_copy_(2, slot, key)
    values.index_copy_(2, slot, value)
    # The query heads that share a KV head go in as that head's queries (transformers' pack_gqa), so
    # each row's cache is read once and never copied out per query head, on any device and compiled.
    rows, heads, _, dim = query.shape
    packed = query.reshape(rows, keys.shape[1], heads // keys.shape[1], dim)
    out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2)


def decode_attention(module, query, key, value, mask, *, kv_cache, slot, scaling=None, **kwargs):
    """A decode step's attention in every layer, as transformers' attention hook (AttentionInterface)
    calls it: cached_attention on the layer's part of generate's cache (prefill), with the mask
    [rows, 1, 1, positions] that generate makes once per step, not per layer. -> (its output, None)"""
    if kwargs.get("sliding_window"):
        raise ValueError("generate does not support sliding-window attention")
    return cached_attention(query, key, value, kv_cache[module.layer_idx], slot, mask, scaling), None


@contextlib.contextmanager
def attention(model, name):
    """Inside the block, the model's layers call the attention function `name` (AttentionInterface)."""
    from transformers import AttentionInterface
    AttentionInterface.register(CACHED, decode_attention)
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def bucket(n, smallest):
    """The power of 2 at least n and at least `smallest`: the few sizes a compiled step sees."""
    return max(smallest, 1 << (n - 1).bit_length())


@functools.lru_cache(maxsize=None)  # one compiled function per (function, device type) in a process
def compiled(function, device_type):
    """`function` compiled by torch.compile, once per process; on a GPU as a CUDA graph (reduce-overhead),
    which replays the step's ~1,500 kernel launches as one."""
    return torch.compile(function, mode="reduce-overhead" if device_type == "cuda" else None, dynamic=False)


def compiled_graphs():
    """How many graphs torch.compile has made in this process: one per shape of the compiled step."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]
