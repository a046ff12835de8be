"""
Environments: for one dataset example, one prompt per agent, and one shared reward for the agents'
joint output (the Dec-POMDP of Sec. 1: each agent sees only its own prompt h_i; the reward scores
the joint action). That is the whole interface:

    env.examples                      the dataset split, a list of dicts
    env.prompts(example)              -> [prompt for agent 0, prompt for agent 1, ...]
    env.reward(example, outputs)      -> the shared reward: a float, or an object with .total that
                                         float() accepts (rewards.py's leveled rewards)
    env.rewards(examples, outputs)    -> the same for a batch (an env may score it in parallel)

Built in:
    demo    offline, trainable from scratch in a minute on a CPU
    coding  Sec. 4: a helper agent writes aux(), the main agent the problem's function (HumanEval,
            CoopHumanEval, any HumanEval-format JSONL); --num-agents 1 is the single-agent variant
    tldr    Sec. 5: a concise and a detailed summary of a text
    arxiv   Sec. 5: background/motivation and methods/implications of an abstract
Prompts are raw text (Sec. 4: base models continue them); train.py --chat-template wraps them.
Use:  python train.py --env coding --dataset humaneval --split train
"""
import random
from dataclasses import dataclass


class Env:
    """Base class: subclasses set `name`, `num_agents`, `examples` and define prompts and reward."""
    name = "env"
    num_agents = 2
    agent_names = ()

    def prompts(self, example):
        raise NotImplementedError

    def reward(self, example, outputs):
        raise NotImplementedError

    def rewards(self, examples, outputs):
        """Shared rewards of a batch of joint actions, in order. Override to score in parallel."""
        return [self.reward(ex, out) for ex, out in zip(examples, outputs)]

    # The baselines of Sec. 6 (eval.py) need agents that see their partners' text. These defaults
    # append it to the agent's own prompt; an env may phrase it better.

    def sequential_prompt(self, example, i, earlier):
        """Agent i's prompt in a sequential pipeline, after agents 0..i-1 wrote `earlier`."""
        seen = "".join(f"\n[{self.agent_names[j] if j < len(self.agent_names) else f'agent {j}'} wrote]\n{text}\n"
                       for j, text in enumerate(earlier))
        return seen + "\n" + self.prompts(example)[i]

    def discussion_prompt(self, example, i, first):
        """Agent i's prompt in a one-round discussion: revise after seeing every first answer."""
        others = [t for j, t in enumerate(first) if j != i]
        return (f"{self.prompts(example)[i]}{first[i]}\n\n[your partner wrote]\n" + "\n".join(others) +
                "\n\n[revise your answer so the two fit together]\n" + self.prompts(example)[i])

    def single_prompt(self, example):
        """One agent does the whole task alone (the single-model baseline)."""
        raise ValueError(f"the {self.name} env has no single-model baseline")

    def single_reward(self, example, output):
        raise ValueError(f"the {self.name} env has no single-model baseline")


# -----------------------------------------------------------------------------
# The demo env: a tiny offline cousin of the paper's TLDR task (Sec. 5)


@dataclass
class DemoReward:
    """The demo's shared reward, in levels like the paper's writing rewards (max 3.0)."""
    vocabulary: float  # mean over agents of the share of characters from that agent's own alphabet
    variety: float     # mean over agents of min(1, distinct own-alphabet letters / 8)
    ratio: float       # 1 when len(agent 1) / len(agent 0) is in the target band, ramps outside
    length_ratio: float

    @property
    def total(self):
        return self.vocabulary + self.variety + self.ratio

    def __float__(self):
        return self.total

    @property
    def levels(self):
        return {"vocabulary": self.vocabulary, "variety": self.variety, "ratio": self.ratio}


def ramp(x, zero_lo, one_lo, one_hi, zero_hi):
    """1 on [one_lo, one_hi], linear down to 0 at zero_lo and zero_hi, 0 beyond (the paper's ramps)."""
    if one_lo <= x <= one_hi:
        return 1.0
    if zero_lo < x < one_lo:
        return (x - zero_lo) / (one_lo - zero_lo)
    if one_hi < x < zero_hi:
        return (zero_hi - x) / (zero_hi - one_hi)
    return 0.0


TOPICS = ("cats rain music river bread maps snow tea clocks ships stars wind paper gold salt "
          "moss bells kites lamps fish wool glass sand smoke").split()


class DemoEnv(Env):
    """Two writers, like TLDR's concise and detailed summarisers: agent 0 writes a short headline in
    letters a-m, agent 1 a body 2-4x as long in letters n-z, each using a varied vocabulary (at
    least 8 distinct letters). The length ratio is a joint reward: neither agent can reach it alone,
    each must fit the other's length. Scores are on characters, so a model trained from scratch
    learns it in a few hundred steps."""
    name = "demo"
    num_agents = 2
    agent_names = ("headline", "body")
    alphabets = (set("abcdefghijklm "), set("nopqrstuvwxyz "))
    band = (1.0, 2.0, 4.0, 6.0)  # ratio ramps up over [1, 2], is 1 on [2, 4], down to 0 at 6

    def __init__(self, num_examples=64, seed=0, num_agents=2, dataset=None, split=None):
        if num_agents != 2:
            raise ValueError(f"the demo env has exactly 2 agents, not {num_agents}")
        if dataset or split:
            raise ValueError("the demo env has its own built-in topics: it takes no dataset or split")
        rng = random.Random(seed)
        self.examples = [{"topic": rng.choice(TOPICS), "id": i} for i in range(num_examples)]

    def prompts(self, example):
        t = example["topic"]
        return [f"Topic: {t}. Headline, letters a to m:\n", f"Topic: {t}. Body, letters n to z:\n"]

    def reward(self, example, outputs):
        texts = [o.strip() for o in outputs]
        shares = [sum(c in alpha for c in s) / len(s) if s else 0.0
                  for s, alpha in zip(texts, self.alphabets)]
        variety = [min(1.0, len(set(s) & alpha - {" "}) / 8) for s, alpha in zip(texts, self.alphabets)]
        ratio = len(texts[1]) / len(texts[0]) if texts[0] else 0.0
        return DemoReward(sum(shares) / 2, sum(variety) / 2, ramp(ratio, *self.band), ratio)


ENVS = {"demo": DemoEnv}


def make_env(name, **kwargs):
    """The env called `name` (train.py/eval.py --env), built with its keyword options."""
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}: choose from {', '.join(sorted(ENVS))}")
    return ENVS[name](**kwargs)
