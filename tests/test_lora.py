"""LoRA agents on one shared frozen base (models.py, "LoRA agents"): a new adapter changes no logit,
a step moves only the adapters, merging equals base + adapter, agents share one base, adapters save
and load (train.py's checkpoints and --resume, eval.py --agents), and a bad LoRA flag is one line.
CPU, tiny random models with a wide init (init_std 0.4) so that logits are not all alike."""
import json
import os

import pytest
import torch

import magrpo
import sampler
import models
import train
from conftest import scripted_generate, update_on

PROMPTS = ["def add(a, b):", "Hi", "The quick brown fox"]


def base_model(tok, arch="qwen2", seed=0):
    return models.tiny_model(tok, arch=arch, init_std=0.4, seed=seed)


def logits(model, tok, prompts=PROMPTS):
    ids, mask = sampler.left_pad(tok(prompts, add_special_tokens=False)["input_ids"], tok.pad_token_id, "cpu")
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=sampler.positions_from_mask(mask)).logits


def adapters(model):
    return [m for m in model.modules() if isinstance(m, models.LoRALinear)]


def randomize_adapters(model, seed=0):
    """B != 0, as after some training, so that the adapter changes the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in adapters(model):
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.2)


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def storage_bytes(*models):
    """Bytes of the distinct tensor storages that the models' parameters and buffers use."""
    seen = {}
    for model in models:
        for t in list(model.parameters()) + list(model.buffers()):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def a_step(agent, tok, seed, sgd_lr=None):
    """One update (train_step's, conftest.update_on) on a scripted rollout (conftest.scripted_generate:
    the update is tested, not the sampler) with fixed non-zero advantages."""
    cfg = magrpo.Config(num_generations=4, max_new_tokens=6, micro_batch_size=3)
    if sgd_lr is not None:
        agent.optimizer = torch.optim.SGD([p for p in agent.model.parameters() if p.requires_grad], lr=sgd_lr)
    rollout = scripted_generate(agent.model, tok, PROMPTS[:2], 4, 6, seed=seed)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)
    return update_on(agent, [(rollout, adv)], cfg)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_lora_new_adapter_changes_no_logit(tok, arch):
    base = base_model(tok, arch)
    before = logits(base, tok)
    model = models.add_lora(base, models.LoRAConfig(4), seed=1)
    per_layer = 4 if arch == "gpt2" else 7  # c_attn, attn.c_proj, c_fc, mlp.c_proj (Conv1D) / q k v o gate up down
    assert len(adapters(model)) == per_layer * base.config.num_hidden_layers
    assert all(m.lora_A.abs().sum() > 0 and not m.lora_B.any() for m in adapters(model))
    assert torch.equal(logits(model, tok), before)  # B = 0 adds exactly 0: bit for bit the base
    assert torch.equal(logits(base, tok), before) and not models.is_lora(base)  # the base is not wrapped


def test_lora_step_changes_only_adapters(tok):
    base = base_model(tok)
    frozen = snapshot(base)
    agent = models.Agent(models.add_lora(base, models.LoRAConfig(4), seed=1), tok)
    agent.optimizer = models.make_optimizer(agent.model, 1e-2)
    trainable = [n for n, p in agent.model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)  # AdamW gets only these
    start = {n: p.detach().clone() for n, p in agent.model.named_parameters() if p.requires_grad}
    for seed in (3, 4):  # B moves at the first step; A only from the second (its gradient is B^T ...)
        assert a_step(agent, tok, seed)["skipped"] == 0
    assert all(torch.equal(base.state_dict()[k], v) for k, v in frozen.items())  # the base: bit-identical
    assert all(p.grad is None for p in base.parameters())
    now = dict(agent.model.named_parameters())
    assert all(not torch.equal(now[n], start[n]) for n in trainable)  # every A and every B moved
    assert not torch.allclose(logits(agent.model, tok), logits(base, tok))


def test_lora_sampler_and_logprob_pass_run_base_plus_adapter(tok):
    base = base_model(tok)
    model = models.add_lora(base, models.LoRAConfig(4), seed=1)
    randomize_adapters(model)
    out = sampler.generate(model, tok, PROMPTS, 3, 8, seed=7)
    with torch.no_grad():
        lp = magrpo.completion_logprobs(model, out)
        lp_base = magrpo.completion_logprobs(base, out)
    m = out.completion_mask.bool()
    assert torch.allclose(lp[m], out.logprobs[m], atol=1e-4)  # the same policy samples and is scored
    assert not torch.allclose(lp_base[m], out.logprobs[m], atol=1e-2)  # ... and it is not the base's


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_lora_merged_equals_base_plus_adapter(tok, arch, tmp_path):
    base = base_model(tok, arch)
    frozen = snapshot(base)
    agent = models.Agent(models.add_lora(base, models.LoRAConfig(4, alpha=16), seed=1), tok)
    randomize_adapters(agent.model)
    want = logits(agent.model, tok)
    assert not torch.allclose(want, logits(base, tok), atol=1e-2)  # the adapter matters
    merged = models.merged_model(agent.model)
    assert not models.is_lora(merged) and not hasattr(merged, "lora_config")
    assert torch.allclose(logits(merged, tok), want, rtol=1e-4, atol=1e-4)
    assert all(torch.equal(base.state_dict()[k], v) for k, v in frozen.items())  # merging left the base alone
    assert torch.equal(logits(agent.model, tok), want)
    models.save_agent(agent, str(tmp_path / "merged"), merged=True)  # a plain HF model: from_pretrained, no adapter code
    from transformers import AutoModelForCausalLM
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.allclose(logits(reloaded, tok), want, rtol=1e-4, atol=1e-4)


def test_lora_agents_share_one_base(tok):
    bases = {}
    a, b = (models.load_agent("tiny", "cpu", "float32", seed, lora=models.LoRAConfig(4), bases=bases, base_seed=0)
            for seed in (1, 2))
    assert len(bases) == 1
    base = next(iter(bases.values()))[0]
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    for name, p in base.named_parameters():  # q_proj.weight in the base is q_proj.base.weight in an agent
        key = name if name in pa else name.replace(".weight", ".base.weight").replace(".bias", ".base.bias")
        assert pa[key] is p and pb[key] is p and pa[key].data_ptr() == pb[key].data_ptr() == p.data_ptr()
        assert not p.requires_grad
    lora_a = [p for n, p in pa.items() if "lora_" in n]
    lora_b = [p for n, p in pb.items() if "lora_" in n]
    assert all(x.data_ptr() != y.data_ptr() for x, y in zip(lora_a, lora_b))
    assert not torch.equal(lora_a[0], lora_b[0])  # each agent's adapter is drawn from its own seed
    adapter_bytes = sum(p.numel() * 4 for p in lora_a)
    assert storage_bytes(a.model, b.model) == storage_bytes(base) + 2 * adapter_bytes
    assert a.model.generation_config is not b.model.generation_config  # each agent is its own HF model
    other = models.load_agent("tiny", "cpu", "float32", 3, lora=models.LoRAConfig(4), bases=bases, base_seed=5)
    assert len(bases) == 2 and storage_bytes(a.model, other.model) > storage_bytes(base) + 2 * adapter_bytes


def test_lora_bf16_base_keeps_fp32_adapters_and_plain_adamw(tok):
    agent = models.load_agent("tiny", "cpu", "bfloat16", 1, lora=models.LoRAConfig(4))
    dtypes = {n.rsplit(".", 1)[-1]: p.dtype for n, p in agent.model.named_parameters()}
    assert dtypes["lora_A"] == dtypes["lora_B"] == torch.float32 and dtypes["weight"] == torch.bfloat16
    agent.optimizer = models.make_optimizer(agent.model, 1e-2)
    assert isinstance(agent.optimizer, torch.optim.AdamW)  # no master copy: the adapter is fp32 already
    assert a_step(agent, tok, 3)["skipped"] == 0


def test_lora_sampling_casts_the_adapters_once_per_optimizer_step(tok):
    """On a bf16 base the fp32 adapters are cast once for sampling, not at every token, and a step of
    the optimizer makes the next sample use the new weights (a stale cast would sample the old policy)."""
    agent = models.load_agent("tiny", "cpu", "bfloat16", 1, lora=models.LoRAConfig(4))
    agent.optimizer = models.make_optimizer(agent.model, 1e-2)
    adapters = [m for m in agent.model.modules() if isinstance(m, models.LoRALinear)]
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        agent.model(ids)
        casts = [m.cast[0] for m in adapters]
        agent.model(ids)
    assert all(m.cast[0] is cast for m, cast in zip(adapters, casts)), "cast again without any change"
    assert a_step(agent, tok, 3)["skipped"] == 0
    with torch.no_grad():
        sampled = agent.model(ids).logits
    fresh = agent.model(ids).logits.detach()  # with gradients on, the adapters are always cast anew
    assert torch.equal(sampled, fresh)
    assert all(m.cast[0] is not cast for m, cast in zip(adapters, casts))


def test_lora_save_load_roundtrip(tok, tmp_path):
    bases = {}
    agent = models.load_agent("tiny", "cpu", "float32", 1, lora=models.LoRAConfig(4, target_modules=("q_proj", "v_proj")),
                              bases=bases, base_seed=0)
    randomize_adapters(agent.model)
    models.save_agent(agent, str(tmp_path / "agent_0"))
    files = sorted(os.listdir(tmp_path / "agent_0"))
    assert "adapter_model.safetensors" in files and "adapter_config.json" in files and "model.safetensors" not in files
    config = json.loads((tmp_path / "agent_0" / "adapter_config.json").read_text())
    assert {k: config[k] for k in ("peft_type", "r", "lora_alpha", "target_modules", "base_model_name_or_path",
                                   "lora_dropout")} == \
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8.0, "target_modules": ["q_proj", "v_proj"],
         "base_model_name_or_path": "tiny", "lora_dropout": 0.0}
    assert json.loads((tmp_path / "agent_0" / models.TINY_BASE).read_text()) == {"seed": 0}  # not in peft's file
    from safetensors.torch import load_file
    keys = sorted(load_file(tmp_path / "agent_0" / "adapter_model.safetensors"))
    assert keys[0] == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"  # peft's names
    assert len(keys) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    fresh = models.load_agent(str(tmp_path / "agent_0"), "cpu", "float32", 9)  # the base rebuilt from the seed
    assert torch.equal(logits(fresh.model, tok), logits(agent.model, tok))
    shared = models.load_agent(str(tmp_path / "agent_0"), "cpu", "float32", 9, bases=bases)
    assert len(bases) == 1 and shared.model.get_input_embeddings().weight is agent.model.get_input_embeddings().weight
    again = tmp_path / "again"
    models.save_agent(fresh, str(again))  # saved again: the same adapter file, byte for byte
    assert (again / "adapter_model.safetensors").read_bytes() == (tmp_path / "agent_0" / "adapter_model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="^--lora-r: .* r=4"):
        models.load_agent(str(tmp_path / "agent_0"), "cpu", "float32", 9, lora=models.LoRAConfig(8))


def test_lora_adapter_on_a_local_base_names_it(tok, tmp_path, monkeypatch):
    base = base_model(tok)
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    monkeypatch.chdir(tmp_path)  # a relative --model: the adapter records the absolute path
    agent = models.load_agent("base", "cpu", "float32", 1, lora=models.LoRAConfig(2))
    randomize_adapters(agent.model)
    models.save_agent(agent, str(tmp_path / "adapter"))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "base") and not (tmp_path / "adapter" / models.TINY_BASE).exists()
    monkeypatch.chdir("/")
    loaded = models.load_agent(str(tmp_path / "adapter"), "cpu", "float32", 0)
    assert torch.equal(logits(loaded.model, tok), logits(agent.model, tok))


def test_lora_adapter_that_does_not_fit_is_one_line(tok, tmp_path):
    agent = models.load_agent("tiny", "cpu", "float32", 1, lora=models.LoRAConfig(2, target_modules=("q_proj", "v_proj")))
    models.save_agent(agent, str(tmp_path / "a"))
    config_path = tmp_path / "a" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    for targets, why in ((["q_proj"], "does not fit its adapter config: unexpected base_model.model.model.layers.0.self_attn.v_proj"),
                         (["qkv_proj"], "does not fit its base 'tiny': no linear layer named 'qkv_proj'")):
        config_path.write_text(json.dumps({**config, "target_modules": targets}))
        with pytest.raises(ValueError) as e:
            models.load_agent(str(tmp_path / "a"), "cpu", "float32", 0, flag="--agents")
        assert str(e.value).startswith("--agents: ") and why in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_lora_adapter_loads_in_peft_as_peft_own(tok, tmp_path):
    """peft reads our adapter as it reads one it saved itself: the same logits as ours, and not one
    warning more (its config file is exactly peft's; the tiny base's seed lives beside it)."""
    import warnings
    peft = pytest.importorskip("peft")
    agent = models.load_agent("tiny", "cpu", "float32", 1, lora=models.LoRAConfig(4), base_seed=5)
    randomize_adapters(agent.model)
    models.save_agent(agent, str(tmp_path / "ours"))
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(models.LORA_TARGETS), lora_dropout=0.0)
    theirs = peft.get_peft_model(models.tiny_model(tok, seed=5), config)
    with torch.no_grad():  # B != 0, so that their adapter changes the logits
        for n, p in theirs.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.2)
    theirs.save_pretrained(tmp_path / "theirs")

    def load(adapter):  # on the tiny base the adapter was trained on (peft can't build "tiny" by name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = peft.PeftModel.from_pretrained(models.tiny_model(tok, seed=5), adapter)
        return model.eval(), sorted(str(w.message) for w in caught)
    ours, ours_warnings = load(tmp_path / "ours")
    theirs, theirs_warnings = load(tmp_path / "theirs")
    assert ours_warnings == theirs_warnings
    assert torch.equal(logits(ours, tok), logits(agent.model, tok))
    config_path = tmp_path / "theirs" / "adapter_config.json"  # and we read peft's own files
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "base_model_name_or_path": "tiny"}))
    (tmp_path / "theirs" / models.TINY_BASE).write_text('{"seed": 5}')
    assert torch.equal(logits(models.load_agent(str(tmp_path / "theirs"), "cpu", "float32", 0).model, tok),
                       logits(theirs, tok))


def test_lora_adapter_without_a_base_is_one_line(tok, tmp_path):
    """peft may write base_model_name_or_path null: train.py names the flag, writes nothing."""
    import train
    agent = models.load_agent("tiny", "cpu", "float32", 1, lora=models.LoRAConfig(2))
    models.save_agent(agent, str(tmp_path / "a"))
    config_path = tmp_path / "a" / "adapter_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "base_model_name_or_path": None}))
    with pytest.raises(SystemExit) as e:
        train.train(train.parse_args(["--model", str(tmp_path / "a"), "--steps", "1", "--out", str(tmp_path / "run")]))
    message = str(e.value.code)
    assert message.startswith("train.py: error: --model: ") and "names no base model" in message, message
    assert "\n" not in message and not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, named", [
    (["--lora-r", "-1"], "--lora-r"),
    (["--lora-alpha", "8"], "--lora-alpha"),
    (["--lora-target-modules", "q_proj"], "--lora-target-modules"),
    (["--lora-r", "4", "--lora-alpha", "0"], "--lora-alpha"),
    (["--lora-r", "4", "--lora-target-modules", "q_proj,qkv_proj"], "--lora-target-modules"),
    (["--lora-r", "4", "--lora-target-modules", "lm_head"], "--lora-target-modules"),
    (["--lora-r", "4", "--lora-target-modules", " , "], "--lora-target-modules"),
])
def test_lora_bad_flag_is_one_line(flags, named, tmp_path):
    import train
    with pytest.raises(SystemExit) as e:
        train.train(train.parse_args(flags + ["--steps", "1", "--out", str(tmp_path / "run")]))
    message = str(e.value.code)
    assert message.startswith(f"train.py: error: {named}:") and "\n" not in message, message
    assert not (tmp_path / "run").exists()


def test_lora_gpt2_without_target_names_says_which_flag(tok, tmp_path):
    base_model(tok, "gpt2").save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^--lora-target-modules: no linear layer named 'q_proj' in this "
                                         r"gpt2 model \(its linear layers: c_attn, c_fc, c_proj, lm_head\)"):
        models.load_agent(str(tmp_path), "cpu", "float32", 0, lora=models.LoRAConfig(4, target_modules=["q_proj"]))

# -----------------------------------------------------------------------------
# train.py and eval.py with --lora-r

QUICK = ["--lora-r", "4", "--steps", "6", "--num-generations", "4", "--max-new-tokens", "8", "--batch-size", "1"]


def rows_of(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def same_run(a, b):
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    return strip(a) == strip(b)


@pytest.mark.integration
def test_lora_train_shares_one_base_and_resume_continues_exactly(tmp_path):
    import train
    whole, out = str(tmp_path / "whole"), str(tmp_path / "run")
    args = train.parse_args(QUICK + ["--out", whole])
    env, _ = train.resolve_flags(args)
    agents = train.build(args, env)
    emb = [a.model.get_input_embeddings().weight for a in agents]
    assert emb[0] is emb[1] and all(models.is_lora(a.model) for a in agents)  # one tiny base, from --seed
    train.train(train.parse_args(QUICK + ["--out", whole]))
    train.train(train.parse_args(QUICK[:3] + ["2"] + QUICK[4:] + ["--save-every", "1", "--out", out]))
    state = json.loads(open(os.path.join(out, "checkpoint-2", "trainer_state.json")).read())
    assert {"agent_0/adapter_model.safetensors", "agent_0/adapter_config.json", "agent_0/optimizer.pt"} <= set(state["files"])
    assert not any(f.endswith("model.safetensors") and "adapter" not in f for f in state["files"])
    train.train(train.parse_args(QUICK + ["--resume", "--out", out]))
    assert same_run(rows_of(out), rows_of(whole))
    assert len(rows_of(out)) == 6 and any(r["loss_0"] != 0 for r in rows_of(out))


@pytest.mark.integration
def test_lora_final_agents_and_merged_models_load_in_eval(tmp_path):
    import eval as ev
    import train
    out = str(tmp_path / "run")
    train.train(train.parse_args(QUICK[:3] + ["2"] + QUICK[4:] + ["--save-merged", "--out", out]))
    _, _, team, _ = ev.setup(ev.parse_args(["--agents", out, "--methods", "magrpo"]))
    agents = team["magrpo"]  # --agents: the trained ones, on one shared base
    assert all(models.is_lora(a.model) for a in agents)
    assert agents[0].model.get_input_embeddings().weight is agents[1].model.get_input_embeddings().weight
    tok = agents[0].tokenizer
    for i, agent in enumerate(agents):
        merged = models.load_agent(os.path.join(out, f"agent_{i}", "merged"), "cpu", "float32", 0)
        assert not models.is_lora(merged.model)
        assert torch.allclose(logits(merged.model, tok), logits(agent.model, tok), rtol=1e-4, atol=1e-4)
    report = ev.main(["--agents", out, "--limit", "2", "--num-samples", "2", "--methods", "magrpo"])
    assert "magrpo" in report["turns"][0]["methods"]

# -----------------------------------------------------------------------------
# A Team: LoRA agents of one base sample and learn as one batch (models.Team), against one agent at a
# time, the reference (magrpo.sample_team and update_team on a plain list of the same agents)


def lora_team(n, seed=0):
    """n LoRA agents of one tiny fp32 base, their adapters made different (B != 0), each with AdamW."""
    bases = {}
    agents = [models.load_agent("tiny", "cpu", "float32", seed + i, lora=models.LoRAConfig(4), bases=bases,
                                base_seed=seed) for i in range(n)]
    for i, agent in enumerate(agents):
        randomize_adapters(agent.model, seed=i)
        agent.optimizer = models.make_optimizer(agent.model, 1e-2)
    return agents


def team_prompts(n):
    """Agent i's prompts: of lengths that differ between the agents, and one the same for all (its
    rows must still go through their own agents' adapters, in sequences of their own)."""
    return [[PROMPTS[0], PROMPTS[1 + i % 2] * (i + 1)] for i in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_team_samples_the_tokens_of_each_agent_alone(n, monkeypatch):
    agents = lora_team(n)
    # Many ends of text, so that rows finish at different steps and leave the batch (generate's drops).
    monkeypatch.setattr(sampler, "eos_token_ids", lambda model, tokenizer: list(range(0, 258, 9)))
    cfg = magrpo.Config(num_generations=3, max_new_tokens=30, top_p=0.9)
    alone = magrpo.sample_team(agents, team_prompts(n), 3, cfg, [5, 6])
    together = magrpo.sample_team(models.Team(agents), team_prompts(n), 3, cfg, [5, 6])
    assert len(set(alone[0].completion_mask.sum(-1).tolist())) > 2  # rows of many lengths
    for a, t in zip(alone, together):
        width = t.completion_ids.shape[1]  # cut to the agent's longest row
        assert t.texts == a.texts
        assert torch.equal(t.completion_ids, a.completion_ids[:, :width]) and not a.completion_mask[:, width:].any()
        assert torch.equal(t.prompt_ids, a.prompt_ids) and torch.equal(t.completion_mask, a.completion_mask[:, :width])
        assert torch.allclose(t.logprobs, a.logprobs[:, :width], atol=1e-5)
        assert torch.allclose(t.floors, a.floors[:, :width], atol=1e-5)
    assert [r.texts for r in alone] != [alone[0].texts] * n  # the agents' adapters do differ


class Recorder:
    """An optimizer that keeps the gradients it is given, and changes nothing."""

    def __init__(self, model):
        self.model, self.grads = model, None

    def step(self):
        self.grads = [None if p.grad is None else p.grad.clone() for p in self.model.parameters() if p.requires_grad]


@pytest.mark.parametrize("loss_type", ["seq_sum", "token_mean"])
def test_team_gives_each_adapter_the_gradient_of_its_own_pass(loss_type):
    """One pass for the team: each adapter's gradient is that of its agent's pass alone (relative
    difference <= 1e-5 in fp32); an agent whose advantages are all 0 gets none, as alone; an agent out
    of one micro-batch (its advantages 0 there) takes its gradient from the others."""
    agents = lora_team(3)
    cfg = magrpo.Config(num_generations=4, max_new_tokens=12, micro_batch_size=4, loss_type=loss_type, top_k=40)
    rollouts = magrpo.sample_team(agents, team_prompts(3), 4, cfg, [1, 2])
    g = torch.Generator().manual_seed(0)
    advantages = [torch.randn(8, generator=g) for _ in agents]
    advantages[1][4:] = 0.0
    advantages[2][:] = 0.0
    parts = [[(rollout, rollout.completion_mask, adv, 1.0)] for rollout, adv in zip(rollouts, advantages)]
    grads, metrics = {}, {}
    for name, who in (("alone", agents), ("team", models.Team(agents))):
        for agent in agents:
            agent.optimizer = Recorder(agent.model)
        metrics[name] = magrpo.update_team(who, parts, cfg)
        grads[name] = [agent.optimizer.grads for agent in agents]
    for i in range(2):
        alone, team = torch.cat([x.flatten() for x in grads["alone"][i]]), torch.cat([x.flatten() for x in grads["team"][i]])
        assert (team - alone).norm() <= 1e-5 * alone.norm(), i
        assert metrics["team"][f"loss_{i}"] == pytest.approx(metrics["alone"][f"loss_{i}"], rel=1e-5)
        assert metrics["team"][f"logprob_drift_{i}"] == pytest.approx(metrics["alone"][f"logprob_drift_{i}"], abs=1e-6)
    assert all(x is None for x in grads["team"][2] + grads["alone"][2])


def test_team_decode_step_and_logprob_pass_dispatch_the_ops_of_one_agent():
    """Counted on the CPU, which predicts a GPU's kernel launches: a decode step of a team of 2 or 4
    agents (8 rows each) dispatches at most 1.2x the operations of one agent's step (8 rows), and the
    log-prob pass of Eq. 2 (forward and backward) of the team's rows, at most 1.2x one agent's."""
    from test_sampler import DispatchCount
    cfg = magrpo.Config(num_generations=4, max_new_tokens=8)

    def decode_ops(model, rows, team=None):
        prompt_ids = torch.randint(0, 200, (rows, 5))
        prompt_mask = torch.ones_like(prompt_ids)
        if team is not None:
            team.select(torch.arange(len(team)).repeat_interleave(rows // len(team)))
        logits, cache = sampler.prefill(model, prompt_ids, prompt_mask, torch.arange(rows), 16)
        mask, positions, slot = sampler.decode_inputs(prompt_mask, 16, model.dtype)
        with torch.no_grad(), sampler.attention(model, sampler.CACHED):
            with DispatchCount() as count:
                sampler.decode_step(model, cache, logits.argmax(-1), mask, positions, slot)
        return count.ops

    def pass_ops(agents):
        rollouts = magrpo.sample_team(agents, team_prompts(len(agents)), 4, cfg, [1, 2])
        alone = len(agents) == 1
        model, rows = (agents[0].model, rollouts[0]) if alone else (agents.model, sampler.joined(rollouts, range(len(agents))))
        with DispatchCount() as count:
            magrpo.completion_logprobs(model, rows).sum().backward()
        return count.ops
    one = lora_team(1)
    for n in (2, 4):
        team = models.Team(lora_team(n))
        assert decode_ops(team.model, 8 * n, team) <= 1.2 * decode_ops(one[0].model, 8), n
        assert pass_ops(team) <= 1.2 * pass_ops(one), n


@pytest.mark.integration
def test_lora_team_trains_as_one_agent_at_a_time_and_says_so(tmp_path, monkeypatch, capsys):
    """train.py builds a Team of LoRA agents on one base and says so at the start; its run is the run
    of one agent at a time (the same rewards, losses within float error), and peft loads every agent it
    saves with our logits."""
    import train
    batched, alone = str(tmp_path / "batched"), str(tmp_path / "alone")
    steps = QUICK[:3] + ["3"] + QUICK[4:]
    train.train(train.parse_args(steps + ["--out", batched]))
    assert "team: 2 agents sample and learn in one batch" in capsys.readouterr().err
    monkeypatch.setattr(models, "team_of", lambda agents, bases: agents)
    train.train(train.parse_args(steps + ["--out", alone]))
    assert "one at a time" in capsys.readouterr().err
    for a, b in zip(rows_of(batched), rows_of(alone)):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["loss_0"] == pytest.approx(b["loss_0"], rel=1e-4) and a["loss_1"] == pytest.approx(b["loss_1"], rel=1e-4)
    peft = pytest.importorskip("peft")
    tok = models.tiny_tokenizer()
    for i in range(2):
        ours = models.load_agent(os.path.join(batched, f"agent_{i}"), "cpu", "float32", 0).model
        theirs = peft.PeftModel.from_pretrained(models.tiny_model(tok, seed=0), os.path.join(batched, f"agent_{i}"))
        assert torch.equal(logits(theirs.eval(), tok), logits(ours, tok))


def test_team_in_bfloat16_keeps_the_bases_dtype_and_near_the_reference_gradients():
    """A GPU's dtype: a Team on a bf16 base computes in bf16 (a fp32 scale would turn the next layer's
    input to fp32, which its bf16 weights refuse), samples, and gives each fp32 adapter a gradient near
    its own pass's (bf16 rounds differently in another batch shape: within 2%)."""
    bases = {}
    agents = [models.load_agent("tiny", "cpu", "bfloat16", i, lora=models.LoRAConfig(4), bases=bases, base_seed=0)
              for i in range(2)]
    for i, agent in enumerate(agents):
        randomize_adapters(agent.model, seed=i)
    team = models.Team(agents)
    cfg = magrpo.Config(num_generations=4, max_new_tokens=12, micro_batch_size=4)
    rollouts = magrpo.sample_team(team, team_prompts(2), 4, cfg, [1, 2])
    assert all(len(r) == 8 for r in rollouts)
    team.select(torch.tensor([0, 1]))
    assert team.model(input_ids=torch.tensor([[5, 6, 7], [8, 9, 10]])).logits.dtype == torch.bfloat16
    parts = [[(r, r.completion_mask, torch.randn(8, generator=torch.Generator().manual_seed(i)), 1.0)]
             for i, r in enumerate(rollouts)]
    grads = {}
    for name, who in (("alone", agents), ("team", team)):
        for agent in agents:
            agent.optimizer = Recorder(agent.model)
        magrpo.update_team(who, parts, cfg)
        grads[name] = [torch.cat([g.flatten() for g in agent.optimizer.grads]) for agent in agents]
    for alone, batched in zip(grads["alone"], grads["team"]):
        assert batched.dtype == torch.float32 and (batched - alone).norm() <= 0.02 * alone.norm()
