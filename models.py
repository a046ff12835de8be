"""
The agents' weights: the built-in tiny model, loading by hub name or local path, LoRA adapters on one
shared frozen base, each agent's optimizer, saving (HF and peft formats) and where each agent runs.
magrpo.py never imports this file: the algorithm sees an Agent's model, tokenizer and optimizer
(duck-typed), so an Agent is defined here, where agents are made.

    models.load_agent("tiny", "cpu", "float32", seed=0)                 # an Agent (no optimizer yet)
    models.load_agent("Qwen/Qwen2.5-Coder-3B", "cuda:0", "bfloat16", 0, lora=models.LoRAConfig(16))
    models.save_agent(agent, "out/agent_0")                              # HF weights, or a peft adapter

docs/scale.md (LoRA on a shared base), docs/runs.md (checkpoints). Try: python train.py --lora-r 4
"""
import copy
import json
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

TINY = "tiny"  # --model tiny is a random-init model built from a config, with no download
# The weights' dtype (--dtype). Training in float16 is refused (train.py), since it needs a loss scaler.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # peft's names
TINY_BASE = "magrpo_tiny_base.json"  # beside a tiny model's adapter, holding its random base's seed
# peft's default targets, every attention and MLP projection of Qwen2/Llama, and GPT-2's Conv1D layers
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_TARGETS_BY_MODEL_TYPE = {"gpt2": ("c_attn", "c_proj", "c_fc")}


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
# The built-in tiny model (CPU demo, tests) and real ones by hub name or local path


def tiny_tokenizer():
    """A byte-level tokenizer made in code (256 bytes, EOS, PAD: any text round-trips), a
    PreTrainedTokenizerFast, so save_pretrained/from_pretrained work."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    # Bytes, not words, because a model learnt from scratch on a CPU writes letters (the demo's task), and
    # no vocabulary file is needed. A BPE with no merges is the tokenizers library's byte-level model.
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"<|endoftext|>": len(vocab), "<|pad|>": len(vocab) + 1})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|pad|>", padding_side="left")


def tiny_model(tokenizer, arch="qwen2", hidden=64, layers=2, heads=4, init_std=0.02, seed=0):
    """A small random-init causal LM (Qwen2, Llama or GPT-2 class), ~0.1M parameters by default.
    Tests use a larger init_std so that greedy outputs are not one repeated token."""
    import transformers as tf
    # The real architectures' classes, made small, so that every code path a real model takes (caches,
    # position ids, LoRA targets) runs in the tests on the CPU.
    common = dict(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id,
                  initializer_range=init_std, tie_word_embeddings=True)
    # GPT-2's config takes these names through its attribute_map (hidden_size is its n_embd, ...), and has no
    # use for intermediate_size (its MLP is 4 * hidden wide) or num_key_value_heads.
    config = tf.AutoConfig.for_model(arch, hidden_size=hidden, intermediate_size=2 * hidden,
                                     num_hidden_layers=layers, num_attention_heads=heads, **common,
                                     num_key_value_heads=max(1, heads // 2), max_position_embeddings=1024)
    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(config).eval()  # eval(), so no dropout in sampling or update


def load_model(name_or_path, device="cpu", dtype="float32", seed=0):
    """(model, tokenizer): the tiny model, or from_pretrained by hub name or local directory (a
    train.py OUT/agent_0). ValueError, one line, when it cannot be loaded."""
    if name_or_path == TINY:
        tok = tiny_tokenizer()
        return tiny_model(tok, seed=seed).to(device, DTYPES[dtype]), tok
    from transformers import AutoModelForCausalLM, AutoTokenizer, logging as hf_logging
    hf_logging.disable_progress_bar()  # no bar per shard loaded, as it would bury the training bar
    # A path (absolute, ./..., or more than one /) that is no directory is a typo, said at once
    # rather than as a failed hub download of a name like "runs/code/agent_0".
    looks_local = os.path.isabs(name_or_path) or name_or_path.startswith(".") or name_or_path.count("/") > 1
    if looks_local and not os.path.isdir(name_or_path):
        raise ValueError(f"{name_or_path!r} is not a directory")
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retry warnings would bury our one-line error
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype])
    except (OSError, ValueError) as e:  # no such model, no network or a broken directory gives one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"cannot load {name_or_path!r} (not a local model directory, and not "
                         f"reachable on the hub: {first})") from None
    finally:
        hub_log.setLevel(level)
    # A directory without the tokenizer's files loads, without a word from transformers, as an empty
    # tokenizer that turns every prompt into no tokens, so we say so now, not generate at the first step.
    if not tok("Hello world", add_special_tokens=False)["input_ids"]:
        raise ValueError(f"{name_or_path!r} has no usable tokenizer: it encodes text to no tokens (a "
                         "model directory needs its tokenizer's files, e.g. tokenizer.json and "
                         "tokenizer_config.json)")
    # The sampler stops a completion at EOS (the tokenizer's, or generation_config's), so without one
    # a run would fail at its first step.
    if tok.eos_token_id is None and getattr(model.generation_config, "eos_token_id", None) is None:
        raise ValueError(f"{name_or_path!r} has no end-of-sequence token (neither its tokenizer nor its "
                         "generation_config names one)")
    # Many base models ship without a pad token; EOS is the usual stand-in (padding is masked out
    # everywhere, and generate tells EOS from padding by the completion mask, not by the id).
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model.to(device), tok

# -----------------------------------------------------------------------------
# LoRA agents are n adapters on one shared frozen base (--lora-r; docs/scale.md). The base's weights
# are held once, whatever the number of agents, so two 3B agents fit one GPU. Each agent trains only its
# adapter (and its AdamW holds only the adapter's moments).


@dataclass
class LoRAConfig:
    """An adapter's shape, in peft's LoraConfig names: rank r, lora_alpha (the update is scaled by
    alpha / r; None: 2r), target_modules (None: the architecture's attention and MLP projections)."""
    r: int
    alpha: float = None
    target_modules: tuple = None

    def __post_init__(self):  # alpha = 2r, the scale most recipes and peft's own examples use
        self.alpha = float(2 * self.r if self.alpha is None else self.alpha)


class LoRALinear(torch.nn.Module):
    """A frozen linear layer plus a trainable low-rank update (Hu et al. 2021):
        y = base(x) + (x A^T B^T) * alpha / r,   A: [r, in], B: [out, r].
    A as peft draws it, B zero: a new agent is its base, logit for logit. The adapter is fp32 whatever
    the base's dtype (plain AdamW then keeps RL-sized updates). `base`: nn.Linear, or GPT-2's Conv1D."""

    def __init__(self, base, r, alpha, generator=None):
        from transformers.pytorch_utils import Conv1D
        super().__init__()
        self.base, self.scaling = base, alpha / r
        self.fan_in_fan_out = isinstance(base, Conv1D)
        in_f, out_f = base.weight.shape if self.fan_in_fan_out else base.weight.shape[::-1]
        # A is kaiming-uniform with a = sqrt(5), as peft draws it, from a CPU generator, so an agent's adapter
        # is the same on any device for the same seed.
        a = (torch.rand(r, in_f, generator=generator) * 2 - 1) / math.sqrt(in_f)
        self.lora_A = torch.nn.Parameter(a.to(base.weight.device))
        self.lora_B = torch.nn.Parameter(torch.zeros(out_f, r, device=base.weight.device))
        self.cast, self.cast_of = None, None  # A and B in the compute dtype, and what they were cast from

    def forward(self, x):
        # The adapter runs in x's dtype, as the base does. A cast of x to fp32 would keep one more copy
        # of every adapted layer's input for the backward pass (~40% more activation memory in bf16).
        a, b = self.adapter(x.dtype)
        return self.base(x) + (x @ a.T) @ b.T * self.scaling

    def adapter(self, dtype):
        """A and B in `dtype`; without gradients (sampling), one cast per optimizer step (cast_once)."""
        a, b = self.lora_A, self.lora_B
        if a.dtype == dtype or torch.is_grad_enabled() or torch.compiler.is_compiling():
            return a.to(dtype), b.to(dtype)
        return cast_once(self, [a, b], dtype, lambda: (a.detach().to(dtype), b.detach().to(dtype)))

    def delta_weight(self):
        """(alpha / r) B A in the base weight's layout (transposed for GPT-2's Conv1D): what merging adds."""
        delta = (self.lora_B @ self.lora_A) * self.scaling
        return delta.T if self.fan_in_fan_out else delta


def cast_once(layer, params, dtype, make):
    """make(), a layer's adapter made from `params` in `dtype`, made again only once an optimizer has
    changed them: a cast at every decoded token would be more kernels in each adapted layer."""
    # A parameter's version counts its in-place changes (an optimizer step, a loaded checkpoint),
    # and its storage says whether it was replaced (moved to another device).
    source = [(p.data_ptr(), p._version) for p in params] + [dtype]
    if layer.cast_of != source:
        layer.cast, layer.cast_of = make(), source
    return layer.cast


def is_lora(model):  # a model with adapters saves as an adapter, and trains them alone
    return any(isinstance(m, LoRALinear) for m in model.modules())


def lora_targets(model, targets):
    """The linear layers named by `targets` (a name or "." + name suffix: peft's rule); each target must
    match, none may share its weight (merging a tied lm_head would change the embeddings)."""
    from transformers.pytorch_utils import Conv1D
    linear = [n for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))]
    suffixes = tuple("." + t for t in targets)
    chosen = [n for n in linear if n in targets or n.endswith(suffixes)]
    for target in targets:  # a target that matches nothing is a typo
        if not any(n == target or n.endswith("." + target) for n in chosen):
            names = sorted({n.rsplit(".", 1)[-1] for n in linear})
            raise ValueError(f"no linear layer named {target!r} in this {model.config.model_type} model "
                             f"(its linear layers: {', '.join(names)})")
    # A weight owned by two modules is tied (GPT-2's lm_head is its embedding), and merging an adapter
    # into it would change the other module too.
    owners = Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
    for name in chosen:
        if owners[id(model.get_submodule(name).weight)] > 1:
            raise ValueError(f"{name} shares its weight with another layer (tied embeddings): leave it out")
    return chosen


def shared_copy(model, fresh=()):
    """A structural copy of `model` whose parameters and buffers ARE its tensors, but for `fresh`."""
    # deepcopy's memo maps an object to its copy, so mapping each tensor to itself copies the modules
    # (so each agent can wrap its own layers) and shares the weights.
    fresh = {id(t) for t in fresh}
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()] if id(t) not in fresh}
    return copy.deepcopy(model, memo)


def add_lora(base, lora, seed=0, base_name=TINY, base_seed=None):
    """A new agent: a shared_copy of the frozen `base`, its target layers wrapped in LoRALinear (A from
    `seed`, a generator of its own). model.lora_config: peft's adapter_config.json."""
    base.requires_grad_(False)  # the base never trains, since its gradient would be every agent's at once
    model = shared_copy(base)
    names = lora.target_modules or LORA_TARGETS_BY_MODEL_TYPE.get(model.config.model_type, LORA_TARGETS)
    generator = torch.Generator().manual_seed(int(seed))
    for name in lora_targets(model, names):
        model.set_submodule(name, LoRALinear(model.get_submodule(name), lora.r, lora.alpha, generator))
    # With peft's adapter_config.json, peft (and vLLM, TGI ...) load a saved agent without us.
    model.lora_config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.r, "lora_alpha": lora.alpha,
                         "lora_dropout": 0.0, "bias": "none", "target_modules": list(names),
                         "fan_in_fan_out": any(getattr(m, "fan_in_fan_out", False) for m in model.modules()),
                         "base_model_name_or_path": base_name}
    model.tiny_base_seed = base_seed if base_name == TINY else None
    return model


def shared_base(name, device, dtype, seed, bases):
    """(base, tokenizer) of `name`, loaded once per (name, device, dtype, tiny's seed) into `bases`."""
    # A tiny base is a random model, so its seed is part of what it is. A real one is its name.
    key = (name, str(torch.device(device)), dtype, seed if name == TINY else None)
    if key not in bases:  # add_lora freezes it
        bases[key] = load_model(name, device, dtype, seed=seed)
    return bases[key]


def load_adapter(name, device, dtype, seed, bases):
    """(model, tokenizer) of the adapter directory `name` (ours or peft's): its base (named in its
    adapter_config.json, shared through `bases`) + the adapter."""
    # Only a plain LoRA adapter on a named base is rebuilt; anything else is refused, not loaded wrong.
    config = json.loads(Path(name, ADAPTER_CONFIG).read_text())
    unsupported = [k for k in ("use_dora", "use_rslora", "rank_pattern", "alpha_pattern", "modules_to_save",
                               "layers_to_transform") if config.get(k)]
    if config.get("bias", "none") != "none":
        unsupported.append("bias")
    if isinstance(config.get("target_modules"), str):
        unsupported.append("a regex for target_modules")
    if config.get("peft_type", "LORA") != "LORA" or unsupported:
        raise ValueError(f"{name!r}: an adapter with {', '.join(unsupported) or config.get('peft_type')}, "
                         "which this loader does not support")
    base_name = config.get("base_model_name_or_path")
    if not isinstance(base_name, str) or not base_name:
        raise ValueError(f"{name!r}: its {ADAPTER_CONFIG} names no base model (base_model_name_or_path is "
                         f"{base_name!r}): set it to the base's hub name or path")
    saved = LoRAConfig(config["r"], config["lora_alpha"], tuple(config["target_modules"]))
    # A tiny base is random, so the seed that made it is saved beside the adapter (not in peft's file).
    tiny_base = Path(name, TINY_BASE)
    tiny_seed = json.loads(tiny_base.read_text())["seed"] if tiny_base.is_file() else seed
    base, tok = shared_base(base_name, device, dtype, tiny_seed, bases)
    try:
        model = add_lora(base, saved, seed, base_name, tiny_seed)
    except ValueError as e:  # its target_modules do not fit its base, a fault of the directory, not a flag
        raise ValueError(f"{name!r} does not fit its base {base_name!r}: {e}") from None
    model.lora_config.update((k, v) for k, v in config.items() if k not in ("r", "lora_alpha"))
    load_adapter_weights(model, os.path.join(name, ADAPTER_WEIGHTS))
    return model, tok


def adapter_state(model):
    """The adapter's tensors under peft's names (base_model.model.<layer>.lora_A.weight): a file
    peft writes loads here, and one we write loads in peft."""
    return {f"base_model.model.{name}.lora_{ab}.weight": getattr(m, f"lora_{ab}")
            for name, m in model.named_modules() if isinstance(m, LoRALinear) for ab in "AB"}


@torch.no_grad()
def load_adapter_weights(model, path):
    """An adapter's saved tensors into `model`'s adapters: every name and shape must match, else
    one line saying which (a file of another base or rank would load as nonsense)."""
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


@torch.no_grad()
def merged_model(model):
    """A plain HF model equal to base + adapter: W + (alpha / r) B A in fresh tensors (in W's dtype)."""
    # Only the adapted weights are copied fresh, since the merge must not write into the shared base, which
    # every other agent still reads.
    merged = shared_copy(model, fresh=[m.base.weight for m in model.modules() if isinstance(m, LoRALinear)])
    for name, m in [(name, m) for name, m in merged.named_modules() if isinstance(m, LoRALinear)]:
        m.base.weight.copy_((m.base.weight.float() + m.delta_weight()).to(m.base.weight.dtype))
        merged.set_submodule(name, m.base)  # the adapted layer's base, merged
    del merged.lora_config
    return merged

# -----------------------------------------------------------------------------
# A team of LoRA agents on one base runs as one batch (docs/scale.md): the base's matmuls once for every
# row, each row through its own agent's adapter, as serving systems batch adapters (Punica, S-LoRA).
# magrpo samples and takes Eq. 2's pass with Team.model; each agent keeps its adapter and optimizer.


def lora_layers(model):
    """{name: LoRALinear} of a model's adapted layers."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def team_of(agents, bases):
    """A Team of `agents` where they are two or more LoRA adapters of one base (the one in `bases`, a
    load_agent's) in the same layers; else `agents` as they are, each to run alone."""
    names = {tuple(lora_layers(agent.model)) for agent in agents}
    shared = len(bases) == 1 and len(names) == 1 and () not in names
    return Team(agents) if shared and len(agents) > 1 else agents


class Team(list):
    """The agents (a list), LoRA adapters of one base, and `model`: all of them in one module, a row of a
    batch through the adapter of the agent that select names for it (TeamLoRALinear)."""

    def __init__(self, agents):
        super().__init__(agents)
        layers = [lora_layers(agent.model) for agent in agents]
        self.model = shared_copy(agents[0].model)  # agent 0's modules on the base's tensors, adapters below
        self.model.team = self  # (generate and the log-prob pass name each row's agent: select)
        self.layers = []
        for name in layers[0]:
            self.layers.append(TeamLoRALinear([agent_layers[name] for agent_layers in layers], self))
            self.model.set_submodule(name, self.layers[-1])
        # Row i: 1 on agent i's r columns of the stacked A, 0 on the others' (an agent has one r).
        first = self.layers[0].layers
        self.columns = torch.block_diag(*[torch.ones(1, layer.lora_A.shape[0]) for layer in first])
        self.columns = self.columns.to(self.model.device, self.model.dtype)
        self.scaling = torch.tensor([layer.scaling for layer in first], device=self.model.device,
                                    dtype=self.model.dtype)  # (alpha / r = 2 by default: exact in bf16 too)
        self.mask, self.scale, self.active = None, None, set()

    def select(self, adapters):
        """adapters [rows] (long): the agent of each row of the passes that follow: the columns of the
        stacked adapters it takes and its alpha / r (TeamLoRALinear); the stacked adapters are made again
        if an optimizer changed them."""
        self.mask, self.scale = self.columns[adapters][:, None, :], self.scaling[adapters][:, None, None]
        self.active = set(adapters.unique().tolist())  # the agents that a pass's gradient reaches
        for layer in self.layers:
            layer.stack()


class TeamLoRALinear(torch.nn.Module):
    """One adapted layer of a Team: its agents' LoRALinear layers on their one base layer, for a batch whose
    rows belong to different agents. With A the agents' A stacked [sum of r, in] and B their B side by side
    [out, sum of r],    y = base(x) + ((x A^T) * mask) B^T * alpha / r   (Team.select: the row's own),
    so the base's matmul runs once for every row, and a row's output, and the gradient it sends to its
    agent's block of A and B, are those of its agent's LoRALinear (0 to the others' blocks)."""

    def __init__(self, layers, team):
        super().__init__()
        self.base, self.team = layers[0].base, team
        self.layers = layers  # a plain list: the agents own their adapters (their optimizers, their files)
        self.cast, self.cast_of = None, None

    def forward(self, x):
        a, b = self.cast
        return self.base(x) + ((x @ a.T) * self.team.mask) @ b.T * self.team.scale

    def stack(self):
        """The agents' A stacked and B side by side in the base's dtype: leaves of their own, made again once
        an optimizer has changed an A or a B (cast_once), whose gradients go to the agents (hand_out)."""
        params = [p for layer in self.layers for p in (layer.lora_A, layer.lora_B)]
        dtype = self.base.weight.dtype

        def stacked():
            a = torch.cat([p.detach().to(dtype) for p in params[0::2]]).requires_grad_()
            b = torch.cat([p.detach().to(dtype) for p in params[1::2]], dim=1).requires_grad_()
            a.register_post_accumulate_grad_hook(lambda a: self.hand_out(a, 0))
            b.register_post_accumulate_grad_hook(lambda b: self.hand_out(b, 1))
            return a, b
        cast_once(self, params, dtype, stacked)

    def hand_out(self, stacked, dim):
        """The gradient a backward pass left on the stacked A (dim 0) or B (dim 1): each agent of the pass
        adds its block to its own A's or B's .grad (fp32, as the adapter), as its own pass would."""
        ranks = [layer.lora_A.shape[0] for layer in self.layers]
        for i, (layer, grad) in enumerate(zip(self.layers, stacked.grad.split(ranks, dim=dim))):
            param = layer.lora_B if dim else layer.lora_A
            if i in self.team.active:
                param.grad = grad.float().contiguous() if param.grad is None else param.grad + grad.float()
        stacked.grad = None

# -----------------------------------------------------------------------------
# Each agent's own optimizer (Sec. 2 step 6).


class MasterWeightAdamW:
    """AdamW over fp32 master copies of low-precision (bf16) weights: an update at RL learning rates
    is below bf16's resolution and would round away; the master copy keeps it."""

    def __init__(self, params, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        # AdamW's moments are fp32 too, since it steps the masters, never the bf16 weights.
        self.inner = adamw(self.master, **kwargs)

    @torch.no_grad()
    def step(self):
        # The bf16 gradient goes to the master, AdamW steps the master, and the model's weight is the
        # master rounded to bf16, so small updates add up in the master until the rounding shows them.
        # Each bf16 gradient is freed once copied, and the fp32 ones after the step, so that between
        # steps a weight costs 14 bytes (2 + a 4-byte master + 8 of moments), not 18.
        for master, p in zip(self.master, self.params):
            master.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        self.inner.step()
        for master, p in zip(self.master, self.params):
            p.copy_(master)
            master.grad = None

    @property
    def param_groups(self):  # the inner AdamW's, so that a schedule sets the learning rate as on any
        return self.inner.param_groups

    def state_dict(self):  # the masters too, or a resumed run would restart from the rounded weights
        return {"inner": self.inner.state_dict(), "master": [m.detach().clone() for m in self.master]}

    @torch.no_grad()
    def load_state_dict(self, state):
        for master, p, saved in zip(self.master, self.params, state["master"]):
            master.copy_(saved)
            p.copy_(saved)
        self.inner.load_state_dict(state["inner"])


def make_optimizer(model, learning_rate, weight_decay=0.0):
    """Each agent's own AdamW (Sec. 2 step 6) over its trainable parameters; fp32 master weights if
    they are low-precision (bf16)."""
    params = [p for p in model.parameters() if p.requires_grad]  # A LoRA agent trains its adapters only.
    # LoRA adapters are fp32 on any base, and fp32 weights need no master copies.
    make = adamw if all(p.dtype == torch.float32 for p in params) else MasterWeightAdamW
    return make(params, lr=learning_rate, weight_decay=weight_decay)


def adamw(params, **kwargs):
    """torch's AdamW, fused into one kernel where the weights are on a GPU: the default (foreach)
    implementation allocates a temporary as large as the weights at every step."""
    return torch.optim.AdamW(params, fused=all(p.is_cuda for p in params) or None, **kwargs)

# -----------------------------------------------------------------------------
# Saving and loading an agent: what transformers or peft load without us (a checkpoint adds what only a
# resumed run needs, runs.save_checkpoint).


def save_agent(agent, path, merged=False):
    """An agent as transformers saves a model (from_pretrained or --model PATH load it), or a LoRA agent
    as peft saves an adapter (a tiny base's seed beside it), with the tokenizer. merged: one model."""
    from safetensors.torch import save_file
    from transformers import logging as hf_logging
    hf_logging.disable_progress_bar()  # no bar per shard saved, as it would bury the training bar
    model = agent.model
    if is_lora(model) and not merged:  # the adapter alone is megabytes, where the base is gigabytes
        os.makedirs(path, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in adapter_state(model).items()},
                  os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        Path(path, ADAPTER_CONFIG).write_text(json.dumps(model.lora_config, indent=1))
        if getattr(model, "tiny_base_seed", None) is not None:
            Path(path, TINY_BASE).write_text(json.dumps({"seed": model.tiny_base_seed}))
    else:
        (merged_model(model) if is_lora(model) else model).save_pretrained(path)
    agent.tokenizer.save_pretrained(path)


def load_agent(name, device, dtype, seed, flag="--model", chat_template=False, lora=None, bases=None,
               base_seed=None):
    """An Agent (no optimizer yet): a saved adapter, a new one `lora` on `name`, or `name` plain;
    ValueError naming `flag`. `bases`: one dict per team, so its LoRA agents share their base."""
    if dtype == "auto":  # bf16 where a GPU computes it at full speed, fp32 on the CPU
        dtype = "bfloat16" if torch.device(device).type == "cuda" else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: unknown {dtype!r}: use auto or one of {', '.join(DTYPES)}")
    bases = {} if bases is None else bases
    adapter = os.path.isfile(os.path.join(name, ADAPTER_CONFIG))  # an adapter directory, ours or peft's
    try:
        if adapter:
            model, tok = load_adapter(name, device, dtype, seed, bases)
        elif lora is not None:  # a new adapter (below) on the team's shared base
            # ./m and m are one base, and the adapter's config names a path that works from elsewhere.
            base_name = os.path.abspath(name) if name != TINY and os.path.isdir(name) else name
            base_seed = seed if base_seed is None else base_seed
            base, tok = shared_base(base_name, device, dtype, base_seed, bases)
        else:
            model, tok = load_model(name, device, dtype, seed=seed)
    except (ValueError, RuntimeError) as e:  # RuntimeError means weights of the wrong shape or dtype
        raise ValueError(f"{flag}: {e}") from None
    if lora is not None and not adapter:  # drawn from its own seed
        try:
            model = add_lora(base, lora, seed, base_name, base_seed)
        except ValueError as e:
            raise ValueError(f"--lora-target-modules: {e}") from None
    elif lora is not None:  # a saved adapter is trained further as it is, so the flags must say what it is
        r, alpha = model.lora_config["r"], model.lora_config["lora_alpha"]
        if (lora.r, lora.alpha) != (r, alpha):
            raise ValueError(f"--lora-r: {name} holds an adapter with r={r}, lora_alpha={alpha:g}, "
                             f"not r={lora.r}, lora_alpha={lora.alpha:g}")
    if chat_template and tok.chat_template is None:
        raise ValueError(f"--chat-template: the tokenizer of {name!r} has no chat template")
    return Agent(model, tok, chat_template=chat_template)

# -----------------------------------------------------------------------------
# The command line's model flags (train.py and eval.py)


def add_model_flags(p):
    p.add_argument("--model", action="append", help="hub name or local path; 'tiny' (default) is the "
                   "built-in random-init model; repeat or give a comma list for one model per agent")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ...; a comma list for one per "
                   "agent; auto: agent i on GPU i mod the GPU count, else the CPU")
    p.add_argument("--dtype", default="auto", help=f"auto (bfloat16 on a GPU, float32 on the CPU) or one "
                   f"of {', '.join(DTYPES)}")
    p.add_argument("--chat-template", action="store_true", help="wrap prompts in its chat template")
    p.add_argument("--feedback-model", help="--feedback expert: the reviewing model (hub name or path)")
    p.add_argument("--cpu-threads", type=int, help="torch's CPU threads (default: 1 for the tiny model; "
                   "else OMP_NUM_THREADS if set, else torch's own: one per core)")


def add_lora_flags(p):  # train.py's
    p.add_argument("--lora-r", type=int, default=0, help="a rank-R LoRA adapter per agent on one shared base")
    p.add_argument("--lora-alpha", type=float, help="the update is scaled by alpha / r (default 2r)")
    p.add_argument("--lora-target-modules", help="comma list of the linear layers that get adapters "
                   f"(default {','.join(LORA_TARGETS)}; GPT-2: c_attn,c_proj,c_fc)")
    p.add_argument("--save-merged", action="store_true", help="LoRA: OUT/agent_i/merged, the full model too")


def lora_from_flags(args):
    """The LoRAConfig of --lora-r/--lora-alpha/--lora-target-modules; None without --lora-r."""
    r, alpha, targets = args.lora_r, args.lora_alpha, args.lora_target_modules
    names = tuple(t.strip() for t in (targets or "").split(",") if t.strip())
    for flag, bad, why in (("--lora-r", r < 0, f"must be >= 1 (0: full fine-tuning), got {r}"),
                           ("--lora-alpha", not r and alpha is not None, "only with --lora-r"),
                           ("--lora-target-modules", not r and targets, "only with --lora-r"),
                           ("--lora-alpha", alpha is not None and not alpha > 0, f"must be > 0, got {alpha}"),
                           ("--lora-target-modules", targets is not None and not names, "want a comma list")):
        if bad:
            raise ValueError(f"{flag}: {why}")
    return LoRAConfig(r, alpha, names or None) if r else None


def model_names(args):
    """--model given repeated and/or as comma lists, flattened; the tiny model by default (the CPU
    demo needs no download)."""
    return [m.strip() for spec in (args.model or [TINY]) for m in spec.split(",") if m.strip()]


# torch's thread count when this module was first imported, one per core or OMP_NUM_THREADS.
TORCH_THREADS = torch.get_num_threads()


def cpu_threads(flag, tiny):
    """The CPU threads a run uses: --cpu-threads, else OMP_NUM_THREADS, else 1 for the tiny model
    and torch's own count (one per core) for real ones."""
    # The tiny model's matrices (64 wide) are too small to split among threads. The threads' start
    # and wait cost more than they save, and on a busy machine OpenMP's waiting threads spin on the
    # cores that another process needs (20x slower steps on 2 busy cores, docs/benchmarks.md).
    if flag is not None:
        if flag < 1:
            raise ValueError(f"--cpu-threads: must be >= 1, got {flag}")
        return flag
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) >= 1:  # the user's (or torchrun's) choice for this process
        return int(omp)
    return 1 if tiny else TORCH_THREADS


def per_agent(values, n, flag):
    """A flag given once or as a list -> one value per agent (given once: every agent the same; a
    team of different models names one per agent)."""
    if len(values) not in (1, n):
        raise ValueError(f"{flag}: gave {len(values)} values for {n} agents")
    return values * (n // len(values))


def set_torch(cpu_threads, devices):
    """The process-wide torch settings of a run, set where train.py and eval.py start one: torch's CPU
    threads, and TF32 for fp32 matmuls where an agent is on a GPU (~8x faster; docs/scale.md)."""
    torch.set_num_threads(cpu_threads)  # for the whole process, since torch has one thread pool
    if any(torch.device(device).type == "cuda" for device in devices):
        torch.backends.cuda.matmul.allow_tf32 = True


def agent_devices(device, n, local_rank=0, local_world=1):
    """One device per agent from --device; "auto" puts agent i on GPU i mod the GPU count (two 3B agents
    and their optimizers overflow an 80 GB GPU), else the CPU; under torchrun, on this process's share."""
    devices, gpus = [d.strip() for d in device.split(",") if d.strip()], torch.cuda.device_count()
    if devices != ["auto"] or not gpus:
        return per_agent(devices if devices != ["auto"] else ["cpu"], n, "--device")
    # Under torchrun this node's GPUs are split among its processes, and process k's agents use its share.
    share = gpus // local_world
    if share < 1:
        raise ValueError(f"--device: {local_world} processes on this node but {gpus} GPUs")
    return [f"cuda:{local_rank * share + i % share}" for i in range(n)]


def load_expert(args, device):
    """--feedback expert's reviewer (through its chat template if it has one), or None."""
    if args.feedback != "expert":
        if args.feedback_model:
            raise ValueError("--feedback-model: only used with --feedback expert")
        return None
    if not args.feedback_model:
        raise ValueError("--feedback: expert needs --feedback-model NAME_OR_PATH (a local causal LM)")
    expert = load_agent(args.feedback_model, device, args.dtype, seed=12345, flag="--feedback-model")
    # A reviewer is asked a question, not continued as a file, so it uses an instruct model's chat format.
    expert.chat_template = expert.tokenizer.chat_template is not None
    return expert
