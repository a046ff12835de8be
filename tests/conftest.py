"""Shared test helpers: scripted agents for end-to-end runs whose rewards must vary, and a
sandbox that cannot start.

Tiny random models write random bytes: on the coding and writing envs every joint answer scores 0,
so every advantage is 0 and nothing is trained. `script_agents` makes the team's sampler return
chosen texts instead (tokenized for real, so the log-prob pass and the update run on them as on
sampled text): rewards differ within each group and the update can be checked.

The suite runs in the code's dependency order: the unit tests of each function first, end-to-end
runs last, so when a course blanks a function the first failures name it."""
import os
from unittest import mock

import pytest
import torch

import magrpo
import sampler


def scripted_rollout(agent, prompts, size, texts_of):
    """A Rollout as sampler.generate returns it, with texts_of(prompt index, g) as the completions."""
    tok = agent.tokenizer
    eos = tok.eos_token_id
    prompt_rows = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(size)]
    texts = [[texts_of(b, g) for g in range(size)] for b in range(len(prompts))]
    completions = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for row in texts for t in row]
    prompt_ids, prompt_mask = sampler.left_pad(prompt_rows, eos, "cpu")
    width = max(len(c) for c in completions)
    completion_ids = torch.tensor([c + [eos] * (width - len(c)) for c in completions])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions])
    return sampler.Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask,
                          torch.zeros(completion_ids.shape), texts, size)


def update_on(agent, parts, cfg):
    """magrpo.train_step's update of one agent on given turns, parts = [(rollout, advantages)] per
    turn: the sampling and Eq. 1 are replaced by them. -> the agent's metrics (loss, grad_norm, ...)."""
    turns = []
    for rollout, _ in parts:
        groups = [None] * (len(rollout) // rollout.num_generations)
        turns.append(magrpo.Turn(groups, rollout.num_generations, [rollout], [], [], [], []))
    given = [[advantages] for _, advantages in parts]
    with mock.patch.object(magrpo, "rollout_team", lambda *args, **kwargs: turns), \
            mock.patch.object(magrpo, "episode_advantages", lambda turns, cfg: given):
        _, metrics = magrpo.train_step([agent], None, [], cfg, [])
    return {name[:-2]: value for name, value in metrics.items() if name.endswith("_0")}


@pytest.fixture
def script_agents(monkeypatch):
    """script_agents([texts of agent 0, texts of agent 1, ...]): from now on agent i's g-th completion
    of its b-th prompt in its c-th call is texts[i][(b + g + c) % len(texts[i])]: groups mix the
    texts, and the k-th texts of the agents meet in a joint action. Returns the list of the agents
    called, in order."""
    def install(choices):
        calls = []

        def sample_agent(agent, i, prompts, size, cfg, seeds):
            calls.append(i)
            options, c = choices[i], calls.count(i)
            return scripted_rollout(agent, prompts, size, lambda b, g: options[(b + g + c) % len(options)])
        monkeypatch.setattr(magrpo, "sample_agent", sample_agent)
        return calls
    return install


@pytest.fixture
def broken_fork_server(monkeypatch):
    """A sandbox whose fork server exits at once: every run is an infrastructure error
    (test_sandbox.py and test_rewards.py check that it is reported, never a silent 0)."""
    import sandbox
    sandbox._stop_fork_server()
    monkeypatch.setattr(sandbox, "_BOOT", "import sys; sys.exit(3)")
    yield
    sandbox._stop_fork_server()


# Unit tests by module, in the dependency order of the code (sandbox <- rewards <- envs, magrpo
# before what uses it): a blanked function fails first in its own module's tests, not in a later
# module's test that happens to call it.
FILE_ORDER = ["test_sandbox.py", "test_rewards.py", "test_sampler.py", "test_magrpo.py", "test_envs.py", "test_eval.py",
              "test_team.py", "test_lora.py", "test_train.py"]


def pytest_collection_modifyitems(items):
    def rank(item):
        kind = 2 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("integration") else 0
        name = os.path.basename(str(item.path))
        return kind, FILE_ORDER.index(name) if name in FILE_ORDER else len(FILE_ORDER)
    items.sort(key=rank)  # stable: within a rank, the file's own order


def logprobs_row_by_row(model, rollout, temperature=1.0):
    """The reference for magrpo.completion_logprobs: each row alone, its real prompt tokens and its
    completion up to EOS in one plain forward pass (no padding, no cache, nothing shared), with grad;
    positions after EOS are 0."""
    T = temperature if temperature > 0 else 1.0
    rows = []
    for r in range(len(rollout)):
        prompt = rollout.prompt_ids[r][rollout.prompt_mask[r].bool()]
        n = int(rollout.completion_mask[r].sum())
        completion = rollout.completion_ids[r, :n]
        logits = model(input_ids=torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1:-1].float() / T
        lp = torch.log_softmax(logits, -1).gather(-1, completion[:, None]).squeeze(-1)
        rows.append(torch.nn.functional.pad(lp, (0, rollout.completion_ids.shape[1] - n)))
    return torch.stack(rows)
