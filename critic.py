"""
A learned value V(s) in place of Eq. 1's group mean (--advantage critic): each completion's advantage is
A = R - V(s), the return it earned minus the value of the state it was sampled from. The authors'
actor-critic comparisons train the same teams this way (their CoMLRL library's MAAC and IAC; Liu et
al., "CoLLM", arXiv 2601.21972, CoLLM-CC and CoLLM-DC). Two critics (--critic):

    central    one V(s) of the joint state, every agent's prompt (with its history at later turns),
               shared by all agents' advantages (MAAC, CoLLM-CC)
    per-agent  each agent's own V_i(h_i) of its own prompt alone: the critic of agent i sees nothing
               of its partners, so its training stays decentralised too (IAC, CoLLM-DC)

A value is a linear head on the last hidden state of the prompt's last token, read under no_grad from
the agent as the run began, frozen (a LoRA team's shared base, its adapters off; else a frozen copy):
a feature that moved with every policy step would leave the head chasing it. The policy's gradient is
untouched by the critic. The heads have their own Adam, and fit once per step, after their values
gave the step's advantages, by FIT_STEPS steps on the mean squared error to the returns of the latest
REPLAY_STEPS steps' states (docs/critic.md says why, and what the demo shows).
"""
import contextlib
import copy

import torch

import models

REPLAY_STEPS = 16  # the heads fit the states of this many latest steps: a step has a few states only
FIT_STEPS = 20     # Adam steps per fit


class Critic:
    """The value heads of a team's agents: one on all their prompt features (central), or one per agent
    on its own (per-agent). The heads start at 0, so that V = 0 (A = R) until they have learnt."""

    def __init__(self, agents, mode="central", learning_rate=1e-3, start=None):
        """start: the agents as the run began, if `agents` are no longer those (a resumed run's)."""
        if mode not in ("central", "per-agent"):
            raise ValueError(f"--critic: use central or per-agent, got {mode!r}")
        self.agents, self.mode = agents, mode
        # A LoRA agent's base is frozen already, and read with the adapters off. Another agent is copied,
        # unless `start` holds it as it began already (loaded for the critic alone).
        self.readers = []
        for agent, begun in zip(agents, start or agents):
            reader = agent.model
            if not models.is_lora(reader):
                reader = (begun.model if start else copy.deepcopy(reader)).requires_grad_(False).eval()
            self.readers.append(reader)
        self.replay = []  # (features, returns) of the latest REPLAY_STEPS steps
        widths = [agent.model.config.hidden_size for agent in agents]
        self.heads = torch.nn.ModuleList([torch.nn.Linear(w, 1) for w in
                                          ([sum(widths)] if mode == "central" else widths)])
        for p in self.heads.parameters():
            torch.nn.init.zeros_(p)
        self.optimizer = torch.optim.Adam(self.heads.parameters(), lr=learning_rate)

    @torch.no_grad()
    def features(self, states):
        """Per agent, [states, H_i]: the last hidden state, at the last token of its own prompt in each
        state (a state: one prompt per agent), of the agent as the run began, in float32 on the CPU."""
        features = []
        for i, (agent, reader) in enumerate(zip(self.agents, self.readers)):
            rows = []
            with adapters_off(reader):
                for prompts in states:
                    text = agent.format(prompts[i])
                    ids = agent.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
                    out = reader(input_ids=ids.to(reader.device), output_hidden_states=True)
                    rows.append(out.hidden_states[-1][0, -1].float().cpu())
            features.append(torch.stack(rows))
        return features

    def predict(self, features):
        """Per agent, [states]: the value of each state its advantages subtract (central: one for all)."""
        if self.mode == "central":
            return [self.heads[0](torch.cat(features, dim=-1)).squeeze(-1)] * len(self.agents)
        return [head(x).squeeze(-1) for head, x in zip(self.heads, features)]

    @torch.no_grad()
    def values(self, features):
        """V of each state, per agent, [states], as the advantages take it (no gradient)."""
        return self.predict(features)

    def errors(self, values, returns):
        """R - V of every row of every head, flat: returns [states, J], values the heads' predict (the
        central head's one value of each state, or each per-agent head's)."""
        heads = values[:len(self.heads)]  # the central head's one value counted once
        return torch.cat([(returns - value[:, None]).reshape(-1) for value in heads])

    def fit(self, features, returns, all_sum=lambda x: x):
        """Fit the heads to this step's returns, [states, J] (each state's J joint actions), from the
        features that gave its values, and to the latest REPLAY_STEPS steps': FIT_STEPS Adam steps on the
        mean squared error. -> critic_loss and critic_explained_variance, 1 - Var(R - V) / Var(R), of this
        step's rows and the values before the fit, those of the advantages; all_sum sums over processes. A
        NaN return (no verdict) is no target."""
        gaps = self.errors(self.values(features), returns)  # with the values that gave the advantages
        heads = len(gaps) // returns.numel()
        count, r, r2, e, e2 = all_sum([int((~gaps.isnan()).sum()), float(returns.nansum()) * heads,
                                     float((returns ** 2).nansum()) * heads, float(gaps.nansum()),
                                     float((gaps ** 2).nansum())])
        spread = r2 / count - (r / count) ** 2
        explained = 1 - (e2 / count - (e / count) ** 2) / spread if spread > 1e-12 else None
        # A step holds a few states only, too few to learn from alone; older returns were earned by older
        # policies, so only the latest steps' are kept.
        self.replay = (self.replay + [(features, returns)])[-REPLAY_STEPS:]
        features_kept, returns_kept = zip(*self.replay)
        states = [torch.cat(rows) for rows in zip(*features_kept)]  # per agent, every kept step's states
        targets = torch.cat(returns_kept)
        (rows,) = all_sum([heads * int((~targets.isnan()).sum())])
        for _ in range(FIT_STEPS):
            self.optimizer.zero_grad(set_to_none=True)
            # A NaN target gives no gradient.
            squares = self.errors(self.predict(states), targets).nan_to_num(0.0).pow(2)
            (squares.sum() / rows).backward()  # this process's share of the mean
            for p in self.heads.parameters():
                p.grad = all_sum(p.grad)
            self.optimizer.step()
        return {"critic_loss": e2 / count, "critic_explained_variance": explained}

    def state_dict(self):
        return {"heads": self.heads.state_dict(), "optimizer": self.optimizer.state_dict(),
                "replay": self.replay}

    def load_state_dict(self, state):
        self.heads.load_state_dict(state["heads"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay = state.get("replay", [])  # (a critic saved before the replay starts without one)


@contextlib.contextmanager
def adapters_off(model):
    """The model without its LoRA adapters (models.LoRALinear), i.e. their shared frozen base."""
    scalings = {m: m.scaling for m in model.modules() if isinstance(m, models.LoRALinear)}
    for m in scalings:
        m.scaling = 0.0
    try:
        yield model
    finally:
        for m, scaling in scalings.items():
            m.scaling = scaling
