"""Tests of the algorithm in magrpo.py, one function at a time, each against an independent reference:
a plain forward pass with log_softmax, hand-computed Eq. 1, Eq. 2 and multi-turn returns. `pytest -k
NAME` runs a function's tests (completion_logprobs, group_advantages, policy_loss, node_return, ...).
The sampler's are in test_sampler.py. CPU, tiny random models."""
import math

import pytest
import torch

import magrpo
import sampler
import models
from conftest import logprobs_row_by_row, scripted_rollout, update_on
from magrpo import completion_logprobs, group_advantages, node_return, policy_loss
from sampler import generate

PROMPTS = ["def add(a, b):", "Hi", "The quick brown fox jumps", "x"]  # ragged: left padding matters


@pytest.fixture(scope="module")
def tok():
    return models.tiny_tokenizer()


def build(tok, arch, seed=0):
    # A wide init makes logits spread out, so greedy decoding is not one repeated token.
    return models.tiny_model(tok, arch=arch, init_std=0.5, seed=seed).eval()


# -----------------------------------------------------------------------------
# completion_logprobs: against a plain forward pass of each row alone


def reference_logprobs(model, tok, prompt, completion_ids, temperature):
    """log_softmax(logits / T) of each completion token, the row alone, unpadded."""
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1)


TEXTS = ["hello world", "x", "", "a longer completion, with more tokens"]  # EOS alone too


def hand_rollout(model, tok, size=3):
    """Four prompts of different lengths, `size` completions each of different lengths, written by hand
    (no sampler): groups of rows that share a prompt, as generate returns them."""
    return scripted_rollout(magrpo.Agent(model, tok), PROMPTS, size, lambda b, g: TEXTS[(b + g) % 4])


def gradients(model, logprobs, rollout, advantages, loss_type):
    model.zero_grad(set_to_none=True)
    policy_loss(logprobs, rollout.completion_mask, advantages, loss_type).backward()
    return torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])


def relative(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
@pytest.mark.parametrize("loss_type", ["seq_sum", "token_mean", "seq_mean"])
def test_completion_logprobs_equal_the_row_by_row_pass(tok, arch, loss_type):
    """Each group's prompt runs once and its rows share its cache: the log-probs equal each row run
    alone, unpadded (within 1e-5), and so does Eq. 2's gradient (within 1e-4, relative)."""
    model = models.tiny_model(tok, arch=arch, init_std=0.15, seed=4)
    r = hand_rollout(model, tok)
    assert (r.completion_mask == 0).any() and (r.prompt_mask == 0).any(), "want ragged rows"
    advantages = torch.randn(len(r), generator=torch.Generator().manual_seed(0))
    lp = completion_logprobs(model, r, temperature=0.7)
    reference = logprobs_row_by_row(model, r, temperature=0.7)
    assert lp.shape == r.completion_ids.shape and lp.requires_grad
    mask = r.completion_mask.bool()
    assert (lp - reference)[mask].abs().max() < 1e-5
    ours = gradients(model, lp, r, advantages, loss_type)
    assert relative(ours, gradients(model, reference, r, advantages, loss_type)) < 1e-4


def test_completion_logprobs_of_a_model_without_logits_to_keep(tok, monkeypatch):
    """A model whose forward has no logits_to_keep returns every prompt position's logits: the
    log-probs must still read the prompt's last one."""
    model = models.tiny_model(tok, init_std=0.15, seed=4)
    r = hand_rollout(model, tok)
    expected = completion_logprobs(model, r, temperature=0.7)
    accepted = sampler._forward_parameters(type(model)) - {"logits_to_keep"}
    monkeypatch.setattr(sampler, "_forward_parameters", lambda model_class: accepted)
    mask = r.completion_mask.bool()
    assert (completion_logprobs(model, r, temperature=0.7) - expected)[mask].abs().max() < 1e-6


def test_completion_logprobs_of_a_micro_batch_that_cuts_a_group(tok):
    """Rows 2-6 of groups of 3 (parts of two groups, padding trimmed): the same values."""
    model = models.tiny_model(tok, init_std=0.15, seed=4)
    r = hand_rollout(model, tok)
    whole = completion_logprobs(model, r, temperature=0.7)
    part = r.rows(2, 7)
    mask = part.completion_mask.bool()
    assert torch.allclose(completion_logprobs(model, part, temperature=0.7)[mask], whole[2:7, :mask.shape[1]][mask],
                          atol=1e-5)


def test_completion_logprobs_of_lora_agents_on_a_shared_base(tok):
    """Two LoRA agents on one frozen base: each agent's adapter gradient equals the row-by-row pass's."""
    base = models.tiny_model(tok, init_std=0.15, seed=4)
    for seed in (1, 2):
        model = models.add_lora(base, models.LoRAConfig(4), seed=seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)  # a trained adapter: its B is not 0
        r = hand_rollout(model, tok)
        advantages = torch.randn(len(r))
        lp = completion_logprobs(model, r, temperature=1.0)
        reference = logprobs_row_by_row(model, r)
        assert (lp - reference)[r.completion_mask.bool()].abs().max() < 1e-5
        ours = gradients(model, lp, r, advantages, "seq_sum")
        assert ours.numel() > 0 and all(p.grad is None for p in base.parameters())
        assert relative(ours, gradients(model, reference, r, advantages, "seq_sum")) < 1e-4


def test_completion_logprobs_in_bf16(tok):
    """bf16: the shared pass is as close to the fp32 truth as the row-by-row bf16 pass is (within
    bf16's own error), and its gradient within 5% of the row-by-row bf16 gradient."""
    model = models.tiny_model(tok, init_std=0.15, seed=4)
    r = hand_rollout(model, tok)
    mask = r.completion_mask.bool()
    with torch.no_grad():
        truth = logprobs_row_by_row(model, r)
    model = model.to(torch.bfloat16)
    lp = completion_logprobs(model, r)
    reference = logprobs_row_by_row(model, r)
    bf16_error = (reference - truth)[mask].abs().max().item()
    assert (lp - truth)[mask].abs().max().item() <= 1.5 * bf16_error + 1e-3
    advantages = torch.randn(len(r))
    assert relative(gradients(model, lp, r, advantages, "seq_sum"),
                    gradients(model, reference, r, advantages, "seq_sum")) < 0.05


def test_completion_logprobs_never_holds_the_logits_of_every_position(tok):
    """With a large vocabulary the logits are the pass's largest tensors: no tensor of the forward or
    the backward pass holds as much as half of the [rows, tokens, vocab] logits."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import Qwen2Config, Qwen2ForCausalLM
    vocab = 32000
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    rows, n = 4, 200
    rollout = sampler.Rollout(torch.randint(0, vocab, (rows, 8), generator=g), torch.ones(rows, 8, dtype=torch.long),
                              torch.randint(0, vocab, (rows, n), generator=g), torch.ones(rows, n, dtype=torch.long),
                              torch.zeros(rows, n), [], 2)

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out
    with Largest():
        lp = completion_logprobs(model, rollout, temperature=0.7)
        lp.sum().backward()
    assert Largest.numel < rows * n * vocab / 2, f"a tensor of {Largest.numel} elements"
    reference = logprobs_row_by_row(model, rollout, temperature=0.7)
    assert torch.allclose(lp, reference, atol=1e-4), (lp - reference).abs().max()


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the subclass hides which cache keyword it takes
def test_completion_logprobs_refuses_a_model_whose_logits_are_scaled(tok):
    """A model that scales or caps its logits after the output layer (Gemma 2, Cohere) would get wrong
    log-probs from the output layer alone: one clear error instead."""
    model = models.tiny_model(tok, init_std=0.5)
    head = model.lm_head
    model.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=False)
    model.lm_head.weight = head.weight

    class Scaled(type(model)):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.5
            return out
    model.__class__ = Scaled
    with pytest.raises(ValueError, match="not its output layer's"):
        completion_logprobs(model, hand_rollout(model, tok))


def test_micro_batches_hold_whole_groups_where_they_can():
    assert magrpo.micro_batches(12, 4, 8) == [(0, 8), (8, 12)]  # two groups of 4, then one
    assert magrpo.micro_batches(12, 4, 6) == [(0, 4), (4, 8), (8, 12)]  # one whole group each, not 6 rows
    assert magrpo.micro_batches(9, 3, 2) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 9)]  # a group over 2
    assert magrpo.micro_batches(5, 1, 8) == [(0, 5)]


# -----------------------------------------------------------------------------
# Eq. 1, Eq. 2, the multi-turn return


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
        group_advantages([1.0])


def test_group_advantages_none_and_remax_by_hand():
    """none: REINFORCE, A = R; remax: A = R - the group's greedy reward (one baseline per group)."""
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [2.0, 2.0, 2.0, 2.0]])
    assert torch.equal(group_advantages(r, "none"), r)
    remax = group_advantages(r, "remax", baseline=[2.5, 3.0])
    assert torch.equal(remax, torch.tensor([[-1.5, -0.5, 0.5, 3.5], [-1.0, -1.0, -1.0, -1.0]]))
    assert group_advantages([4.0, 0.0], "remax", baseline=4.0).tolist() == [0.0, -4.0]


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


def test_policy_loss_micro_batches_add_up_to_the_batch():
    torch.manual_seed(0)
    lp, adv = torch.randn(6, 5), torch.randn(6)
    mask = (torch.rand(6, 5) > 0.3).long()
    mask[:, 0] = 1
    for loss_type in magrpo.Config.CHOICES["loss_type"]:
        whole = policy_loss(lp, mask, adv, loss_type)
        norm = magrpo.loss_normalizer(mask, loss_type)
        parts = sum(policy_loss(lp[i:i + 2], mask[i:i + 2], adv[i:i + 2], loss_type, norm) for i in range(0, 6, 2))
        assert parts.item() == pytest.approx(whole.item(), abs=1e-6), loss_type


def test_node_return_by_hand():
    assert node_return(2.0, [], 0.9) == 2.0  # a leaf: its reward
    assert node_return(1.0, [2.0, 4.0], 0.9) == pytest.approx(1.0 + 0.9 * 3.0)
    assert node_return(1.0, [2.0, 4.0], 0.0) == 1.0
    assert node_return(1.5, [3.0], 1.0) == pytest.approx(4.5)
    assert node_return(torch.tensor(1.0), [torch.tensor(1.0)], 0.5) == pytest.approx(1.5)


def test_node_return_of_a_solved_node_is_an_absorbing_state():
    """A solved node keeps its reward for the turns it skips: r + gamma r + gamma^2 r ..."""
    assert magrpo.solved_return(4.0, 0, 0.9) == 4.0  # at the last turn: its reward
    assert magrpo.solved_return(4.0, 1, 0.9) == pytest.approx(4.0 + 0.9 * 4.0)
    assert magrpo.solved_return(4.0, 2, 0.5) == pytest.approx(4.0 + 0.5 * 4.0 + 0.25 * 4.0)
    assert magrpo.solved_return(3.0, 2, 0.0) == 3.0


def test_joint_actions_and_credited_returns():
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

# -----------------------------------------------------------------------------
# The multi-turn tree (Sec. 3) on scripted rewards: expand_nodes, episode_returns, episode_advantages


def scripted_turn(rewards, groups_parents, size=2, joint=None, num_agents=2, threshold=4.0):
    """A Turn with the given rewards ([groups][J]) and no model: what the tree functions read; a node
    whose reward reaches `threshold` is solved, as sample_turn marks it."""
    joint = joint or magrpo.joint_actions(num_agents, size)
    groups = [magrpo.Group(0, parent, [], [], 0) for parent in groups_parents]
    flat = [r for row in rewards for r in row]
    solved = [r >= threshold for r in flat]
    return magrpo.Turn(groups, size, [None] * num_agents, joint, [("", "")] * len(flat), flat, solved)


def test_turn_zero_advantage_groups_counts_groups_where_every_agent_learns_nothing():
    """Three groups of 2 rows: group 0 all zero for both agents, group 1 zero for agent 0 only, group
    2 with a signal for both: one group teaches nothing."""
    turn = scripted_turn([[1.0, 1.0], [1.0, 2.0], [0.0, 3.0]], [None, None, None])
    turn.advantages = [torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0, 1.0]),
                       torch.tensor([0.0, 0.0, -0.5, 0.5, -1.0, 1.0])]
    assert turn.zero_advantage_groups() == 1
    turn.advantages[1][2:4] = 0.0  # now group 1 teaches nothing either
    assert turn.zero_advantage_groups() == 2


def test_expand_nodes_best_all_and_termination():
    def turn(threshold):
        return scripted_turn([[1.0, 3.0], [2.0, 2.0]], [None, None], threshold=threshold)
    assert magrpo.expand_nodes(turn(4.0), "best") == [1, 2]  # group 1's tie goes to the first
    assert magrpo.expand_nodes(turn(4.0), "all") == [0, 1, 2, 3]
    assert magrpo.expand_nodes(turn(3.0), "best") == [1, 2]  # best: solved, its group is not
    assert turn(3.0).solved == [False, True, False, False]
    assert magrpo.expand_nodes(turn(3.0), "all") == [0, 2, 3]  # all: a solved node is not revised
    assert magrpo.expand_nodes(turn(2.0), "best") == [1]  # group 1 is all solved: done
    assert magrpo.expand_nodes(turn(2.0), "all") == [0]


def test_turn_names_the_tree():
    """Node n of a turn is group n // J's joint action n % J, and place() is node()'s inverse."""
    t = scripted_turn([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [None, None], size=3)
    assert [t.node(k, j) for k in range(2) for j in range(3)] == list(range(6))
    assert [t.place(n) for n in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    cross = scripted_turn([[0.0] * 4], [None], joint=magrpo.joint_actions(2, 2, "cross"))
    assert cross.node(0, 3) == 3 and cross.place(3) == (0, 3)


def test_episode_advantages_best_compares_each_turns_rewards_by_hand():
    """G = 4, 2 turns, expand best: turn-1 rewards [3, 2, 1, 0]; the best node (0) is revised and its
    children all score 3. With a return across turns the revised node would gain gamma * 3 and
    push the second-best below the mean; each turn's own rewards keep the turn-1 order."""
    t1 = scripted_turn([[3.0, 2.0, 1.0, 0.0]], [None], size=4)
    assert magrpo.expand_nodes(t1, "best") == [0]
    t1.children = {0: 0}
    t2 = scripted_turn([[3.0, 3.0, 3.0, 3.0]], [0], size=4)
    for gamma in (0.9, 0.0):
        cfg = magrpo.Config(num_generations=4, num_turns=2, discount=gamma)  # expand best: the default
        (a1, b1), (a2, b2) = magrpo.episode_advantages([t1, t2], cfg)
        assert a1.tolist() == b1.tolist() == [1.5, 0.5, -0.5, -1.5]
        assert a2.tolist() == b2.tolist() == [0.0] * 4


def test_episode_advantages_all_never_punish_a_solved_answer_by_hand():
    """G = 4, 2 turns, expand all, threshold = max = 4: turn-1 rewards [4, 3, 2, 1]; node 0 is solved,
    every child of nodes 1-3 scores 4, gamma 0.9. Returns [4 + 0.9 * 4, 3 + 3.6, 2 + 3.6, 1 + 3.6]:
    the solved answer covers the same two turns as its revised siblings, and leads them."""
    t1 = scripted_turn([[4.0, 3.0, 2.0, 1.0]], [None], size=4)
    assert magrpo.expand_nodes(t1, "all") == [1, 2, 3] and t1.solved[0]
    t1.children = {1: 0, 2: 1, 3: 2}
    t2 = scripted_turn([[4.0] * 4] * 3, [1, 2, 3], size=4)
    r1, r2 = magrpo.episode_returns([t1, t2], gamma=0.9, num_turns=2)
    assert r1[0].tolist() == pytest.approx([7.6, 6.6, 5.6, 4.6]) and r2.tolist() == [[4.0] * 4] * 3
    cfg = magrpo.Config(num_generations=4, num_turns=2, discount=0.9, expand="all")
    (a1, _), (a2, _) = magrpo.episode_advantages([t1, t2], cfg)
    assert a1.tolist() == pytest.approx([1.5, 0.5, -0.5, -1.5]) and a2.tolist() == [0.0] * 12


def test_episode_returns_of_a_leaf_neither_solved_nor_at_the_last_turn_is_its_reward():
    """An --expand best tree: turn 1 [1, 3], only node 1 revised (into [2, 4]); node 0 is neither solved
    nor at the last turn, and its return is its reward, 1, not a solved answer's 1 + 0.5 * 1."""
    t1 = scripted_turn([[1.0, 3.0]], [None], threshold=5.0)
    assert magrpo.expand_nodes(t1, "best") == [1]
    t1.children = {1: 0}
    t2 = scripted_turn([[2.0, 4.0]], [1], threshold=5.0)
    r1, r2 = magrpo.episode_returns([t1, t2], gamma=0.5, num_turns=2)
    assert r1.tolist() == [[1.0, 3.0 + 0.5 * 3.0]] and r2.tolist() == [[2.0, 4.0]]


def test_episode_advantages_all_with_early_termination_at_turn_two_of_three_by_hand():
    """G = 2, 3 turns, expand all, threshold 4, gamma 0.5. Turn 1 [4, 1]: node 0 solved, node 1
    revised into turn 2's [4, 2]: its node 0 solved, node 1 revised into turn 3's [3, 1].
    Returns: turn 3 [3, 1]; turn 2 [4 + 0.5 * 4, 2 + 0.5 * 2] = [6, 3];
    turn 1 [4 + 0.5 * 4 + 0.25 * 4, 1 + 0.5 * (6 + 3) / 2] = [7, 3.25]."""
    t1 = scripted_turn([[4.0, 1.0]], [None])
    assert magrpo.expand_nodes(t1, "all") == [1]
    t1.children = {1: 0}
    t2 = scripted_turn([[4.0, 2.0]], [1])
    assert magrpo.expand_nodes(t2, "all") == [1]
    t2.children = {1: 0}
    t3 = scripted_turn([[3.0, 1.0]], [1])
    returns = magrpo.episode_returns([t1, t2, t3], gamma=0.5, num_turns=3)
    assert [r.tolist() for r in returns] == [[[7.0, 3.25]], [[6.0, 3.0]], [[3.0, 1.0]]]
    cfg = magrpo.Config(num_generations=2, num_turns=3, discount=0.5, expand="all")
    (a1, _), (a2, _), (a3, _) = magrpo.episode_advantages([t1, t2, t3], cfg)
    assert a1.tolist() == [1.875, -1.875] and a2.tolist() == [1.5, -1.5] and a3.tolist() == [1.0, -1.0]


def random_tree(rng, expand, G=3, T=3, top=4.0):
    """A scripted multi-turn tree: rewards drawn from {0, 1, ..., top}, children by expand_nodes."""
    turns, parents = [], [None]
    for t in range(T):
        turn = scripted_turn([[float(rng.randint(0, int(top))) for _ in range(G)] for _ in parents], parents,
                             size=G, threshold=top)
        turns.append(turn)
        nodes = magrpo.expand_nodes(turn, expand)
        if t == T - 1 or not nodes:
            break
        turn.children = {node: k for k, node in enumerate(nodes)}
        parents = nodes
    return turns


def test_episode_advantages_a_solved_answer_never_trails_a_revised_sibling():
    """On random trees (threshold = max): with `all` a solved node has the highest advantage of its
    group; with `best` every turn's advantages keep the order of that turn's rewards."""
    import random
    rng = random.Random(0)
    for _ in range(200):
        for expand in ("all", "best"):
            turns = random_tree(rng, expand)
            cfg = magrpo.Config(num_generations=3, num_turns=3, expand=expand, discount=0.9)
            for turn, (adv, _) in zip(turns, magrpo.episode_advantages(turns, cfg)):
                for k, (a, r) in enumerate(zip(adv.view(-1, 3), turn.values())):
                    solved = [j for j in range(3) if turn.solved[k * 3 + j]]
                    if expand == "all":
                        assert all(a[j] >= a.max() - 1e-5 for j in solved), (turn.values(), a)
                    else:
                        assert all((a[i] - a[j]) * (r[i] - r[j]) >= 0 for i in range(3) for j in range(3))


def test_episode_advantages_cross_credits_each_completion():
    """cross: a completion's return is the mean over the joint actions it takes part in."""
    t = scripted_turn([[1.0, 2.0, 3.0, 6.0]], [None], joint=magrpo.joint_actions(2, 2, "cross"))
    (a0, a1), = magrpo.episode_advantages([t], magrpo.Config(num_generations=2, joint="cross"))
    assert a0.tolist() == [-1.5, 1.5] and a1.tolist() == [-1.0, 1.0]

# -----------------------------------------------------------------------------
# Config


@pytest.mark.parametrize("field, value, flag", [
    ("num_turns", 0, "--num-turns"), ("discount", 1.5, "--discount"), ("discount", -0.1, "--discount"),
    ("expand", "some", "--expand"), ("feedback", "loud", "--feedback"), ("top_p", 0.0, "--top-p"),
    ("temperature", -1.0, "--temperature"), ("loss_type", "x", "--loss-type"), ("advantage", "max", "--advantage"),
    ("joint", "all", "--joint"), ("top_k", -1, "--top-k"),
])
def test_config_rejects_a_bad_value_naming_its_flag(field, value, flag):
    with pytest.raises(ValueError, match=f"^{flag}: "):
        magrpo.Config(**{field: value})


def test_config_turn_weights_need_one_per_turn():
    assert magrpo.Config(num_turns=2, turn_weights=[1.2, 0.8]).turn_weights == (1.2, 0.8)
    assert magrpo.Config(num_turns=2, turn_weights="1.2, 0.8").turn_weights == (1.2, 0.8)  # as the flag
    for bad in ([1.0], "1.2,x"):
        with pytest.raises(ValueError, match="^--turn-weights: "):
            magrpo.Config(num_turns=2, turn_weights=bad)

# -----------------------------------------------------------------------------
# The update: train_step on given turns (conftest.update_on)


def test_train_step_update_skips_a_non_finite_step(tok):
    model = models.tiny_model(tok)
    agent = magrpo.Agent(model, tok, torch.optim.AdamW(model.parameters(), lr=1e-2))
    r = generate(model, tok, ["a", "b"], num_generations=2, max_new_tokens=4, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match="non-finite"):
        out = update_on(agent, [(r, torch.tensor([1.0, float("nan"), -1.0, 0.0]))], magrpo.Config())
    assert out["skipped"] == 1
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_train_step_logs_the_drift_between_the_samplers_and_the_trainers_logprobs(tok):
    """logprob_drift_i: about 0 when the trainer sees the policy that sampled; large when it does not
    (here, log-probs the sampler never computed), the bug class the metric is there to catch."""
    model = models.tiny_model(tok, init_std=0.3)
    agent = magrpo.Agent(model, tok, torch.optim.SGD(model.parameters(), lr=0.0))
    r = generate(model, tok, ["ab", "c"], num_generations=2, max_new_tokens=6, temperature=0.7, seed=1)
    cfg = magrpo.Config(temperature=0.7)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    assert update_on(agent, [(r, advantages)], cfg)["logprob_drift"] < 1e-5
    r.logprobs = torch.zeros_like(r.logprobs)
    assert update_on(agent, [(r, advantages)], cfg)["logprob_drift"] > 0.1
    assert update_on(agent, [(r, torch.zeros(4))], cfg)["logprob_drift"] is None  # no row trained


def test_train_step_update_steps_on_the_weighted_eq2_loss_of_every_turn(tok):
    """Two turns with weights and micro-batches: with SGD (lr 1) the step is minus the gradient of
    sum_t w_t * policy_loss(turn t), written out here on the whole batch."""
    torch.manual_seed(0)
    model = models.tiny_model(tok, init_std=0.3)
    ref = models.tiny_model(tok, init_std=0.3)
    before = [p.detach().clone() for p in model.parameters()]
    r1 = generate(model, tok, ["ab", "c"], num_generations=2, max_new_tokens=5, seed=1)
    r2 = generate(model, tok, ["abc d"], num_generations=3, max_new_tokens=4, seed=2)
    a1, a2 = torch.tensor([0.5, -0.5, 1.0, -1.0]), torch.tensor([2.0, 0.0, -2.0])
    cfg = magrpo.Config(micro_batch_size=2, num_turns=2, turn_weights=(1.2, 0.8), loss_type="token_mean")
    agent = magrpo.Agent(model, tok, torch.optim.SGD(model.parameters(), lr=1.0))
    out = update_on(agent, [(r1, a1), (r2, a2)], cfg)
    loss = sum(w * policy_loss(completion_logprobs(ref, r, 1.0), r.completion_mask, a, "token_mean")
               for r, a, w in ((r1, a1, 1.2), (r2, a2, 0.8)))
    loss.backward()
    assert out["loss"] == pytest.approx(loss.item(), abs=1e-5) and out["skipped"] == 0
    for p, b, q in zip(model.parameters(), before, ref.parameters()):
        assert torch.allclose(b - p, q.grad, atol=1e-5)
    assert sum(q.grad.abs().sum() for q in ref.parameters()) > 0


def test_tiny_model_saves_and_loads_back(tok, tmp_path):
    model = build(tok, "qwen2")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, tok2 = models.load_model(str(tmp_path / "m"))
    a = generate(model, tok, PROMPTS, max_new_tokens=8, temperature=0)
    b = generate(loaded, tok2, PROMPTS, max_new_tokens=8, temperature=0)
    assert a.texts == b.texts
    with pytest.raises(ValueError, match="not a directory"):
        models.load_model(str(tmp_path / "missing"))


def test_sampling_and_logprobs_print_no_deprecation_warning():
    """transformers 5 names the KV cache `cache`: the old name warns on stderr (once per process, so
    a fresh process), as would any other deprecated use in the sampler or the log-prob pass."""
    import subprocess
    import sys
    code = """if True:
        import magrpo, models, sampler
        tok = models.tiny_tokenizer()
        for arch in ("qwen2", "llama", "gpt2"):
            model = models.tiny_model(tok, arch=arch)
            rollout = sampler.generate(model, tok, ["ab", "c"], 2, 4, seed=0)
            magrpo.completion_logprobs(model, rollout).sum().backward()
        """
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, cwd=root,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "deprecat" not in p.stderr.lower(), p.stderr
