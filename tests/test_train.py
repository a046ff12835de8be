"""train.py end to end on the CPU demo: the reward rises, the outputs are written and load back, and a
bad flag is one clear line."""
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import eval as evaluation
import magrpo
import sampler
import models
import runs
import train

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration  # whole runs of train.py: after the unit tests


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    train.train(train.parse_args(["--steps", "50", "--out", str(out), "--seed", "1"]))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, rows


def test_short_demo_run_raises_the_reward(demo_run):
    _, rows = demo_run
    first = sum(r["reward_mean"] for r in rows[:8]) / 8
    last = sum(r["reward_mean"] for r in rows[-8:]) / 8
    assert last > 1.5 * first, (first, last)


def test_metrics_have_the_documented_fields(demo_run):
    _, rows = demo_run
    assert [r["step"] for r in rows] == list(range(50))
    for key in ("reward_mean", "reward_std", "zero_adv_groups", "seconds", "loss_0", "grad_norm_1"):
        assert all(key in r for r in rows), key


def test_agents_load_back_with_transformers(demo_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    out, _ = demo_run
    for i in range(2):
        model = AutoModelForCausalLM.from_pretrained(out / f"agent_{i}")
        tok = AutoTokenizer.from_pretrained(out / f"agent_{i}")
        ids = tok("Topic: cats", return_tensors="pt")["input_ids"]
        assert torch.isfinite(model(ids).logits).all()


@pytest.mark.parametrize("flags, named", [
    (["--num-generations", "1"], "--num-generations"),
    (["--env", "nope"], "--env"),
    (["--model", "./no/such/model"], "--model"),
    (["--loss-type", "mystery"], "--loss-type"),
    (["--advantage", "max"], "--advantage"),
    (["--advantage", "critic", "--critic-learning-rate", "0"], "--critic-learning-rate"),
    (["--advantage", "critic", "--scale-rewards", "group"], "--scale-rewards"),
    (["--model", "tiny,tiny,tiny"], "--model"),
    (["--dtype", "float16"], "--dtype"),
    (["--eval-every", "1", "--eval-limit", "0"], "--eval-limit"),
    (["--device", "cpu,cpu,cpu"], "--device"),
    (["--num-turns", "0"], "--num-turns"),
    (["--discount", "1.5"], "--discount"),
    (["--discount", "-0.1"], "--discount"),
    (["--num-turns", "2", "--feedback", "expert"], "--feedback"),
    (["--num-turns", "2", "--feedback", "shouting"], "--feedback"),
    (["--num-turns", "2", "--turn-weights", "1.2"], "--turn-weights"),
    (["--num-turns", "2", "--turn-weights", "1.2,x"], "--turn-weights"),
    (["--num-turns", "2", "--expand", "some"], "--expand"),
    (["--top-k", "-3"], "--top-k"),
    (["--log-completions-every", "-1"], "--log-completions-every"),
    (["--advantage", "greedy"], "--advantage"),
    (["--advantage", "std", "--scale-rewards", "batch"], "--scale-rewards"),
    (["--max-grad-norm", "-1"], "--max-grad-norm"),
])
def test_bad_flag_is_one_clear_line(flags, named, tmp_path):
    p = subprocess.run([sys.executable, "train.py", *flags, "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_heterogeneous_team_and_loss_variants(tmp_path):
    # two different tiny models (seeds differ per agent), token_mean loss and rloo advantages
    train.train(train.parse_args(["--steps", "2", "--model", "tiny", "--model", "tiny", "--loss-type",
                                  "token_mean", "--advantage", "rloo", "--out", str(tmp_path)]))
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_in_training_eval_and_periodic_checkpoints(tmp_path):
    train.train(train.parse_args(["--steps", "4", "--eval-every", "2", "--eval-limit", "3",
                                  "--save-every", "2", "--out", str(tmp_path)]))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval_reward_mean" in r] == [0, 2, 3]
    assert all(0.0 <= r["eval_reward_mean"] <= 3.0 for r in rows if "eval_reward_mean" in r)
    assert json.loads((tmp_path / "args.json").read_text())["eval_every"] == 2
    assert (tmp_path / "agent_1" / "config.json").exists() and (tmp_path / "checkpoint-2" / "agent_1").is_dir()


def test_eval_rewards_are_the_greedy_joint_reward_per_turn(tmp_path):
    import envs
    import magrpo
    env = envs.DemoEnv(split="eval")
    tok = models.tiny_tokenizer()
    agents = [models.Agent(models.tiny_model(tok, seed=i, init_std=0.5), tok) for i in range(2)]
    cfg = magrpo.Config(max_new_tokens=10, num_turns=2, termination_threshold=99)
    sums, judged = evaluation.team_reward_sums(agents, env, env.examples[:5], cfg, batch_size=2)
    assert judged == [5, 5]
    got = [total / 5 for total in sums]
    outs = [sampler.generate(a.model, tok, [env.prompts(ex)[i] for ex in env.examples[:5]], 1, 10, 0).texts
            for i, a in enumerate(agents)]
    joint = [(outs[0][b][0], outs[1][b][0]) for b in range(5)]
    first = [float(env.reward(ex, j)) for ex, j in zip(env.examples[:5], joint)]
    assert got[0] == pytest.approx(sum(first) / 5)
    revised = []  # turn 2 by hand: each agent greedily revises its own answer after its feedback
    for ex, j in zip(env.examples[:5], joint):
        notes = env.feedback(ex, j)
        revised.append(tuple(sampler.generate(a.model, tok, [env.revision_prompt(ex, i, [(j[i], notes[i])])], 1, 10, 0).texts[0][0]
                             for i, a in enumerate(agents)))
    assert got[1] == pytest.approx(sum(float(env.reward(ex, r)) for ex, r in zip(env.examples[:5], revised)) / 5)


def test_eval_rewards_under_remax_decode_each_turn_once(monkeypatch):
    """--advantage remax samples a greedy baseline in training; the greedy eval must not decode its
    greedy turn twice (and score it twice, in the sandbox on coding)."""
    import envs
    import magrpo
    env = envs.DemoEnv(split="eval")
    tok = models.tiny_tokenizer()
    agents = [models.Agent(models.tiny_model(tok, seed=i, init_std=0.5), tok) for i in range(2)]
    calls, real = [], magrpo.sample_agent
    monkeypatch.setattr(magrpo, "sample_agent", lambda *a, **k: calls.append(1) or real(*a, **k))
    for advantage in ("mean", "remax"):
        calls.clear()
        cfg = magrpo.Config(max_new_tokens=6, advantage=advantage)
        sums, judged = evaluation.team_reward_sums(agents, env, env.examples[:3], cfg, batch_size=3)
        assert len(calls) == 2, (advantage, len(calls))  # one generate call per agent for the one turn
        assert len(sums) == 1 and judged == [3]


def test_team_reward_sums_leave_an_answer_without_a_verdict_out(monkeypatch):
    """The in-training eval, as eval.py's report: an answer nobody judged (NaN) is no 0 in the mean."""
    import envs
    import magrpo
    env = envs.DemoEnv(split="eval")
    tok = models.tiny_tokenizer()
    agents = [models.Agent(models.tiny_model(tok, seed=i, init_std=0.5), tok) for i in range(2)]
    real = env.reward
    monkeypatch.setattr(env, "reward", lambda ex, out: math.nan if ex is env.examples[0] else real(ex, out))
    monkeypatch.setattr(env, "rewards", lambda exs, outs: [env.reward(e, o) for e, o in zip(exs, outs)])
    sums, judged = evaluation.team_reward_sums(agents, env, env.examples[:3], magrpo.Config(max_new_tokens=6))
    assert judged == [2] and math.isfinite(sums[0])


def test_bf16_agents_train_with_fp32_master_weights(tmp_path):
    args = train.parse_args(["--steps", "2", "--dtype", "bfloat16", "--out", str(tmp_path)])
    env, cfg = train.resolve_flags(args)
    agents = train.build(args, env)
    assert all(a.model.dtype == torch.bfloat16 for a in agents)
    assert all(isinstance(a.optimizer, models.MasterWeightAdamW) for a in agents)
    train.train(train.parse_args(["--steps", "2", "--dtype", "bfloat16", "--out", str(tmp_path)]))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["skipped_0"] == 0 for r in rows)

# -----------------------------------------------------------------------------
# Runs that survive: checkpoints, --resume, signals, no clobbering

QUICK = ["--steps", "6", "--num-generations", "4", "--max-new-tokens", "8", "--batch-size", "1"]


def rows_of(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def same_run(a, b):
    """Two runs' metrics agree step by step on everything but the wall time."""
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    return strip(a) == strip(b)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    train.train(train.parse_args(QUICK + ["--out", str(out)]))
    return rows_of(out)


def cli(*flags, timeout=120):
    return subprocess.run([sys.executable, "train.py", *flags], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_resume_continues_exactly_where_it_stopped(tmp_path, uninterrupted):
    out = str(tmp_path / "run")
    train.train(train.parse_args(QUICK[:1] + ["2"] + QUICK[2:] + ["--save-every", "1", "--out", out]))
    assert [c[0] for c in runs.checkpoints(out)] == [2, 1]  # the newest --save-total-limit (2)
    train.train(train.parse_args(QUICK + ["--resume", "--out", out]))
    assert same_run(rows_of(out), uninterrupted)
    state = json.loads((tmp_path / "run" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["args"]["steps"] == 6 and "agent_0/optimizer.pt" in state["files"]
    assert json.loads((tmp_path / "run" / "final.json").read_text())["step"] == 6


@pytest.mark.parametrize("lora", [[], ["--lora-r", "4"]])
def test_resume_with_a_critic_continues_exactly_where_it_stopped(tmp_path, lora):
    """--advantage critic: the checkpoint carries the value heads, their Adam and their replay, and the
    critic reads the agents as they began (reloaded from --model; a LoRA team's base), so the resumed
    run's metrics (critic_loss too) and its final heads are the uninterrupted run's, to the bit."""
    flags = QUICK + ["--advantage", "critic", "--critic", "per-agent", "--num-generations", "2"] + lora
    whole, out = str(tmp_path / "whole"), str(tmp_path / "run")
    train.train(train.parse_args(flags + ["--out", whole]))
    train.train(train.parse_args(flags[:1] + ["3"] + flags[2:] + ["--save-every", "1", "--out", out]))
    train.train(train.parse_args(flags + ["--resume", "--out", out]))
    assert same_run(rows_of(out), rows_of(whole)) and rows_of(out)[-1]["critic_loss"] > 0
    heads = [torch.load(f"{run}/checkpoint-6/{runs.CRITIC_STATE}")["heads"] for run in (whole, out)]
    assert all(torch.equal(heads[0][name], heads[1][name]) for name in heads[0])


def test_resume_with_a_critic_on_bf16_agents_builds_no_master_copy_for_its_readers(tmp_path, monkeypatch):
    """Bug: the critic's readers of a resumed run were built with an optimizer, and on bf16 agents that
    is MasterWeightAdamW's fp32 copy of every weight (~12 GB per 3B agent) for models only read."""
    flags = ["--steps", "2", "--num-generations", "2", "--max-new-tokens", "4", "--batch-size", "1",
             "--advantage", "critic", "--dtype", "bfloat16", "--out", str(tmp_path / "run")]
    train.train(train.parse_args(flags[:1] + ["1"] + flags[2:]))
    made, real = [], models.MasterWeightAdamW.__init__

    def counting(self, *args, **kwargs):
        made.append(self)
        real(self, *args, **kwargs)
    monkeypatch.setattr(models.MasterWeightAdamW, "__init__", counting)
    train.train(train.parse_args(flags + ["--resume"]))
    assert len(rows_of(tmp_path / "run")) == 2
    assert len(made) == 2, "one fp32 master copy per trained agent, none for the critic's readers"


def completions_of(out):
    return [json.loads(line) for line in (Path(out) / "completions.jsonl").read_text().splitlines()]


def test_completions_log_every_joint_action_with_what_eq2_made_of_it(tmp_path):
    """3 demo steps, 2 prompts x G = 4: 24 rows, one per joint action, each advantage R - the group's
    mean (Eq. 1); the example is its index in the split, and the texts are the agents' own."""
    train.train(train.parse_args(["--steps", "3", "--num-generations", "4", "--out", str(tmp_path)]))
    rows = completions_of(tmp_path)
    assert len(rows) == 3 * 2 * 4 and [r["step"] for r in rows] == [s for s in range(3) for _ in range(8)]
    assert all(set(r) == {"step", "example", "turn", "completions", "reward", "levels", "advantages"} for r in rows)
    for s in range(3):
        for k in range(2):
            group = rows[s * 8 + k * 4:s * 8 + k * 4 + 4]
            mean = sum(r["reward"] for r in group) / 4
            assert len({r["example"] for r in group}) == 1 and all(len(r["completions"]) == 2 for r in group)
            for r in group:
                assert r["advantages"] == pytest.approx([r["reward"] - mean] * 2, abs=1e-5)
                assert sum(r["levels"].values()) == pytest.approx(r["reward"])
    env = train.envs.DemoEnv()
    assert all(0 <= r["example"] < len(env.examples) for r in rows)
    assert train.batch_at(len(env.examples), 0, 1, 2) == [r["example"] for r in rows[8:16:4]]


def test_completions_log_on_resume_has_each_step_once_and_can_be_off(tmp_path):
    out = str(tmp_path / "run")
    train.train(train.parse_args(QUICK[:1] + ["4"] + QUICK[2:] + ["--save-every", "2", "--out", out]))
    whole = completions_of(out)
    for name in ("checkpoint-4", "agent_0", "agent_1"):  # as if killed after step 3's rows
        shutil.rmtree(Path(out) / name)
    (Path(out) / "final.json").unlink()
    train.train(train.parse_args(QUICK[:1] + ["4"] + QUICK[2:] + ["--save-every", "2", "--resume", "--out", out]))
    assert completions_of(out) == whole  # steps 2 and 3 once, as in the run that was not stopped
    quiet = str(tmp_path / "quiet")
    train.train(train.parse_args(QUICK + ["--log-completions-every", "0", "--out", quiet]))
    assert not (Path(quiet) / "completions.jsonl").exists() or not completions_of(quiet)


@pytest.mark.parametrize("mode", ["none", "remax"])
def test_reinforce_and_remax_train_the_demo(tmp_path, mode):
    train.train(train.parse_args(QUICK + ["--advantage", mode, "--out", str(tmp_path)]))
    rows = rows_of(tmp_path)
    assert len(rows) == 6 and all(r["grad_norm_0"] > 0 and r["skipped_1"] == 0 for r in rows)
    if mode == "none":  # REINFORCE: the advantage is the reward itself
        assert all(r["advantages"] == pytest.approx([r["reward"]] * 2) for r in completions_of(tmp_path))


def test_a_broken_checkpoint_is_skipped_for_the_one_before(tmp_path, uninterrupted):
    out = tmp_path / "run"
    train.train(train.parse_args(QUICK[:1] + ["3"] + QUICK[2:] + ["--save-every", "1", "--out", str(out)]))
    weights = out / "checkpoint-3" / "agent_1" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a copy cut short
    with pytest.warns(UserWarning, match="checkpoint-3: agent_1/model.safetensors is truncated"):
        train.train(train.parse_args(QUICK + ["--resume", "--out", str(out)]))
    assert same_run(rows_of(out), uninterrupted)  # resumed at 2: step 2 ran again, once in the log
    assert [c[0] for c in runs.checkpoints(str(out))] == [6, 2]  # the broken one is gone
    (out / "checkpoint-6" / "rng_state.pt").unlink()
    with pytest.warns(UserWarning, match="rng_state.pt is missing"):
        assert runs.latest_checkpoint(str(out))[0] == 2


def test_an_existing_run_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "run"
    train.train(train.parse_args(["--steps", "1", "--num-generations", "2", "--max-new-tokens", "4", "--out", str(out)]))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    p = cli("--steps", "1", "--out", str(out))
    assert p.returncode != 0 and "--resume" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    p = cli("--steps", "3", "--num-generations", "2", "--max-new-tokens", "4", "--learning-rate", "0.1",
            "--resume", "--out", str(out))
    assert p.returncode != 0 and "--learning-rate" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_resume_without_a_checkpoint_starts_at_step_zero(tmp_path):
    out = tmp_path / "new"  # does not exist yet: a preemptible job script can always pass --resume
    train.train(train.parse_args(["--steps", "2", "--num-generations", "2", "--max-new-tokens", "4",
                                  "--resume", "--out", str(out)]))
    assert [r["step"] for r in rows_of(out)] == [0, 1]


def test_a_failed_save_warns_and_the_run_goes_on(tmp_path, monkeypatch):
    import errno
    real, calls = torch.save, []

    def full_disk(obj, path, *a, **k):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, path, *a, **k)

    monkeypatch.setattr(torch, "save", full_disk)
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="could not save checkpoint-1 .*No space left"):
        train.train(train.parse_args(["--steps", "3", "--num-generations", "2", "--max-new-tokens", "4",
                                      "--save-every", "1", "--out", str(out)]))
    assert [c[0] for c in runs.checkpoints(str(out))] == [3, 2] and not list(out.glob(".tmp-*"))
    assert len(rows_of(out)) == 3


class FullDisk:
    """A stand-in for a full disk where none can be mounted: while `full`, each writer a save uses
    writes part of its file (train.py's own files all but their last 10 characters: a row cut
    short), then raises what it raises on a full disk (as measured on a tmpfs): safetensors a
    SafetensorError, torch.save a RuntimeError, the tokenizers library a bare Exception, and
    our own files (metrics.jsonl, curve.svg, trainer_state.json, final.json) an OSError."""

    def __init__(self, monkeypatch, writers=("safetensors", "torch", "tokenizer", "open")):
        import builtins
        import transformers
        import transformers.modeling_utils as modeling
        from safetensors import SafetensorError
        enospc = lambda: OSError(28, "No space left on device")  # noqa: E731
        safetensors = "Error while serializing: I/O error: No space left on device (os error 28)"
        pytorch = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
        errors = {"safetensors": lambda: SafetensorError(safetensors), "torch": lambda: RuntimeError(pytorch),
                  "tokenizer": lambda: Exception("No space left on device (os error 28)"), "open": enospc}
        self.full, tokenizers = False, transformers.PreTrainedTokenizerBase

        def failing(name, real, path_of):
            def write(*a, **k):
                if not (self.full and name in writers):
                    return real(*a, **k)
                Path(path_of(*a, **k)).write_bytes(b"\0" * 100)  # what was written before the disk filled
                raise errors[name]()
            return write

        def open_(file, mode="r", *a, **k):
            f = builtins.open(file, mode, *a, **k)
            if self.full and "open" in writers and any(c in mode for c in "wa"):
                def write(text, real=f.write):
                    real(text[:-10])
                    f.flush()
                    raise errors["open"]()
                f.write = write
            return f

        monkeypatch.setattr(modeling, "safe_save_file", failing("safetensors", modeling.safe_save_file,
                                                                lambda tensors, path, **k: path))
        monkeypatch.setattr(torch, "save", failing("torch", torch.save, lambda obj, path, *a, **k: path))
        tokenizer_json = lambda tok, d, *a, **k: Path(d) / "tokenizer.json"  # noqa: E731
        monkeypatch.setattr(tokenizers, "save_pretrained",
                            failing("tokenizer", tokenizers.save_pretrained, tokenizer_json))
        monkeypatch.setattr(runs, "open", open_, raising=False)
        monkeypatch.setattr(models, "open", open_, raising=False)  # where the checkpoint's state is written

    def from_update(self, monkeypatch, k):
        """The disk fills during the k-th update (counted from 1) and stays full."""
        real, done = magrpo.group_advantages, []

        def group_advantages(*a, **kw):  # once a step (single_turn_step), after its sampling
            done.append(1)
            self.full = self.full or len(done) >= k
            return real(*a, **kw)
        monkeypatch.setattr(magrpo, "group_advantages", group_advantages)


@pytest.mark.parametrize("writer, cause", [("safetensors", "SafetensorError: .*No space left"),
                                           ("torch", "RuntimeError: .*unexpected pos"),
                                           ("tokenizer", "Exception: No space left"),
                                           ("open", "OSError: .*No space left")])
def test_save_checkpoint_fails_whole_whatever_writer_fails(tmp_path, monkeypatch, writer, cause):
    """Any writer of a save that fails is a failed save: SaveFailed names the cause and the newest
    complete checkpoint, the partial copy is gone, the earlier checkpoint stays; the next save works."""
    out = str(tmp_path / "run")
    args = train.parse_args(QUICK + ["--out", out])
    agents = train.build(args, train.resolve_flags(args)[0])
    runs.save_checkpoint(out, 1, agents, args)
    disk = FullDisk(monkeypatch, writers=(writer,))
    disk.full = True
    newest = f"{out}/checkpoint-1 is the newest complete checkpoint \\(--resume continues from it\\)"
    with pytest.raises(runs.SaveFailed, match=f"could not save checkpoint-2 \\({cause}.*; {newest}"):
        runs.save_checkpoint(out, 2, agents, args)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint-1"]
    disk.full = False
    runs.save_checkpoint(out, 2, agents, args)
    assert [c[0] for c in runs.checkpoints(out)] == [2, 1]
    assert runs.checkpoint_problem(out + "/checkpoint-2") is None


def test_a_full_disk_stand_in_ends_the_run_in_one_line_and_resume_finishes_it(tmp_path, monkeypatch, capsys,
                                                                                 uninterrupted):
    """The disk fills during step 2 and stays full: completions, metrics and curve warn once each, the
    save at 4 and the final one fail; the run ends with one line naming checkpoint-2. Once there is
    room again, --resume gives the uninterrupted run (the half-written row cut away)."""
    out = tmp_path / "run"
    disk = FullDisk(monkeypatch)
    disk.from_update(monkeypatch, 3)
    with pytest.warns(UserWarning) as warned, pytest.raises(SystemExit) as stop:
        train.train(train.parse_args(QUICK + ["--save-every", "2", "--out", str(out)]))
    messages = [str(w.message) for w in warned if "could not" in str(w.message)]
    assert [m.split(" (")[0] for m in messages] == [
        f"could not write {out}/completions.jsonl", f"could not write {out}/metrics.jsonl",
        "could not save checkpoint-4",
        f"could not write {out}/curve.svg"]
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert stop.value.code == 1 and "Traceback" not in err
    assert last.startswith("train.py: error: could not save checkpoint-6 (OSError: [Errno 28] No space left")
    assert last.endswith(f"{out}/checkpoint-2 is the newest complete checkpoint (--resume continues from it)")
    assert [c[0] for c in runs.checkpoints(str(out))] == [2] and not list(out.glob(".tmp-*"))
    with pytest.raises(ValueError):
        json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])  # a row cut short
    monkeypatch.undo()  # room again
    train.train(train.parse_args(QUICK + ["--save-every", "2", "--resume", "--out", str(out)]))
    assert same_run(rows_of(out), uninterrupted)
    steps = [json.loads(line)["step"] for line in (out / "completions.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and set(steps) == set(range(len(uninterrupted)))


def test_save_final_that_fails_names_the_last_checkpoint_and_resume_finishes(tmp_path, monkeypatch, capsys):
    """The disk fills while the trained agents are written (final.json cannot be): exit 1, one line
    naming checkpoint-2; --resume (nothing left to train) writes them again, then final.json."""
    disk, real = FullDisk(monkeypatch, writers=("open",)), runs.save_final

    def save_final_on_a_full_disk(*a, **k):
        disk.full = True
        return real(*a, **k)
    monkeypatch.setattr(runs, "save_final", save_final_on_a_full_disk)
    out = tmp_path / "run"
    flags = ["--steps", "2", "--num-generations", "2", "--max-new-tokens", "4", "--out", str(out)]
    with pytest.raises(SystemExit) as stop:
        train.train(train.parse_args(flags))
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 1 and "No space left on device" in last
    assert last.startswith(f"train.py: error: could not save the trained agents in {out} (OSError: ")
    assert last.endswith(f"{out}/checkpoint-2 is the newest complete checkpoint (--resume continues from it)")
    assert not (out / "final.json").exists() and not list(out.glob(".tmp-*"))
    monkeypatch.undo()
    train.train(train.parse_args(flags + ["--resume"]))
    assert json.loads((out / "final.json").read_text())["step"] == 2
    assert (out / "agent_1" / "config.json").exists()


def mountable_tmpfs(where):
    """None if `unshare` can mount a tmpfs here (a user and mount namespace), else why not."""
    if shutil.which("unshare") is None:
        return "no unshare"
    p = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                        f"mount -t tmpfs -o size=64k tmpfs {where}"], capture_output=True, text=True)
    return None if p.returncode == 0 else p.stderr.strip() or f"exit {p.returncode}"


def test_a_full_disk_on_a_small_tmpfs_ends_the_run_in_one_line_and_resume_finishes_it(tmp_path,
                                                                                       uninterrupted):
    """The issue's test: --out on a 3.5 MB tmpfs, room for one demo checkpoint (2.2 MB) but not two.
    The save at step 4 fails (safetensors: no space left), the run goes on, the final save fails:
    one line naming checkpoint-2, no traceback. The run copied to the real disk resumes to the
    uninterrupted run's exact rewards. (test_a_full_disk_stand_in checks the same anywhere.)"""
    mnt = tmp_path / "small"
    mnt.mkdir()
    why = mountable_tmpfs(mnt)
    if why:
        pytest.skip(f"cannot mount a tmpfs here ({why})")
    flags = " ".join(QUICK + ["--save-every", "2", "--out", f"{mnt}/run"])
    script = (f"mount -t tmpfs -o size=3500k tmpfs {mnt} && {sys.executable} train.py {flags} "
              f"2> {tmp_path}/err; echo $? > {tmp_path}/rc; cp -a {mnt}/run {tmp_path}/run")
    subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=ROOT,
                   check=True, timeout=300)
    err = (tmp_path / "err").read_text()
    last = err.strip().splitlines()[-1]
    assert (tmp_path / "rc").read_text().strip() == "1" and "Traceback" not in err, err[-3000:]
    assert "UserWarning: could not save checkpoint-4 (SafetensorError: " in err and "No space left" in err
    assert last.startswith("train.py: error: could not save checkpoint-6 (SafetensorError: ")
    assert last.endswith(f"{mnt}/run/checkpoint-2 is the newest complete checkpoint (--resume continues "
                         "from it)")
    out = tmp_path / "run"
    assert [c[0] for c in runs.checkpoints(str(out))] == [2] and not list(out.glob(".tmp-*"))
    train.train(train.parse_args(QUICK + ["--save-every", "2", "--resume", "--out", str(out)]))
    assert same_run(rows_of(out), uninterrupted)
    steps = [json.loads(line)["step"] for line in (out / "completions.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and set(steps) == set(range(len(uninterrupted)))


def test_warn_scoring_stops_with_a_checkpoint_when_nothing_could_be_scored(tmp_path, monkeypatch,
                                                                           uninterrupted):
    """From step 3 on every reward raises: the run stops before step 3's update, saves
    checkpoint-3 (no --save-every) and exits with one line; --resume redoes step 3."""
    import envs
    real_reward, real_update, done = envs.DemoEnv.reward, magrpo.group_advantages, []

    def reward(self, example, outputs):
        if len(done) >= 3:
            raise ValueError("the scorer is broken")
        return real_reward(self, example, outputs)

    def group_advantages(*a, **k):  # once a step (single_turn_step), after its sampling
        done.append(1)
        return real_update(*a, **k)
    monkeypatch.setattr(envs.DemoEnv, "reward", reward)
    monkeypatch.setattr(magrpo, "group_advantages", group_advantages)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        train.train(train.parse_args(QUICK + ["--save-every", "0", "--out", str(out)]))
    assert stop.value.code == ("train.py: error: step 3: none of the 4 joint answers could be scored "
                               "(0 sandbox failures, 4 scoring errors)")
    assert runs.latest_checkpoint(str(out))[0] == 3 and [c[0] for c in runs.checkpoints(str(out))] == [3]
    assert [r["step"] for r in rows_of(out)] == [0, 1, 2] and not (out / "final.json").exists()
    monkeypatch.undo()
    train.train(train.parse_args(QUICK + ["--resume", "--out", str(out)]))
    assert same_run(rows_of(out), uninterrupted)


def test_cut_metrics_keeps_the_rows_before_the_step_and_drops_a_line_cut_short(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
    runs.cut_metrics(str(path), 2)
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n'
    path.write_text('{"step": 0}\n{"step": 1}')  # a last row whole but for its newline
    runs.cut_metrics(str(path), 5)
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n'


def test_runfile_warns_once_and_catches_up_when_the_disk_has_room(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    log, disk = runs.RunFile(str(path)), FullDisk(monkeypatch)
    log.append('{"step": 0}\n')
    disk.full = True
    with pytest.warns(UserWarning, match="could not write .*metrics.jsonl .*No space left") as warned:
        log.append('{"step": 1}\n')
        log.append('{"step": 2}\n')
        log.write(runs.write_atomic, str(path), "a whole file")
    assert len(warned) == 1
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n{"'  # the last try, cut short
    with pytest.raises(OSError):
        log.sync()  # what a checkpoint asks first: refused while rows are missing
    disk.full = False
    log.append('{"step": 3}\n')
    log.sync()
    assert path.read_text() == "".join(f'{{"step": {k}}}\n' for k in range(4))
    assert log.size == path.stat().st_size


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", "--steps", "500", "--save-every", "0", "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and rows_of(out)):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    # The behaviour, not a time: the run stops with a checkpoint at the step it had reached, long before
    # its 500 steps. The wait is bounded only so that a run that ignored the signal fails the test; on a
    # loaded machine stopping took 13.6 s, so the bound is generous (a test that timed it broke there).
    proc.wait(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM
    step, path = runs.latest_checkpoint(str(out))
    assert step == len(rows_of(out)) < 500 and step >= 1 and not (out / "final.json").exists()
    assert "SIGTERM: saving a checkpoint" in proc.stderr.read()


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_gives_the_uninterrupted_run(tmp_path, uninterrupted):
    """Three SIGKILLs at random instants (seeded) of a run that saves every step, each followed by
    --resume; the finished run's metrics equal the uninterrupted run's."""
    out = str(tmp_path / "run")
    rng = random.Random(1234)
    flags = [*QUICK, "--save-every", "1", "--resume", "--out", out]
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "train.py", *flags], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(2.0, 7.0))  # start-up takes a few seconds: some kills land mid-run
        proc.kill()
        proc.wait()
    p = cli(*flags, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert same_run(rows_of(out), uninterrupted)


def test_eval_uses_the_final_agents_or_else_the_latest_checkpoint(tmp_path, capsys):
    import eval as ev
    out = tmp_path / "run"
    train.train(train.parse_args(["--steps", "2", "--num-generations", "2", "--max-new-tokens", "4",
                                  "--save-every", "1", "--out", str(out)]))
    assert ev.trained_dirs(str(out), 2) == [str(out / "agent_0"), str(out / "agent_1")]
    (out / "final.json").unlink()  # as if the run had been killed before its end
    capsys.readouterr()
    assert ev.trained_dirs(str(out), 2) == [str(out / "checkpoint-2" / f"agent_{i}") for i in range(2)]
    assert "did not finish: using its latest checkpoint" in capsys.readouterr().err


def test_real_model_defaults_come_from_the_authors_configs(tmp_path):
    """No model is loaded: resolve_flags only fills and checks the flags (args.json records them)."""
    args = train.parse_args(["--env", "tldr", "--model", "Qwen/Qwen3-1.7B"])
    env, cfg = train.resolve_flags(args)
    assert (args.learning_rate, cfg.temperature, cfg.top_p, cfg.top_k) == (5e-6, 0.7, 0.9, 0)
    assert (args.num_generations, args.max_new_tokens, args.test_timeout) == (4, 256, 10.0)
    args = train.parse_args(["--env", "coding", "--model", "Qwen/Qwen2.5-Coder-3B", "--top-k", "20"])
    _, cfg = train.resolve_flags(args)
    assert (args.learning_rate, cfg.temperature, cfg.top_p, cfg.top_k) == (1e-5, 0.7, 0.9, 20)
    che = str(ROOT / "tests" / "fixtures" / "coophumaneval_sample.json")
    args = train.parse_args(["--env", "coding", "--dataset", che, "--split", ":", "--model", "m/m", "--temperature", "0.5"])
    _, cfg = train.resolve_flags(args)
    assert (cfg.temperature, cfg.top_p) == (0.5, 0.95)  # a flag given wins over the env's default
    args = train.parse_args(["--env", "coding"])  # the tiny model: its own defaults; one test timeout
    _, cfg = train.resolve_flags(args)
    assert (cfg.temperature, args.learning_rate, args.test_timeout) == (1.0, 3e-3, 10.0)


def test_help_shows_the_defaults_a_run_uses(capsys):
    """--help prints the demo's defaults (the tiny model's) and a real model's on the coding env, from
    runs.run_defaults, the one place they are set; eval.py's, the paper's evaluation sampling."""
    import eval as ev

    def help_of(parse_args):
        with pytest.raises(SystemExit):
            parse_args(["--help"])
        return " ".join(capsys.readouterr().out.split())
    text = help_of(train.parse_args)
    assert "G, completions per agent per prompt (Sec. 2 step 1) (default: the tiny model 8, a real model 4)" in text
    assert "tokens per completion at most (default: the tiny model 24, a real model 256)" in text
    assert "sampling temperature (0: greedy) (default 1.0; a real model on coding 0.7, tldr 0.7, arxiv 0.7)" in text
    assert "(default 1.0; a real model on coding 0.9, tldr 0.9, arxiv 0.9)" in text  # top-p
    assert "(default: the tiny model 0.003, a real model 1e-05; a real model on tldr 5e-06, arxiv 5e-06)" in text
    assert "seconds per sandbox test (default 10)" in text
    for flags, real in (([], dict(num_generations=8, max_new_tokens=24, temperature=1.0, learning_rate=3e-3)),
                        (["--env", "coding", "--model", "m/m"], dict(temperature=0.7, top_p=0.9, learning_rate=1e-5))):
        args = train.parse_args(flags)
        train.resolve_flags(args)
        assert {k: getattr(args, k) for k in real} == real  # what --help says is what a run gets
    text = help_of(ev.parse_args)
    assert "sampling temperature (0: greedy) (default 0.8)" in text and "(default 0.95)" in text
    assert "tokens per completion at most (default: the tiny model 24, a real model 256)" in text


def test_trls_flags_resolve_and_args_json_keeps_them_as_given(monkeypatch):
    """TRL's spellings become our settings in Config; args.json records the flags as given and fills
    the rest (a resume resolves them again). Batch scaling needs every reward in one process."""
    args = train.parse_args(["--loss-type", "dr_grpo", "--advantage", "std", "--mask-truncated-completions",
                             "--max-grad-norm", "1.0"])
    _, cfg = train.resolve_flags(args)
    assert (cfg.loss_type, cfg.advantage, cfg.scale_rewards) == ("token_budget", "mean", "group")
    assert (cfg.mask_truncated_completions, cfg.max_grad_norm) == (True, 1.0)
    assert (args.loss_type, args.advantage, args.scale_rewards) == ("dr_grpo", "std", "group")
    monkeypatch.setattr(runs, "world", lambda: (0, 2))
    with pytest.raises(ValueError, match="^--scale-rewards: batch needs"):
        train.resolve_flags(train.parse_args(["--scale-rewards", "batch", "--batch-size", "2"]))


def test_levels_are_logged_and_the_curve_is_drawn(tmp_path, capsys):
    train.train(train.parse_args(["--steps", "3", "--num-generations", "2", "--max-new-tokens", "6",
                                  "--out", str(tmp_path)]))
    last = capsys.readouterr().out.strip().split("\n")[-1]  # the demo's last line names what to open
    assert last == (f"wrote {tmp_path}/: curve.svg (the learning curve), metrics.jsonl, completions.jsonl "
                    "(what the agents wrote) and the 2 agents, agent_*"), last
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        levels = [r[f"level_{k}"] for k in ("vocabulary", "variety", "ratio")]
        assert sum(levels) == pytest.approx(r["reward_mean"])  # the demo's reward is the sum of its levels
    svg = (tmp_path / "curve.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<polyline") == 4 and "level_variety" in svg
    assert 'stroke-dasharray="4,4"' in svg  # the demo's maximum, 3, on the y axis
    assert json.loads((tmp_path / "args.json").read_text())["top_p"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("lora", [[], ["--lora-r", "4"]], ids=["full", "lora"])
def test_torchrun_two_processes_train_as_one(tmp_path, lora):
    """torchrun x2 (gloo, CPU): each process samples half of every step's prompts; the steps equal
    one process's (step 0 to float precision, then close), each logged once, and the processes'
    agents stay identical (train.py compares their weights at every checkpoint and would stop).
    With LoRA only the adapters' gradients travel."""
    flags = ["--steps", "4", "--num-generations", "4", "--max-new-tokens", "8", "--batch-size", "2", "--save-every", "2",
             *lora]
    train.train(train.parse_args(flags + ["--out", str(tmp_path / "one")]))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py", *flags,
                        "--out", str(tmp_path / "two")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONFAULTHANDLER": "1"})  # a crash shows where it was
    assert p.returncode == 0, p.stderr[-3000:]
    one, two = rows_of(tmp_path / "one"), rows_of(tmp_path / "two")
    assert [r["step"] for r in two] == [0, 1, 2, 3]
    assert two[0]["reward_mean"] == one[0]["reward_mean"] and two[0]["reward_max"] == one[0]["reward_max"]
    for a, b in zip(one, two):
        for key in ("reward_mean", "loss_0", "loss_1", "grad_norm_0", "grad_norm_1"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), (a["step"], key)
    assert json.loads((tmp_path / "two" / "args.json").read_text())["world_size"] == 2
    assert p.stdout.count("wrote ") == 1  # process 0 alone reports and saves
    c1, c2 = completions_of(tmp_path / "one"), completions_of(tmp_path / "two")  # every process's rows once
    assert len(c2) == 4 * 2 * 4 and c2[:8] == c1[:8]  # step 0: the same joint actions, to the bit


def test_weights_digest_tells_agents_apart():
    agents = [models.Agent(models.tiny_model(models.tiny_tokenizer(), seed=s), None) for s in (0, 0, 1)]
    a, b, c = (runs.weights_digest([x]) for x in agents)
    assert a == b and a != c
    with torch.no_grad():
        next(agents[1].model.parameters())[0, 0] += 1e-3
    assert runs.weights_digest([agents[1]]) != a


def test_master_weights_keep_updates_bf16_would_round_away():
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = models.MasterWeightAdamW([w], lr=1e-4)  # 1 - 1e-4 is not representable in bf16
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


def test_master_weights_hold_no_gradient_between_steps(tmp_path):
    """Between steps a bf16 weight costs its master and AdamW's moments only: neither the bf16 nor the
    fp32 gradient outlives the step (each would be 2 or 4 more bytes per parameter)."""
    model = models.tiny_model(models.tiny_tokenizer()).to(torch.bfloat16)
    opt = models.make_optimizer(model, 1e-3)
    assert isinstance(opt, models.MasterWeightAdamW)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert all(m.grad is None for m in opt.master) and all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
    state = opt.inner.state[opt.master[0]]
    assert state["exp_avg"].dtype == torch.float32 and int(state["step"]) == 1


def test_wandb_without_the_package_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        train.train(train.parse_args(["--steps", "3", "--out", str(out), "--wandb", "magrpo-test"]))
    assert stop.value.code == "train.py: error: --wandb: the wandb package is not installed: pip install wandb"
    assert not out.exists()


def test_wandb_logs_every_metrics_row_and_the_completions_offline(tmp_path, monkeypatch):
    """WANDB_MODE=offline: wandb writes its run under OUT/wandb and sends nothing."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    train.train(train.parse_args(["--steps", "3", "--out", str(out), "--wandb", "magrpo-test"]))
    (run,) = (out / "wandb").glob("offline-run-*")
    # The run's records, numbers as JSON text. wandb's own service process writes them, and under load
    # it may finish writing a moment after finish() has returned, so the test waits for the last row.
    deadline, rows = time.monotonic() + 60, rows_of(out)
    while True:
        log = next(run.glob("run-*.wandb")).read_bytes()
        if json.dumps(rows[-1]["loss_0"]).encode() in log or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(rows) == 3 and b"reward_mean" in log and b"level_variety" in log
    for row in rows:
        assert json.dumps(row["reward_mean"]).encode() in log and json.dumps(row["loss_0"]).encode() in log
    tables = list((run / "files" / "media" / "table").glob("completions_*.table.json"))
    assert len(tables) == 3  # one table per step, as completions.jsonl's rows
    logged = [json.loads(t.read_text()) for t in tables]
    assert all(t["columns"] == list(completions_of(out)[0]) for t in logged)
    assert sum(len(t["data"]) for t in logged) == len(completions_of(out))


def test_note_raw_prompts_says_when_an_instruct_model_runs_to_the_cap(capsys):
    """Raw prompts and a tokenizer with a chat template: most completions at --max-new-tokens is an
    instruct model that never reaches its end-of-turn token; one line says so and names the flag."""
    from types import SimpleNamespace
    tok = models.tiny_tokenizer()
    capped = torch.ones(4, 6, dtype=torch.long)  # four completions of 6 tokens: all at a cap of 6
    turns = [SimpleNamespace(rollouts=[SimpleNamespace(completion_mask=capped)])]
    agent = models.Agent(None, tok)
    train.note_raw_prompts([agent], turns, max_new_tokens=6)
    assert capsys.readouterr().err == ""  # no chat template: a base model, nothing to say
    tok.chat_template = "{{ messages }}"
    train.note_raw_prompts([agent], turns, max_new_tokens=8)
    assert capsys.readouterr().err == ""  # below the cap
    train.note_raw_prompts([agent], turns, max_new_tokens=6)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4 of agent 0's 4 completions" in err and "--chat-template" in err

# -----------------------------------------------------------------------------
# A run's inputs, checked before anything is written, and what args.json records of them


def test_cpu_threads_one_for_the_tiny_model_unless_the_flag_or_omp_num_threads_says(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert models.cpu_threads(None, tiny=True) == 1
    assert models.cpu_threads(None, tiny=False) == models.TORCH_THREADS  # a real model: every core
    assert models.cpu_threads(3, tiny=True) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's (torchrun sets 1 per process)
    assert models.cpu_threads(None, tiny=True) == 2 and models.cpu_threads(5, tiny=True) == 5
    with pytest.raises(ValueError, match="--cpu-threads: must be >= 1"):
        models.cpu_threads(0, tiny=True)


def test_a_tiny_run_uses_one_thread_and_args_json_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train.train(train.parse_args(["--steps", "1", "--num-generations", "2", "--max-new-tokens", "4",
                                      "--out", str(tmp_path)]))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert json.loads((tmp_path / "args.json").read_text())["cpu_threads"] == 1


def test_device_auto_keeps_the_tiny_model_on_the_cpu_and_args_json_records_what_the_run_used(
        tmp_path, monkeypatch, capsys):
    """A machine with a GPU (pretended): --device auto leaves the tiny model on the CPU and says so,
    and args.json records the device and dtype the run used, not "auto"; a resume with the default
    --dtype auto continues the run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    argv = ["--steps", "1", "--num-generations", "2", "--max-new-tokens", "4", "--out", str(tmp_path)]
    train.train(train.parse_args(argv))
    assert "device: cpu (--device auto keeps the tiny model on the CPU" in capsys.readouterr().err
    saved = json.loads((tmp_path / "args.json").read_text())
    assert (saved["device"], saved["dtype"]) == ("cpu", "float32")
    train.train(train.parse_args(argv[:1] + ["2"] + argv[2:] + ["--resume"]))
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def flags_of(saved):
    """The command line that args.json describes: each value as its flag (a list: a comma list)."""
    argv = []
    for name, value in saved.items():
        if name in ("world_size", "resume") or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    return argv


def test_args_json_holds_the_resolved_values_and_repeats_the_run(tmp_path):
    out = tmp_path / "run"
    train.train(train.parse_args(["--steps", "1", "--num-generations", "2", "--max-new-tokens", "4",
                                  "--out", str(out)]))
    saved = json.loads((out / "args.json").read_text())
    assert saved["model"] == ["tiny"] and saved["num_agents"] == 2 and saved["split"] == "train"
    assert (saved["termination_threshold"], saved["turn_weights"], saved["cpu_threads"]) == (3.0, "1", 1)
    # None is left only where a flag is off, or where the value comes from each row or model.
    off = {"dataset", "text_field", "feedback_model", "lora_alpha", "lora_target_modules", "wandb"}
    assert {name for name, value in saved.items() if value is None} <= off
    # Its values as flags resolve to the same run: args.json is enough to read it and run it again.
    args = train.parse_args(flags_of(saved))
    train.resolve_flags(args)
    assert vars(args) == saved


def test_resume_accepts_the_nones_an_earlier_version_saved_for_what_is_filled_now(tmp_path):
    out = tmp_path / "run"
    flags = ["--num-generations", "2", "--max-new-tokens", "4", "--save-every", "1", "--out", str(out)]
    train.train(train.parse_args(["--steps", "1", *flags]))
    path = out / "checkpoint-1" / runs.CHECKPOINT_STATE
    state = json.loads(path.read_text())
    state["args"].update(dict.fromkeys(runs.FILLED))  # as a run of the earlier version saved it
    path.write_text(json.dumps(state))
    train.train(train.parse_args(["--steps", "2", "--resume", *flags]))
    assert [r["step"] for r in rows_of(out)] == [0, 1]


def test_a_model_without_a_tokenizer_is_one_line_naming_model_and_out_stays_empty(tmp_path):
    model_dir, out = tmp_path / "model", tmp_path / "run"
    models.tiny_model(models.tiny_tokenizer()).save_pretrained(model_dir)  # the weights alone
    p = cli("--model", str(model_dir), "--out", str(out))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("train.py: error: --model: ") and "no usable tokenizer" in line
    assert not out.exists()  # so the same command, with a tokenizer, is not refused


def test_out_naming_a_file_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    def load_agent(*args, **kwargs):
        raise AssertionError("a model was loaded before --out was checked")
    monkeypatch.setattr(models, "load_agent", load_agent)
    (tmp_path / "notes.txt").write_text("mine")
    for out, why in ((tmp_path / "notes.txt", "is a file, not a directory"),
                     (tmp_path / "notes.txt" / "run", "is a file, not a directory")):
        with pytest.raises(SystemExit, match=f"^train.py: error: --out: .*{why}"):
            train.train(train.parse_args(["--out", str(out)]))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_run_that_fails_before_its_first_step_leaves_out_as_it_found_it(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("the sampler broke")
    monkeypatch.setattr(magrpo, "train_step", crash)  # the tree's step, and the one-turn step's
    monkeypatch.setattr(magrpo, "single_turn_step", crash)
    new, empty = tmp_path / "new", tmp_path / "empty"
    empty.mkdir()
    for out in (new, empty):
        with pytest.raises(RuntimeError, match="the sampler broke"):
            train.train(train.parse_args(["--steps", "2", "--out", str(out)]))
    assert not new.exists() and empty.is_dir() and not list(empty.iterdir())
    monkeypatch.undo()  # fixed: the same command runs, where it was refused ("already holds a run")
    train.train(train.parse_args(["--steps", "1", "--num-generations", "2", "--max-new-tokens", "4",
                                  "--out", str(new)]))
    assert [r["step"] for r in rows_of(new)] == [0]


def test_the_learning_rate_schedule_of_docs_runs_md_sets_every_agents_optimizer():
    """docs/runs.md's three lines, run as a forker pastes them into train()'s loop: each agent's
    optimizer, plain AdamW or the fp32-master one of bf16 agents, steps at the scheduled rate."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "runs.md").read_text()
    section = page.split("## Changing the loop: a learning-rate schedule", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    tok = models.tiny_tokenizer()
    agents = []
    for dtype in (torch.float32, torch.bfloat16):
        model = models.tiny_model(tok, seed=0).to(dtype)
        agents.append(models.Agent(model, tok, models.make_optimizer(model, 1e-3)))
    assert isinstance(agents[1].optimizer, models.MasterWeightAdamW)
    exec(snippet, {"agents": agents, "args": SimpleNamespace(learning_rate=1e-3), "step": 9})
    for agent in agents:
        assert [group["lr"] for group in agent.optimizer.param_groups] == [pytest.approx(1e-4)]
