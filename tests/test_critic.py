"""Tests of --advantage critic (critic.py, magrpo.critic_advantages): A = R - V(s) with values given, the
heads' regression, what each critic sees, and one step of the tree with a critic. Tiny models, CPU."""
import copy

import pytest
import torch

import critic
import envs
import magrpo
import models
import runs


def team(tok, n=2):
    return [models.Agent(models.tiny_model(tok, seed=i, init_std=0.3), tok) for i in range(n)]


def test_critic_advantages_is_the_return_minus_the_given_value():
    returns = torch.tensor([[1.0, 2.0, 0.5], [0.0, 3.0, 1.0]])
    values = torch.tensor([0.25, -1.0])
    expected = torch.tensor([[0.75, 1.75, 0.25], [1.0, 4.0, 2.0]])
    assert torch.equal(magrpo.critic_advantages(returns, values), expected)
    assert magrpo.critic_advantages([[2.0]], [0.5]).tolist() == [[1.5]]  # a group of one has one too


@pytest.mark.parametrize("mode", ["central", "per-agent"])
def test_critic_fit_on_a_fixed_batch_lowers_its_loss(tok, mode):
    """Returns that depend on the state: repeated steps on the same batch fit them, and the values the
    advantages take are the heads' predictions (before the step that fit reports)."""
    team_critic = critic.Critic(team(tok), mode, learning_rate=1e-2)
    states = [[f"Topic: {t}. Headline:\n", f"Topic: {t}. Body:\n"] for t in ("cats", "rain", "tea", "ships")]
    returns = torch.tensor([[0.0, 0.2], [1.0, 1.2], [2.0, 1.8], [3.0, 3.0]])
    features = team_critic.features(states)
    first = team_critic.fit(features, returns)
    assert first["critic_loss"] == pytest.approx(float((returns ** 2).mean()))  # the heads start at 0
    for _ in range(200):
        last = team_critic.fit(features, returns)
    assert last["critic_loss"] < 0.1 * first["critic_loss"] and last["critic_explained_variance"] > 0.8
    values = team_critic.values(features)
    assert len(values) == 2 and values[0].shape == (4,)
    residual = returns - values[0][:, None]
    assert 1 - residual.var(unbiased=False) / returns.var(unbiased=False) > 0.8


def test_critic_per_agent_value_is_unchanged_when_a_partners_prompt_changes(tok):
    states = [["Topic: cats. Headline:\n", "Topic: cats. Body:\n"]]
    changed = [["Topic: cats. Headline:\n", "Topic: snow and more. Body:\n"]]
    per_agent, central = critic.Critic(team(tok), "per-agent"), critic.Critic(team(tok), "central")
    returns = torch.tensor([[1.0, 2.0]])
    for c in (per_agent, central):  # a step away from 0, so that the heads read their features
        c.fit(c.features(states + changed), torch.cat([returns, returns + 1]))
    before, after = (per_agent.values(per_agent.features(s)) for s in (states, changed))
    assert torch.equal(before[0], after[0])  # agent 0's V_0 reads only agent 0's prompt
    assert not torch.equal(before[1], after[1])
    shared_before, shared_after = (central.values(central.features(s)) for s in (states, changed))
    assert torch.equal(shared_before[0], shared_before[1])  # one V(s) for every agent
    assert not torch.equal(shared_before[0], shared_after[0])  # the joint state: every prompt counts


def test_critic_features_read_the_agents_as_they_began_frozen(tok):
    """The critic reads a frozen copy of each agent as it began (a LoRA agent: the shared base, its
    adapters off), so a policy step moves no feature; `start` gives those of a resumed run."""
    states = [[f"Topic: {t}. Headline:\n", f"Topic: {t}. Body:\n"] for t in ("cats", "tea")]
    agents = team(tok)
    team_critic = critic.Critic(agents, "per-agent")
    before = team_critic.features(states)
    with torch.no_grad():
        for p in agents[0].model.parameters():
            p.add_(0.1)  # a policy step, as large as you like
    after = team_critic.features(states)
    assert all(torch.equal(x, y) for x, y in zip(before, after))
    moved = critic.Critic(agents, "per-agent").features(states)[0]  # a critic begun now reads the moved agent
    assert not torch.equal(moved, before[0])
    resumed = critic.Critic(agents, "per-agent", start=team(tok)).features(states)  # a resumed run's start
    assert all(torch.equal(x, y) for x, y in zip(resumed, before))
    base = models.tiny_model(tok, seed=7, init_std=0.3)
    plain = critic.Critic([models.Agent(base, tok)]).features([s[:1] for s in states])[0]
    adapted = models.Agent(models.add_lora(base, models.LoRAConfig(4), seed=1), tok)
    with torch.no_grad():
        for name, p in adapted.model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # an adapter that has learnt: the agent is no longer its base
    lora_critic = critic.Critic([adapted])
    assert lora_critic.readers[0] is adapted.model  # no copy of the base
    assert torch.equal(lora_critic.features([s[:1] for s in states])[0], plain)
    ids = tok("Topic: cats.", return_tensors="pt")["input_ids"]
    assert not torch.equal(adapted.model(ids).logits, base(ids).logits)  # the adapters are back on after


def test_critic_fit_takes_its_steps_on_the_latest_replay_steps(tok, monkeypatch):
    """Each fit adds its step's states to the replay, keeps the latest REPLAY_STEPS steps', and takes
    FIT_STEPS Adam steps on their mean squared error (checked against Adam on the rows written out)."""
    monkeypatch.setattr(critic, "REPLAY_STEPS", 2)
    monkeypatch.setattr(critic, "FIT_STEPS", 3)
    team_critic = critic.Critic(team(tok), "central", learning_rate=1e-2)
    states = [[f"Topic: {t}. Headline:\n", f"Topic: {t}. Body:\n"] for t in ("cats", "rain", "tea")]
    features = [team_critic.features([s]) for s in states]
    returns = [torch.tensor([[float(k), k + 0.5]]) for k in range(3)]
    team_critic.fit(features[0], returns[0])
    reference = copy.deepcopy(team_critic)  # its heads and their Adam, stepped by hand below
    heads, adam = reference.heads, reference.optimizer
    team_critic.fit(features[1], returns[1])
    team_critic.fit(features[2], returns[2])
    assert [float(r[0, 0]) for _, r in team_critic.replay] == [1.0, 2.0]  # the latest 2 steps'
    for k in (1, 2):  # the reference: Adam on the mean squared error of the replay's rows
        x = torch.cat([torch.cat(features[j], dim=-1) for j in range(max(0, k - 1), k + 1)])
        y = torch.cat(returns[max(0, k - 1):k + 1])
        for _ in range(3):
            adam.zero_grad()
            ((y - heads[0](x)) ** 2).mean().backward()
            adam.step()
    fitted = team_critic.heads.parameters()
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(heads.parameters(), fitted))


def test_critic_rejects_an_unknown_mode(tok):
    with pytest.raises(ValueError, match="--critic"):
        critic.Critic(team(tok), "shared")


@pytest.mark.usefixtures("scripted_sampling")
@pytest.mark.parametrize("num_generations", [1, 3])
def test_train_step_with_a_critic_subtracts_the_values_from_before_its_fit(tok, num_generations):
    env = envs.DemoEnv()
    agents = team(tok)
    for agent in agents:
        agent.optimizer = models.make_optimizer(agent.model, 1e-3)
    team_critic = critic.Critic(agents, "per-agent", learning_rate=1e-2)
    cfg = magrpo.Config(num_generations=num_generations, max_new_tokens=8, advantage="critic")
    assert cfg.on_the_tree()  # train.py takes the tree's step for a critic
    states = [env.prompts(ex) for ex in env.examples[:2]]
    features = team_critic.features(states)
    team_critic.fit(features, torch.tensor([[1.0] * num_generations, [2.0] * num_generations]))
    values = team_critic.values(features)
    reads, read = [], team_critic.features
    team_critic.features = lambda states: reads.append(len(states)) or read(states)
    turns, metrics = magrpo.train_step(agents, env, env.examples[:2], cfg, [3, 4], critic=team_critic)
    assert reads == [2]  # each state's prompts are read once a step, for the values and the fit both
    returns = turns[0].values()
    for i in range(2):
        expected = (returns - values[i][:, None]).view(-1)
        assert torch.allclose(turns[0].advantages[i], expected)
    residuals = torch.cat([returns - v[:, None] for v in values])  # every head's rows together
    explained = 1 - residuals.var(unbiased=False) / returns.var(unbiased=False)
    assert metrics["critic_explained_variance"] == pytest.approx(float(explained), abs=1e-5)
    assert not torch.equal(team_critic.values(features)[0], values[0])  # the fit came after


def test_train_step_refuses_a_critic_without_its_advantage_and_the_reverse(tok):
    agents = team(tok)
    env = envs.DemoEnv()
    with pytest.raises(ValueError, match="--advantage critic"):
        magrpo.train_step(agents, env, env.examples[:1], magrpo.Config(advantage="critic"), [0])
    with pytest.raises(ValueError, match="--advantage mean"):
        magrpo.train_step(agents, env, env.examples[:1], magrpo.Config(), [0], critic=critic.Critic(agents))


def test_config_critic_refuses_a_group_scale():
    with pytest.raises(ValueError, match="--scale-rewards"):
        runs.checked_config(advantage="critic", scale_rewards="group")
