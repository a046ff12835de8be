"""train.py end to end on the CPU demo: the reward rises, the outputs are written and load back, and a
bad flag is one clear line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train

ROOT = Path(__file__).resolve().parent.parent


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


def test_in_training_eval_and_periodic_saves(tmp_path):
    train.train(train.parse_args(["--steps", "4", "--eval-every", "2", "--eval-limit", "3",
                                  "--save-every", "2", "--out", str(tmp_path)]))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval_reward_mean" in r] == [0, 2, 3]
    assert all(0.0 <= r["eval_reward_mean"] <= 3.0 for r in rows if "eval_reward_mean" in r)
    assert json.loads((tmp_path / "args.json").read_text())["eval_every"] == 2
    assert (tmp_path / "agent_1" / "config.json").exists()


def test_eval_rewards_are_the_greedy_joint_reward_per_turn(tmp_path):
    import envs
    import magrpo
    env = envs.DemoEnv(split="eval")
    tok = magrpo.tiny_tokenizer()
    agents = [magrpo.Agent(magrpo.tiny_model(tok, seed=i, init_std=0.5), tok) for i in range(2)]
    cfg = magrpo.Config(max_new_tokens=10, num_turns=2, termination_threshold=99)
    got = train.eval_rewards(agents, env, cfg, limit=5, batch_size=2)
    outs = [magrpo.generate(a.model, tok, [env.prompts(ex)[i] for ex in env.examples[:5]], 1, 10, 0).texts
            for i, a in enumerate(agents)]
    joint = [(outs[0][b][0], outs[1][b][0]) for b in range(5)]
    first = [float(env.reward(ex, j)) for ex, j in zip(env.examples[:5], joint)]
    assert got[0] == pytest.approx(sum(first) / 5)
    revised = []  # turn 2 by hand: each agent greedily revises its own answer after its feedback
    for ex, j in zip(env.examples[:5], joint):
        notes = env.feedback(ex, j)
        revised.append(tuple(magrpo.generate(a.model, tok, [env.revision_prompt(ex, i, [(j[i], notes[i])])], 1, 10, 0).texts[0][0]
                             for i, a in enumerate(agents)))
    assert got[1] == pytest.approx(sum(float(env.reward(ex, r)) for ex, r in zip(env.examples[:5], revised)) / 5)


def test_bf16_agents_train_with_fp32_master_weights(tmp_path):
    import magrpo
    args = train.parse_args(["--steps", "2", "--dtype", "bfloat16", "--out", str(tmp_path)])
    env, agents, cfg, expert = train.resolve(args)
    assert all(a.model.dtype == torch.bfloat16 for a in agents)
    assert all(isinstance(a.optimizer, magrpo.MasterWeightAdamW) for a in agents)
    train.train(train.parse_args(["--steps", "2", "--dtype", "bfloat16", "--out", str(tmp_path)]))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["skipped_0"] == 0 for r in rows)
