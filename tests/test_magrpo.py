"""Tests of the algorithm in magrpo.py: the sampler against transformers' own generate, the sampling
distribution, log-probs, Eq. 1 and Eq. 2 on hand-computed numbers. CPU, tiny random models."""
import math

import pytest
import torch

import magrpo
from magrpo import completion_logprobs, generate, group_advantages, policy_loss

PROMPTS = ["def add(a, b):", "Hi", "The quick brown fox jumps", "x"]  # ragged: left padding matters


@pytest.fixture(scope="module")
def tok():
    return magrpo.tiny_tokenizer()


def build(tok, arch, seed=0):
    # A wide init makes logits spread out, so greedy decoding is not one repeated token.
    return magrpo.tiny_model(tok, arch=arch, init_std=0.5, seed=seed).eval()


def hf_greedy(model, tok, prompts, max_new_tokens):
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return out[:, enc["input_ids"].shape[1]:]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_greedy_matches_model_generate(tok, arch):
    model = build(tok, arch)
    ours = generate(model, tok, PROMPTS, max_new_tokens=20, temperature=0)
    ref = hf_greedy(model, tok, PROMPTS, 20)
    T = ref.shape[1]
    assert torch.equal(ours.completion_ids[:, :T], ref)
    assert (ours.completion_ids[:, T:] == tok.pad_token_id).all()
    assert len(set(ours.completion_ids[0].tolist())) > 3, "degenerate greedy output: test is too weak"


def test_tokenizer_without_pad_token(tok):
    model = build(tok, "llama", seed=7)
    ref = generate(model, tok, PROMPTS, max_new_tokens=6, temperature=0)
    bare = magrpo.tiny_tokenizer()
    bare.pad_token = None
    bare.padding_side = "right"
    r = generate(model, bare, PROMPTS, max_new_tokens=6, temperature=0)
    assert r.texts == ref.texts and bare.padding_side == "right"
    assert (r.prompt_ids[r.prompt_mask == 0] == tok.eos_token_id).all()  # EOS stands in for padding


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_batched_equals_unbatched_and_groups_identical(tok, arch):
    model = build(tok, arch, seed=1)
    batched = generate(model, tok, PROMPTS, num_generations=3, max_new_tokens=16, temperature=0)
    for b, prompt in enumerate(PROMPTS):
        alone = generate(model, tok, [prompt], max_new_tokens=16, temperature=0)
        for g in range(3):  # prompt-major order: row b * G + g
            assert torch.equal(batched.completion_ids[b * 3 + g], alone.completion_ids[0])
            assert batched.texts[b][g] == alone.texts[0][0]


def test_eos_stops_a_row_and_masks_after_it(tok):
    model = build(tok, "qwen2", seed=2)
    free = generate(model, tok, PROMPTS, max_new_tokens=12, temperature=0)
    # Declare the 5th greedy token of row 0 an EOS: row 0 must stop there (EOS counted, pad after).
    stop_id = int(free.completion_ids[0, 4])
    model.generation_config.eos_token_id = [tok.eos_token_id, stop_id]
    r = generate(model, tok, PROMPTS, max_new_tokens=12, temperature=0)
    first = int((r.completion_ids[0] == stop_id).nonzero()[0])
    assert first <= 4
    assert r.completion_mask[0].tolist() == [1] * (first + 1) + [0] * (11 - first)
    assert (r.completion_ids[0, first + 1:] == tok.pad_token_id).all()
    assert torch.equal(r.completion_ids[0, :first + 1], free.completion_ids[0, :first + 1])
    assert r.texts[0][0] == tok.decode(free.completion_ids[0, :first].tolist())
    # the other rows keep decoding exactly as before until they too emit stop_id
    for row in range(1, len(PROMPTS)):
        ids = free.completion_ids[row].tolist()
        n = ids.index(stop_id) + 1 if stop_id in ids else 12
        assert torch.equal(r.completion_ids[row, :n], free.completion_ids[row, :n])


def test_first_tokens_follow_softmax_over_temperature(tok):
    model = build(tok, "qwen2", seed=3)
    T, n = 0.7, 20000
    r = generate(model, tok, ["abc"], num_generations=n, max_new_tokens=1, temperature=T, seed=0)
    with torch.no_grad():
        enc = tok(["abc"], return_tensors="pt", add_special_tokens=False)
        probs = torch.softmax(model(**enc).logits[0, -1] / T, -1)
    freq = torch.bincount(r.completion_ids[:, 0], minlength=probs.numel()).float() / n
    tv = 0.5 * (freq - probs).abs().sum().item()
    assert tv < 0.06, tv
    # and not the temperature-1 distribution (the check can tell temperatures apart)
    probs1 = torch.softmax(model(**enc).logits[0, -1], -1).detach()
    assert 0.5 * (freq - probs1).abs().sum().item() > 2 * tv


def test_sample_token_matches_distribution_and_nucleus():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).repeat(40000, 1)
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(logits[0] / 1.5, -1)
    freq = torch.bincount(magrpo.sample_token(logits, 1.5, 1.0, g), minlength=6).float() / 40000
    assert torch.allclose(freq, probs, atol=0.01)
    # top_p: the nucleus is the smallest prefix of sorted tokens whose mass reaches top_p
    p = torch.softmax(logits[0], -1)  # [0.61, 0.22, 0.14, 0.08, ...] roughly
    top_p = float(p[0] + p[1]) + 1e-3  # needs the 3rd token too
    s = magrpo.sample_token(logits, 1.0, top_p, g)
    assert set(s.tolist()) == {0, 1, 2}
    kept = p[:3] / p[:3].sum()
    assert torch.allclose(torch.bincount(s, minlength=6)[:3].float() / 40000, kept, atol=0.01)
    assert set(magrpo.sample_token(logits, 1.0, 0.3, g).tolist()) == {0}
    assert magrpo.sample_token(logits[:2], 0, 1.0).tolist() == [0, 0]


def test_top_p_in_generate_never_leaves_the_nucleus(tok):
    model = build(tok, "llama", seed=4)
    r = generate(model, tok, ["q"], num_generations=3000, max_new_tokens=1, temperature=1.0, top_p=0.5, seed=1)
    with torch.no_grad():
        enc = tok(["q"], return_tensors="pt", add_special_tokens=False)
        p = torch.softmax(model(**enc).logits[0, -1], -1)
    sp, order = p.sort(descending=True)
    size = int((sp.cumsum(0) < 0.5).sum()) + 1
    nucleus = set(order[:size].tolist())
    assert set(r.completion_ids[:, 0].tolist()) <= nucleus
    assert len(set(r.completion_ids[:, 0].tolist())) == len(nucleus) or len(nucleus) > 20


def test_seed_makes_sampling_reproducible(tok):
    model = build(tok, "qwen2", seed=5)
    a = generate(model, tok, PROMPTS, num_generations=2, max_new_tokens=8, seed=7)
    b = generate(model, tok, PROMPTS, num_generations=2, max_new_tokens=8, seed=7)
    c = generate(model, tok, PROMPTS, num_generations=2, max_new_tokens=8, seed=8)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_completion_logprobs_match_the_sampler(tok, arch):
    model = build(tok, arch, seed=6)
    T = 0.7
    free = generate(model, tok, PROMPTS, num_generations=3, max_new_tokens=10, temperature=T, seed=3)
    # make a token the sampler drew early an extra EOS, so that some rows stop and get padding
    model.generation_config.eos_token_id = [tok.eos_token_id, int(free.completion_ids[0, 2])]
    r = generate(model, tok, PROMPTS, num_generations=3, max_new_tokens=10, temperature=T, seed=3)
    assert (r.completion_mask == 0).any(), "want some rows that stopped early"
    lp = completion_logprobs(model, r, temperature=T)
    assert lp.shape == r.completion_ids.shape and lp.requires_grad
    m = r.completion_mask.bool()
    assert torch.allclose(lp[m], r.logprobs[m], atol=1e-4)
    # a micro-batch of rows (trimmed padding) gives the same values
    sub = r.rows(3, 7)
    lp_sub = completion_logprobs(model, sub, temperature=T)
    assert torch.allclose(lp_sub[sub.completion_mask.bool()], lp[3:7][m[3:7, :sub.completion_ids.shape[1]]], atol=1e-4)


def test_group_advantages_eq1_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [2.0, 2.0, 2.0, 2.0]])
    assert torch.allclose(group_advantages(r), torch.tensor([[-2.0, -1.0, 0.0, 3.0], [0.0] * 4]))
    rloo = group_advantages(r, "rloo")[0]  # R - mean of the other three
    assert torch.allclose(rloo, torch.tensor([1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 6 / 3]))
    std = math.sqrt(((1 - 3) ** 2 + 1 + 0 + 9) / 3)
    assert torch.allclose(group_advantages(r, "std")[0], torch.tensor([-2.0, -1.0, 0.0, 3.0]) / std)
    assert (group_advantages(r, "std")[1] == 0).all() and (group_advantages(r, "rloo")[1] == 0).all()
    assert torch.allclose(group_advantages([0.0, 4.0]), torch.tensor([-2.0, 2.0]))  # any leading dims
    with pytest.raises(ValueError):
        group_advantages(r, "median")


def test_policy_loss_eq2_by_hand_with_padding():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # row 0: EOS at t=1, t=2 is padding
    adv = torch.tensor([2.0, -1.0])
    cases = {"seq_sum": (-(2 * -3 + -1 * -10) / 2, [[-1.0, -1.0, 0.0], [0.5, 0.5, 0.5]]),
             "token_mean": (-(2 * -3 + -1 * -10) / 5, [[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]]),
             "seq_mean": (-(2 * -3 / 2 + -1 * -10 / 3) / 2, [[-0.5, -0.5, 0.0], [1 / 6, 1 / 6, 1 / 6]])}
    for loss_type, (value, grad) in cases.items():
        lp.grad = None
        loss = policy_loss(lp, mask, adv, loss_type)
        loss.backward()
        assert loss.item() == pytest.approx(value), loss_type
        assert torch.allclose(lp.grad, torch.tensor(grad)), loss_type
    with pytest.raises(ValueError):
        policy_loss(lp, mask, adv, "bogus")


def test_policy_loss_micro_batches_add_up_to_the_batch():
    torch.manual_seed(0)
    lp, adv = torch.randn(6, 5), torch.randn(6)
    mask = (torch.rand(6, 5) > 0.3).long()
    mask[:, 0] = 1
    for loss_type in magrpo.LOSS_TYPES:
        whole = policy_loss(lp, mask, adv, loss_type)
        norm = magrpo.loss_normalizer(mask, loss_type)
        parts = sum(policy_loss(lp[i:i + 2], mask[i:i + 2], adv[i:i + 2], loss_type, norm) for i in range(0, 6, 2))
        assert parts.item() == pytest.approx(whole.item(), abs=1e-6), loss_type


def test_joint_actions_and_credit_aligned_and_cross():
    assert magrpo.joint_actions(2, 3) == [(0, 0), (1, 1), (2, 2)]
    cross = magrpo.joint_actions(2, 2, "cross")
    assert cross == [(0, 0), (0, 1), (1, 0), (1, 1)]
    rewards = torch.tensor([[1.0, 2.0, 3.0, 6.0]])  # R(0,0)=1, R(0,1)=2, R(1,0)=3, R(1,1)=6
    a0, a1 = magrpo.credited_returns(rewards, cross, 2, 2)
    assert torch.allclose(a0, torch.tensor([[1.5, 4.5]]))  # agent 0's g: mean over agent 1's choices
    assert torch.allclose(a1, torch.tensor([[2.0, 4.0]]))
    aligned = torch.tensor([[1.0, 5.0, 2.0]])
    for c in magrpo.credited_returns(aligned, magrpo.joint_actions(3, 3), 3, 3):
        assert torch.equal(c, aligned)
    assert len(magrpo.joint_actions(3, 2, "cross")) == 8


class ScriptedEnv:
    """A reward that varies within every group: the joint text's character codes, mod 5."""
    name, num_agents, examples = "scripted", 2, [{}]

    def prompts(self, ex):
        return ["p", "q"]

    def rewards(self, examples, outputs):
        return [sum(map(ord, o[0] + o[1])) % 5 for o in outputs]


def test_train_step_updates_every_agent_and_reports(tok):
    agents = []
    for i in range(2):
        model = magrpo.tiny_model(tok, seed=i)
        agents.append(magrpo.Agent(model, tok, magrpo.make_optimizer(model, 1e-2)))
    before = [agent.model.lm_head.weight.detach().clone() for agent in agents]
    m = magrpo.train_step(agents, ScriptedEnv(), [{}, {}], num_generations=4, max_new_tokens=6, seed=0,
                          micro_batch_size=3)
    for key in ("reward_mean", "reward_std", "zero_adv_groups", "loss_0", "grad_norm_1"):
        assert key in m and math.isfinite(m[key])
    assert m["skipped_0"] == 0 and m["skipped_1"] == 0
    for agent, w in zip(agents, before):
        assert not torch.equal(agent.model.lm_head.weight, w)
    m = magrpo.train_step(agents, ScriptedEnv(), [{}], num_generations=3, max_new_tokens=4, seed=1,
                          joint_mode="cross")
    assert math.isfinite(m["loss_0"]) and len(m["samples"]) == 2


def test_non_finite_loss_skips_the_step(tok):
    model = magrpo.tiny_model(tok)
    agent = magrpo.Agent(model, tok, magrpo.make_optimizer(model, 1e-2))
    r = generate(model, tok, ["a", "b"], num_generations=2, max_new_tokens=4, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match="non-finite"):
        out = magrpo.update_agent(agent, r, torch.tensor([1.0, float("nan"), -1.0, 0.0]))
    assert out["skipped"] == 1
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_master_weights_keep_updates_bf16_would_round_away():
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = magrpo.MasterWeightAdamW([w], lr=1e-4)  # 1 - 1e-4 is not representable in bf16
    for _ in range(50):
        w.grad = torch.ones_like(w)
        opt.step()
    assert opt.master[0].dtype == torch.float32
    assert opt.master[0][0].item() == pytest.approx(1 - 50 * 1e-4, rel=1e-3)
    assert w[0].item() < 1.0  # 0.995 rounds to a bf16 value below one; plain bf16 AdamW stays at 1.0
    plain = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    popt = torch.optim.AdamW([plain], lr=1e-4, weight_decay=0.0)
    for _ in range(50):
        plain.grad = torch.ones_like(plain)
        popt.step()
    assert plain[0].item() == 1.0


def test_tiny_model_saves_and_loads_back(tok, tmp_path):
    model = build(tok, "qwen2")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, tok2 = magrpo.load_agent_model(str(tmp_path / "m"))
    a = generate(model, tok, PROMPTS, max_new_tokens=8, temperature=0)
    b = generate(loaded, tok2, PROMPTS, max_new_tokens=8, temperature=0)
    assert a.texts == b.texts
    with pytest.raises(ValueError, match="not a directory"):
        magrpo.load_agent_model(str(tmp_path / "missing"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generate_on_cuda_matches_cpu(tok):
    model = build(tok, "qwen2")
    cpu = generate(model, tok, PROMPTS, max_new_tokens=16, temperature=0)
    gpu = generate(model.cuda(), tok, PROMPTS, max_new_tokens=16, temperature=0)
    assert gpu.completion_ids.is_cuda
    assert cpu.texts == gpu.texts
