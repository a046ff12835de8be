"""Tests of a team's episode (Sec. 2 steps 1-6, Sec. 3): rollout_team and magrpo.train_step with
tiny models on the demo env: what each agent sees at each turn, the batching of the sampler, and
T = 1 against a single-turn MAGRPO step written out from the primitives. The completions are
scripted (conftest.scripted_generate), real tokens of random words: what is tested is what becomes of
them, and these tests do not wait for the sampler (a course may blank it; test_sampler.py tests it).
CPU, a few seconds."""
import pytest
import torch

import envs
import eval as evaluation
import magrpo
import runs
import sampler
import models
import train
from conftest import scripted_generate

pytestmark = pytest.mark.usefixtures("scripted_sampling")


def train_step(agents, env, examples, cfg, seeds):
    """One step as train.py takes it: magrpo.train_step, and the reward metrics train.py logs."""
    turns, update = magrpo.train_step(agents, env, examples, cfg, seeds)
    rewards = evaluation.episode_metrics(evaluation.episode_summary(turns), cfg.num_turns)
    return {**rewards, **update, "samples": turns[-1].outputs[0]}


def team(tok, lr=1e-2, n=2, sgd=False):
    """n tiny agents; with sgd, plain SGD (AdamW's first step is sign-like: exact comparisons of
    weights after it are at the mercy of gradients near 0)."""
    agents = []
    for i in range(n):
        model = models.tiny_model(tok, seed=i, init_std=0.3)
        opt = torch.optim.SGD(model.parameters(), lr=lr) if sgd else models.make_optimizer(model, lr)
        agents.append(models.Agent(model, tok, opt))
    return agents


def test_rollout_team_turn_two_prompts_hold_own_history_and_feedback(tok):
    env = envs.DemoEnv()
    cfg = magrpo.Config(num_generations=3, max_new_tokens=12, num_turns=2, expand="all", termination_threshold=99)
    examples = env.examples[:2]
    turns = magrpo.rollout_team(team(tok), env, examples, cfg, seeds=[5, 6])
    t1, t2 = turns
    assert len(t1.outputs) == 6 and len(t2.groups) == 6 and len(t2.outputs) == 18
    for node, k in t1.children.items():
        group = t2.groups[k]
        ex = examples[group.example]
        assert group.parent == node and t1.groups[node // 3].example == group.example
        feedback = env.feedback(ex, t1.outputs[node], reward=t1.rewards[node])
        for i in range(2):
            own, other = t1.outputs[node][i].strip(), t1.outputs[node][1 - i].strip()
            prompt = group.prompts[i]
            assert prompt.startswith(env.prompts(ex)[i])
            assert own in prompt and feedback[i].strip() in prompt
            assert group.histories[i] == [(t1.outputs[node][i], feedback[i])]
            if len(other) >= 4 and other not in feedback[i]:
                assert other not in prompt, "an agent must not see its partner's answer"
            assert env.prompts(ex)[1 - i] not in prompt


def test_rollout_team_one_generate_call_per_agent_per_turn(tok, monkeypatch):
    calls = []
    real = sampler.generate

    def counting(model, tokenizer, prompts, *args, **kwargs):
        calls.append(len(prompts))
        return real(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(magrpo, "generate", counting)
    env = envs.DemoEnv()
    cfg = magrpo.Config(num_generations=2, max_new_tokens=6, num_turns=3, expand="all", termination_threshold=99)
    turns = magrpo.rollout_team(team(tok), env, env.examples[:3], cfg, seeds=[1, 2, 3])
    assert [len(t.groups) for t in turns] == [3, 6, 12]
    assert calls == [3, 3, 6, 6, 12, 12]  # all nodes of a turn in one call per agent


def test_rollout_team_best_expands_one_node_per_group_and_stops_when_solved(tok):
    env = envs.DemoEnv()
    cfg = magrpo.Config(num_generations=4, max_new_tokens=8, num_turns=2, termination_threshold=99)
    t1, t2 = magrpo.rollout_team(team(tok), env, env.examples[:2], cfg, seeds=[1, 2])
    values = t1.values()
    assert sorted(t1.children) == [k * 4 + int(values[k].argmax()) for k in range(2)]
    solved = magrpo.dataclasses.replace(cfg, termination_threshold=-1.0)  # everything counts as solved
    turns = magrpo.rollout_team(team(tok), env, env.examples[:2], solved, seeds=[1, 2])
    assert len(turns) == 1 and all(turns[0].solved)
    m = evaluation.episode_metrics(evaluation.episode_summary(turns), 2)
    assert m["terminated_turn1"] == 1.0 and m["reward_mean_turn2"] is None


def single_turn_reference(agents, env, examples, G, T, seeds):
    """One single-turn MAGRPO step from the primitives: generate, shared reward, Eq. 1, Eq. 2, AdamW."""
    rollouts = [sampler.generate(a.model, a.tokenizer, [env.prompts(ex)[i] for ex in examples], G, 8, T,
                                seed=[sampler.mix_seed(sampler.mix_seed(s, 1), i) for s in seeds])
                for i, a in enumerate(agents)]
    rewards = torch.tensor([[float(env.reward(ex, (rollouts[0].texts[b][g], rollouts[1].texts[b][g])))
                             for g in range(G)] for b, ex in enumerate(examples)])
    adv = (rewards - rewards.mean(-1, keepdim=True)).view(-1)
    for a, r in zip(agents, rollouts):
        a.model.zero_grad()
        lp = magrpo.completion_logprobs(a.model, r, T)
        (-(adv * (lp * r.completion_mask).sum(-1)).sum() / len(adv)).backward()
        a.optimizer.step()
    return rewards


def test_train_step_with_one_turn_is_single_turn_magrpo(tok):
    env = envs.DemoEnv()
    examples, seeds = env.examples[:2], [3, 4]
    ours, ref = team(tok, lr=0.1, sgd=True), team(tok, lr=0.1, sgd=True)
    cfg = magrpo.Config(num_generations=4, max_new_tokens=8, temperature=0.9, micro_batch_size=3)
    m = train_step(ours, env, examples, cfg, seeds)
    rewards = single_turn_reference(ref, env, examples, 4, 0.9, seeds)
    assert m["reward_mean"] == pytest.approx(rewards.mean().item())
    assert m["reward_mean_turn1"] == m["reward_mean"] and m["reward_max"] == pytest.approx(rewards.max().item())
    assert m["zero_adv_groups"] == 0 and m["loss_0"] != 0.0 and m["grad_norm_1"] > 0
    for a, b in zip(ours, ref):
        for p, q in zip(a.model.parameters(), b.model.parameters()):
            assert torch.allclose(p, q, atol=1e-5)


@pytest.mark.parametrize("options", [dict(), dict(advantage="rloo", loss_type="token_mean", micro_batch_size=3),
                                     dict(advantage="std", loss_type="seq_mean", max_grad_norm=0.05),
                                     dict(scale_rewards="batch", loss_type="token_budget", turn_weights=(1.0,)),
                                     dict(top_p=0.8), dict(top_k=20, logprob="full")])
def test_single_turn_step_is_the_trees_step_with_one_turn_bit_for_bit(tok, options):
    """Sec. 2 written straight (single_turn_step) and Sec. 3's tree (train_step) with one turn: the same
    completions, rewards, advantages, metrics and weights, to the bit, and the same Turn for the logs."""
    env = envs.DemoEnv()
    examples, seeds = env.examples[:3], [7, 8, 9]
    cfg = runs.checked_config(num_generations=4, max_new_tokens=8, temperature=0.9, **options)
    assert not cfg.on_the_tree()  # train.py runs these settings with single_turn_step
    straight, tree = team(tok), team(tok)
    rollouts, rewards, advantages, metrics = magrpo.single_turn_step(straight, env, examples, cfg, seeds)
    turns, tree_metrics = magrpo.train_step(tree, env, examples, cfg, seeds)
    turn = magrpo.turn_of_step(env, examples, cfg, seeds, rollouts, rewards, advantages)
    assert len(turns) == 1 and [r.texts for r in rollouts] == [r.texts for r in turns[0].rollouts]
    assert turn.outputs == turns[0].outputs and turn.solved == turns[0].solved
    assert [float(r) for r in rewards] == [float(r) for r in turns[0].rewards]
    assert all(torch.equal(a, b) for a, b in zip(turn.advantages, turns[0].advantages))
    assert metrics == tree_metrics and metrics["grad_norm_0"] > 0
    assert evaluation.episode_summary([turn]) == evaluation.episode_summary(turns)
    assert train.completion_rows(0, [0, 1, 2], [turn]) == train.completion_rows(0, [0, 1, 2], turns)
    for a, b in zip(straight, tree):
        assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


def test_config_on_the_tree_names_the_settings_single_turn_step_leaves_to_train_step():
    assert not magrpo.Config().on_the_tree()
    for options in (dict(num_turns=2), dict(joint="cross"), dict(advantage="remax"), dict(advantage="critic"),
                    dict(turn_weights=(0.5,)), dict(mask_truncated_completions=True)):
        assert magrpo.Config(**options).on_the_tree(), options


def test_single_turn_step_refuses_the_settings_on_the_tree(tok):
    """Bug: called directly (as README invites), it ran settings it does not implement (a truncation mask
    ignored, remax dying in torch.as_tensor(None), a critic raising): now one line, before sampling."""
    env = envs.DemoEnv()
    for options in (dict(num_turns=2), dict(joint="cross"), dict(advantage="remax"), dict(advantage="critic"),
                    dict(turn_weights=(0.5,)), dict(mask_truncated_completions=True)):
        cfg = magrpo.Config(num_generations=2, max_new_tokens=6, **options)
        with pytest.raises(ValueError, match="^single_turn_step runs Sec. 2 alone: .* are train_step's$"):
            magrpo.single_turn_step(team(tok), env, env.examples[:1], cfg, [1])


def test_single_turn_step_zeroes_stale_gradients(tok):
    """Bug: gradients left by an interrupted call (an OOM, a ^C) were added to the next step's."""
    env = envs.DemoEnv()
    cfg = magrpo.Config(num_generations=4, max_new_tokens=8, temperature=0.9)
    clean, stale = team(tok, lr=0.1, sgd=True), team(tok, lr=0.1, sgd=True)
    for agent in stale:
        for p in agent.model.parameters():
            p.grad = torch.full_like(p, 5.0)  # what a backward pass cut short leaves behind
    magrpo.single_turn_step(clean, env, env.examples[:2], cfg, [3, 4])
    magrpo.single_turn_step(stale, env, env.examples[:2], cfg, [3, 4])
    for a, b in zip(clean, stale):
        assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


def test_solved_threshold_an_env_without_max_reward_is_never_solved(tok):
    """Bug: Env.max_reward is None by default, and None - 1e-9 raised at every step of a new env."""
    class Unbounded(envs.DemoEnv):
        max_reward = None  # as envs.Env's: a new env that states none
    env, examples, seeds = Unbounded(), Unbounded().examples[:2], [1, 2]
    assert magrpo.solved_threshold(env, magrpo.Config()) == float("inf")
    cfg = magrpo.Config(num_generations=2, max_new_tokens=6)
    rollouts, rewards, advantages, _ = magrpo.single_turn_step(team(tok), env, examples, cfg, seeds)
    turn = magrpo.turn_of_step(env, examples, cfg, seeds, rollouts, rewards, advantages)
    assert turn.solved == [False] * 4
    two = magrpo.Config(num_generations=2, max_new_tokens=6, num_turns=2, expand="all")
    turns, _ = magrpo.train_step(team(tok), env, examples, two, seeds)
    assert len(turns) == 2 and not any(turns[0].solved) and len(turns[1].groups) == 4


def test_train_step_with_trls_settings_is_trls_single_turn_step(tok, monkeypatch):
    """--advantage std, --loss-type dr_grpo, --mask-truncated-completions and --max-grad-norm through
    a whole step, against the step written out from TRL's formulas: A = (R - mean) / (std + 1e-4);
    the loss sum over rows x max_new_tokens; a row whose last token is not EOS masked; the gradient
    times max / (norm + 1e-6) where its norm is above max."""
    def generate(*args, **kwargs):  # each group's completion 0 is cut before its EOS
        rollout = scripted_generate(*args, **kwargs)
        for row in range(0, len(rollout), rollout.num_generations):
            rollout.completion_ids[row, int(rollout.completion_mask[row].sum()) - 1] = tok.eos_token_id + 1
        return rollout
    monkeypatch.setattr(magrpo, "generate", generate)
    env = envs.DemoEnv()
    examples, seeds = env.examples[:2], [3, 4]
    ours, ref = team(tok, lr=0.1, sgd=True), team(tok, lr=0.1, sgd=True)
    cfg = runs.checked_config(num_generations=4, max_new_tokens=8, temperature=0.9, micro_batch_size=3,
                              advantage="std", loss_type="dr_grpo", mask_truncated_completions=True,
                              max_grad_norm=0.3)
    m = train_step(ours, env, examples, cfg, seeds)
    rollouts = [generate(a.model, a.tokenizer, [env.prompts(ex)[i] for ex in examples], 4, 8, 0.9,
                         seed=[sampler.mix_seed(sampler.mix_seed(s, 1), i) for s in seeds])
                for i, a in enumerate(ref)]
    rewards = torch.tensor([[float(env.reward(ex, (rollouts[0].texts[b][g], rollouts[1].texts[b][g])))
                             for g in range(4)] for b, ex in enumerate(examples)])
    adv = ((rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-4)).view(-1)
    clipped = 0
    for a, r in zip(ref, rollouts):
        ended = torch.tensor([row[int(n) - 1] == tok.eos_token_id for row, n in
                              zip(r.completion_ids.tolist(), r.completion_mask.sum(-1))])
        lp = magrpo.completion_logprobs(a.model, r, 0.9)
        (-(adv[:, None] * lp * r.completion_mask * ended[:, None]).sum() / (len(adv) * 8)).backward()
        norm = sum(float(p.grad.square().sum()) for p in a.model.parameters() if p.grad is not None) ** 0.5
        for p in a.model.parameters():
            if p.grad is not None and norm > 0.3:
                p.grad.mul_(0.3 / (norm + 1e-6))
        clipped += norm > 0.3
        a.optimizer.step()
    assert clipped and m["grad_norm_0"] > 0
    for a, b in zip(ours, ref):
        for p, q in zip(a.model.parameters(), b.model.parameters()):
            assert torch.allclose(p, q, atol=1e-5)


def test_train_step_two_turns_updates_both_agents_on_every_turn(tok):
    env = envs.DemoEnv()
    agents = team(tok)
    before = [[p.detach().clone() for p in a.model.parameters()] for a in agents]
    cfg = magrpo.Config(num_generations=3, max_new_tokens=8, num_turns=2, termination_threshold=99,
                        turn_weights=(0.0, 1.0))  # only turn 2's loss: it alone must move the weights
    m = train_step(agents, env, env.examples[:2], cfg, seeds=[1, 2])
    assert m["reward_mean_turn2"] is not None and m["improvement_turn2"] is not None
    assert m["grad_norm_0"] > 0 and m["grad_norm_1"] > 0
    for a, b in zip(agents, before):
        assert any(not torch.equal(p, q) for p, q in zip(a.model.parameters(), b))
    for key in ("reward_max_turn2", "terminated_turn1", "level_ratio_turn2", "level_variety"):
        assert key in m


def test_train_step_with_cross_joint_actions(tok):
    env = envs.DemoEnv()
    cfg = magrpo.Config(num_generations=3, max_new_tokens=6, joint="cross")
    m = train_step(team(tok), env, env.examples[:1], cfg, seeds=[0])
    assert m["grad_norm_0"] > 0 and len(m["samples"]) == 2


def test_rollout_team_remax_baseline_is_the_greedy_joint_answers_reward(tok):
    """--advantage remax: each group's baseline is the reward of the joint answer that the agents write
    greedily, each from its own prompt; Eq. 1 then subtracts it (at turn 1; later turns: the mean)."""
    class Scripted(envs.DemoEnv):  # a reward that tells answers apart: their lengths
        def reward(self, example, outputs):
            return float(len(outputs[0]) + 2 * len(outputs[1]))
    env, agents = Scripted(), team(tok)
    cfg = magrpo.Config(num_generations=3, max_new_tokens=6, advantage="remax", num_turns=2, expand="all",
                        termination_threshold=99, feedback="plain")
    t1, t2 = magrpo.rollout_team(agents, env, env.examples[:2], cfg, seeds=[3, 4])
    for k, ex in enumerate(env.examples[:2]):
        greedy = [sampler.generate(a.model, tok, [env.prompts(ex)[i]], 1, 6, temperature=0).texts[0][0]
                  for i, a in enumerate(agents)]
        assert t1.baseline[k] == env.reward(ex, tuple(greedy))
    assert t2.baseline is None
    (a1, _), (a2, _) = magrpo.episode_advantages([t1, t2], cfg)
    returns = magrpo.episode_returns([t1, t2], cfg.discount, 2)
    assert torch.allclose(a1.view(2, 3), returns[0] - torch.tensor(t1.baseline)[:, None])
    assert torch.allclose(a2.view(6, 3), returns[1] - returns[1].mean(-1, keepdim=True))


class Unjudged(envs.DemoEnv):
    """The demo, but every joint answer whose headline holds no "a" gets no verdict (its scoring raises)."""
    def rewards(self, examples, outputs):
        raise RuntimeError("batch scoring failed")  # score_joint falls back to one by one

    def reward(self, example, outputs):
        if "a" not in outputs[0]:
            raise OSError("the scorer's disk is gone")
        return super().reward(example, outputs)


def test_rollout_team_feedback_on_nodes_whose_scoring_raised(tok):
    """A joint answer whose reward raised costs only itself: its node gets feedback saying it could not
    be scored, is revised, and the episode goes on (before: AttributeError on the ScoreError)."""
    env = Unjudged()
    cfg = magrpo.Config(num_generations=4, max_new_tokens=6, num_turns=2, expand="all", termination_threshold=99)
    t1, t2 = magrpo.rollout_team(team(tok), env, env.examples[:2], cfg, seeds=[1, 2])
    bad = [n for n, r in enumerate(t1.rewards) if isinstance(r, magrpo.ScoreError)]
    assert bad and len(t2.groups) == 8
    for n in bad:
        assert "could not be scored (OSError: the scorer's disk is gone)" in t2.groups[t1.children[n]].prompts[0]
    assert evaluation.episode_metrics(evaluation.episode_summary([t1, t2]), 2)["score_errors"] >= len(bad)


@pytest.mark.parametrize("step", ["single_turn_step", "train_step"])
def test_an_answer_without_a_verdict_gets_no_gradient_and_no_part_in_the_baseline(tok, step):
    """Bug: a joint answer nobody judged (a ScoreError, a sandbox failure) entered Eq. 1 as a 0 (a
    failure): its completions were pushed away from. Its advantage is 0, its group's baseline is the mean
    of the others, and metrics count it; the weights are those of the step on the judged answers alone."""
    env, examples, seeds = Unjudged(), Unjudged().examples[:3], [5, 6, 7]
    cfg = magrpo.Config(num_generations=4, max_new_tokens=8, temperature=0.9)
    agents = team(tok, lr=0.1, sgd=True)
    if step == "train_step":
        turns, metrics = magrpo.train_step(agents, env, examples, cfg, seeds)
        rewards, advantages = turns[0].rewards, turns[0].advantages[0]
    else:
        rollouts, rewards, advantages, metrics = magrpo.single_turn_step(agents, env, examples, cfg, seeds)
        turns = [magrpo.turn_of_step(env, examples, cfg, seeds, rollouts, rewards, advantages)]
    values = torch.tensor([float(r) for r in rewards]).view(3, 4)
    judged = ~values.isnan()
    assert 0 < int((~judged).sum()) == metrics["no_verdict"], "the case must hold answers without a verdict"
    want = torch.zeros(3, 4)
    for b in range(3):
        if judged[b].sum() >= 2:  # A group of fewer than two verdicts teaches nothing.
            want[b, judged[b]] = values[b, judged[b]] - values[b, judged[b]].mean()
    assert torch.allclose(advantages.view(3, 4), want, atol=1e-6)
    assert (advantages.view(3, 4)[~judged] == 0).all()
    # The same step where the unjudged rows' gradient is given by hand as 0: the same weights.
    reference = team(tok, lr=0.1, sgd=True)
    rollouts = [sampler.generate(a.model, a.tokenizer, [env.prompts(ex)[i] for ex in examples], 4, 8, 0.9,
                                 seed=[sampler.mix_seed(sampler.mix_seed(s, 1), i) for s in seeds])
                for i, a in enumerate(reference)]
    for a, r in zip(reference, rollouts):
        a.model.zero_grad()
        lp = magrpo.completion_logprobs(a.model, r, 0.9)
        (-(want.view(-1) * (lp * r.completion_mask).sum(-1)).sum() / 12).backward()
        a.optimizer.step()
    for a, b in zip(agents, reference):
        assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(a.model.parameters(), b.model.parameters()))
    row = evaluation.episode_metrics(evaluation.episode_summary(turns), 1)
    assert row["score_errors"] == metrics["no_verdict"]
    assert row["reward_mean"] == pytest.approx(float(values[judged].mean()))


def test_team_feedback_expert_reviews_each_agents_part(tok, monkeypatch):
    """--feedback expert: one review per agent per node, all in one generate call, each agent
    getting the review of its own part."""
    env = envs.DemoEnv()
    seen = []

    def fake_generate(model, tokenizer, prompts, *args, **kwargs):
        seen.append(list(prompts))
        return sampler.Rollout(*[None] * 5, [[f"review {k}"] for k in range(len(prompts))], 1)
    monkeypatch.setattr(magrpo, "generate", fake_generate)
    expert = models.Agent(None, tok)
    turn = magrpo.Turn([magrpo.Group(0, None, [], [[], []], 0)], 2, [None, None], [(0, 0), (1, 1)],
                       [("abc", "nop"), ("ab", "no")], [1.0, 2.0], [False, False])
    cfg = magrpo.Config(num_generations=2, num_turns=2, feedback="expert")
    notes = magrpo.team_feedback(env, env.examples[:1], turn, [0, 1], cfg, expert)
    assert len(seen) == 1 and len(seen[0]) == 4  # 2 nodes x 2 agents, one call
    assert [p.endswith(f"the [{part}] part should change.\nReview:\n") for p, part in
            zip(seen[0], ["headline", "body"] * 2)] == [True] * 4
    assert "[headline]\nab\n" in seen[0][2] and "[body]\nno\n" in seen[0][3]  # node 1's answer
    assert [[n.split("\n")[1] for n in node] for node in notes] == [["review 0", "review 1"], ["review 2", "review 3"]]


@pytest.mark.parametrize("micro_batch_size", [4, 1])  # whole groups of 2; each group split in parts
def test_train_step_with_shared_prompts_equals_the_row_by_row_pass(tok, monkeypatch, micro_batch_size):
    """Two turns (every turn-2 prompt holds a turn-1 answer and its feedback) and cross joint actions:
    a step whose log-prob pass shares each group's prompt moves the weights as one whose pass runs
    every row alone (the reference), with plain SGD so that the comparison is exact."""
    import conftest
    if not hasattr(conftest, "logprobs_row_by_row"):
        pytest.skip("a course copy holds no row-by-row pass (it would be completion_logprobs' answer); "
                    "completion_logprobs' own tests compare its values and gradient with recorded ones")
    logprobs_row_by_row = conftest.logprobs_row_by_row
    env = envs.DemoEnv()
    cfg = magrpo.Config(num_generations=2, max_new_tokens=5, num_turns=2, expand="all", joint="cross",
                        termination_threshold=99, micro_batch_size=micro_batch_size)
    ours, ref = team(tok, lr=0.1, sgd=True), team(tok, lr=0.1, sgd=True)
    turns, metrics = magrpo.train_step(ours, env, env.examples[:2], cfg, seeds=[1, 2])
    monkeypatch.setattr(magrpo, "completion_logprobs", logprobs_row_by_row)
    ref_turns, ref_metrics = magrpo.train_step(ref, env, env.examples[:2], cfg, seeds=[1, 2])
    assert [t.outputs for t in turns] == [t.outputs for t in ref_turns] and len(turns) == 2
    for i in range(2):
        assert metrics[f"loss_{i}"] == pytest.approx(ref_metrics[f"loss_{i}"], rel=1e-4, abs=1e-6)
        assert metrics[f"grad_norm_{i}"] == pytest.approx(ref_metrics[f"grad_norm_{i}"], rel=1e-4)
    for a, b in zip(ours, ref):
        for p, q in zip(a.model.parameters(), b.model.parameters()):
            assert torch.allclose(p, q, atol=1e-6)
    assert metrics["grad_norm_0"] > 0
