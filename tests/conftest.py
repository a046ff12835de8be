"""Shared test helpers: scripted agents for end-to-end runs whose rewards must vary, and a
sandbox that cannot start.

Tiny random models write random bytes: on the coding and writing envs every joint answer scores 0,
so every advantage is 0 and nothing is trained. `script_agents` makes the team's sampler return
chosen texts instead (tokenized for real, so the log-prob pass and the update run on them as on
sampled text): rewards differ within each group and the update can be checked.

The suite runs in the code's dependency order: the unit tests of each function first, end-to-end
runs last, so when a course blanks a function the first failures name it."""
import hashlib
import os
from pathlib import Path
from unittest import mock

import pytest
import torch

import magrpo
import models
import sampler


@pytest.fixture(scope="module")
def tok():
    """The tiny byte tokenizer the tests' models are built with."""
    return models.tiny_tokenizer()


def build(tok, arch, seed=0):
    # A wide init makes logits spread out, so greedy decoding is not one repeated token.
    return models.tiny_model(tok, arch=arch, init_std=0.5, seed=seed).eval()


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
            mock.patch.object(magrpo, "episode_advantages", lambda turns, cfg, values=None: given):
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


def scripted_generate(model, tokenizer, prompts, num_generations=1, max_new_tokens=256, temperature=1.0,
                      top_p=1.0, top_k=0, seed=None, compile=False):
    """A stand-in for sampler.generate, for the tests of what becomes of completions, not of how they
    are drawn: completion g of prompt b is a few words of random letters from random.Random(prompt
    b's seed, g), at most max_new_tokens - 1 bytes and an EOS; greedy (T = 0) ones come from the
    prompt's text alone, as greedy decoding ignores seeds. The texts differ within a group, and so do
    their rewards."""
    import random
    seeds = list(seed) if isinstance(seed, (list, tuple)) else None

    def text(b, g):
        key = f"{seeds[b] if seeds else sampler.mix_seed(seed or 0, b)} {g}"
        rng = random.Random(prompts[b] if temperature == 0 else key)
        words = []
        for _ in range(rng.randint(1, 5)):
            words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 6))))
        return " ".join(words)[:max_new_tokens - 1]
    return scripted_rollout(models.Agent(model, tokenizer), list(prompts), num_generations, text)


@pytest.fixture
def scripted_sampling(monkeypatch):
    """Every generate call, magrpo's and sampler's, returns scripted_generate's completions: the tests
    of an episode's or a step's bookkeeping do not wait for the sampler, which test_sampler.py tests."""
    monkeypatch.setattr(sampler, "generate", scripted_generate)
    monkeypatch.setattr(magrpo, "generate", scripted_generate)


@pytest.fixture
def broken_fork_server(monkeypatch):
    """A sandbox whose fork server exits at once: every run is an infrastructure error
    (test_sandbox.py and test_rewards.py check that it is reported, never a silent 0)."""
    import walls
    walls._stop_fork_server()
    monkeypatch.setattr(walls, "_BOOT", "import sys; sys.exit(3)")
    yield
    walls._stop_fork_server()


# Unit tests by module, in the dependency order of the code (sandbox <- rewards <- envs, magrpo
# before what uses it): a blanked function fails first in its own module's tests, not in a later
# module's test that happens to call it.
FILE_ORDER = ["test_sandbox.py", "test_rewards.py", "test_sampler.py", "test_magrpo.py", "test_envs.py",
              "test_eval.py", "test_team.py", "test_lora.py", "test_train.py"]


def pytest_collection_modifyitems(items):
    def rank(item):
        kind = 2 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("integration") else 0
        name = os.path.basename(str(item.path))
        return kind, FILE_ORDER.index(name) if name in FILE_ORDER else len(FILE_ORDER)
    items.sort(key=rank)  # stable: within a rank, the file's own order


# -----------------------------------------------------------------------------
# The reference of completion_logprobs' tests. In the repository it is computed here, each row run
# alone (logprobs_row_by_row). A course copy in which completion_logprobs is blanked must not hold it:
# it would be the answer. There the course kit (tests/make_assignment.py) removes logprobs_row_by_row
# and writes RECORDED, the values and gradients that the copy's tests ask for, computed by this very
# code in the repository; the tests read them through reference_logprobs and reference_gradient,
# which work the same in both places.

RECORDED = Path(__file__).resolve().parent / "fixtures" / "reference_logprobs.pt"
DIRECTIONS = 16  # gradients are compared along this many fixed random directions


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
        logits = model(input_ids=torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1:-1]
        logits = logits.float() / T
        lp = torch.log_softmax(logits, -1).gather(-1, completion[:, None]).squeeze(-1)
        rows.append(torch.nn.functional.pad(lp, (0, rollout.completion_ids.shape[1] - n)))
    return torch.stack(rows)


def reference_logprobs(model, rollout, temperature=1.0, hint=""):
    """The log-prob of every completion token that completion_logprobs must return, [rows, T], 0
    after EOS, without grad: the row-by-row pass, or in a course copy its recorded values (`hint`:
    what to check when none was recorded for this call)."""
    def compute():
        with torch.no_grad():
            return logprobs_row_by_row(model, rollout, temperature)
    return _reference("logprobs", model, rollout, temperature, None, compute, hint)


def token_weights(rollout):
    """Fixed weights, one per completion token (in [-1, 1], 0 after EOS): the loss of the gradient
    checks is minus the weighted sum of the log-probs, any loss of the form of Eq. 2's."""
    n = rollout.completion_ids.numel()
    weights = ((torch.arange(n) * 7919) % 23 - 11).double() / 11  # integers: the same on every machine
    return weights.view(rollout.completion_ids.shape) * rollout.completion_mask


def weighted_loss(logprobs, rollout):
    return -(token_weights(rollout).to(logprobs.dtype) * logprobs * rollout.completion_mask).sum()


def projected_gradient(model):
    """The gradient of the model's trainable parameters (None counts as 0) along DIRECTIONS fixed
    random +-1 directions -> [DIRECTIONS], float64. The directions come from sampler.row_uniforms, an
    integer hash, so that a machine that records and one that compares see the same ones."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().flatten()
                      for p in trainable])
    keys = torch.arange(flat.numel())
    return torch.stack([(sampler.row_uniforms(keys, k) > 0.5).double().mul(2).sub(1) @ flat
                        for k in range(DIRECTIONS)])


def reference_gradient(model, rollout, temperature=1.0):
    """projected_gradient of weighted_loss on the reference log-probs (the model's own gradients are
    left at None): what completion_logprobs' gradient must be, seen along fixed directions."""
    def compute():
        model.zero_grad(set_to_none=True)
        weighted_loss(logprobs_row_by_row(model, rollout, temperature), rollout).backward()
        projected = projected_gradient(model)
        model.zero_grad(set_to_none=True)
        return projected
    return _reference("gradient", model, rollout, temperature, token_weights(rollout), compute, "")


def _fingerprint(model):
    """Two numbers that tell models apart: the sum of the parameters and of their squares."""
    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    return torch.stack([flat.sum(), flat.square().sum()])


def _case(kind, model, rollout, temperature, weights):
    """The recording's key of a call: what is asked, the rollout's tokens, the temperature, the dtype."""
    digest = hashlib.sha256(f"{kind} {float(temperature)} {next(model.parameters()).dtype}".encode())
    for t in (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask):
        digest.update(t.long().cpu().numpy().tobytes())
    if weights is not None:
        digest.update(weights.double().numpy().tobytes())
    return digest.hexdigest()


_recording = []


def _reference(kind, model, rollout, temperature, weights, compute, hint):
    """compute(), here; in a course copy, the value recorded for the same call. While the kit
    records (MAGRPO_RECORD_REFERENCE names the file), each computed value is written down too."""
    key, fingerprint = _case(kind, model, rollout, temperature, weights), _fingerprint(model)
    if RECORDED.exists():
        entries = [e for e in torch.load(RECORDED, weights_only=True) if e["key"] == key]
        for entry in entries:
            if torch.allclose(entry["fingerprint"], fingerprint, rtol=1e-6):
                return entry["value"]
        why = "nothing was recorded for it"
        if entries:
            why = "this model differs from the one it was recorded with"
        versions = torch.load(RECORDED, weights_only=True)[0]["versions"]
        pytest.fail(f"the recorded reference ({kind}) has no value for this call: {why}{hint}. The course "
                    f"kit recorded {RECORDED.name} with {versions}; other versions of torch or transformers "
                    "may build other tiny models: ask for a copy made with yours", pytrace=False)
    value = compute()
    if os.environ.get("MAGRPO_RECORD_REFERENCE"):
        import transformers
        versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
        _recording.append({"key": key, "fingerprint": fingerprint, "value": value.detach().clone(),
                           "versions": versions})
        torch.save(_recording, os.environ["MAGRPO_RECORD_REFERENCE"])
    return value
