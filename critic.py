"""
A learned value V(s) in place of Eq. 1's group mean (--advantage critic): each completion's advantage is
A = R - V(s), the return it earned minus the value of the state it was sampled from. The authors'
actor-critic comparisons train the same teams this way (their CoMLRL library's MAAC and IAC; Liu et
al., "CoLLM", arXiv 2601.21972, CoLLM-CC and CoLLM-DC). Two critics (--critic):

    central    one V(s) of the joint state, every agent's prompt (with its history at later turns),
               shared by all agents' advantages (MAAC, CoLLM-CC)
    per-agent  each agent's own V_i(h_i) of its own prompt alone: the critic of agent i sees nothing
               of its partners, so its training stays decentralised too (IAC, CoLLM-DC)

A value is a linear head on the last hidden state of the prompt's last token, from the agent's own
model under no_grad: the base is frozen for the critic, and the policy's gradient is untouched by it.
The heads have their own Adam, and fit the returns by mean squared error once per step, after their
values gave the step's advantages (docs/critic.md says why, and what the demo shows).
"""
import torch


class Critic:
    """The value heads of a team's agents: one on all their prompt features (central), or one per agent
    on its own (per-agent). The heads start at 0, so that V = 0 (A = R) until they have learnt."""

    def __init__(self, agents, mode="central", learning_rate=1e-3):
        if mode not in ("central", "per-agent"):
            raise ValueError(f"--critic: use central or per-agent, got {mode!r}")
        self.agents, self.mode = agents, mode
        widths = [agent.model.config.hidden_size for agent in agents]
        self.heads = torch.nn.ModuleList([torch.nn.Linear(w, 1) for w in
                                          ([sum(widths)] if mode == "central" else widths)])
        for p in self.heads.parameters():
            torch.nn.init.zeros_(p)
        self.optimizer = torch.optim.Adam(self.heads.parameters(), lr=learning_rate)

    @torch.no_grad()
    def features(self, states):
        """Per agent, [states, H_i]: its model's last hidden state at the last token of its own prompt
        in each state (a state: one prompt per agent), in float32 on the CPU where the heads are."""
        features = []
        for i, agent in enumerate(self.agents):
            rows = []
            for prompts in states:
                ids = agent.tokenizer(agent.format(prompts[i]), return_tensors="pt", add_special_tokens=False)
                ids = ids["input_ids"].to(agent.model.device)
                out = agent.model(input_ids=ids, output_hidden_states=True)
                rows.append(out.hidden_states[-1][0, -1].float().cpu())
            features.append(torch.stack(rows))
        return features

    def predict(self, features):
        """Per agent, [states]: the value of each state its advantages subtract (central: one for all)."""
        if self.mode == "central":
            return [self.heads[0](torch.cat(features, dim=-1)).squeeze(-1)] * len(self.agents)
        return [head(x).squeeze(-1) for head, x in zip(self.heads, features)]

    def values(self, features):
        """V of each state, per agent, [states], as the advantages take it (no gradient)."""
        with torch.no_grad():
            return self.predict(features)

    def fit(self, features, returns, total=lambda x: x):
        """One Adam step of the heads on the mean squared error to the returns, [states, J] (each state's
        J joint actions), from the states' features (those that gave the values: the agents have not
        changed since). -> critic_loss and critic_explained_variance, 1 - Var(R - V) / Var(R), both of
        the values before this step, the ones that gave the advantages; total sums over processes."""
        predicted = self.predict(features)
        heads = predicted[:1] if self.mode == "central" else predicted  # one shared value, or one per agent
        errors = torch.cat([(returns - value[:, None]).reshape(-1) for value in heads])
        gaps = errors.detach()
        count, r, r2, e, e2 = total([len(gaps), float(returns.sum()) * len(heads),
                                     float((returns ** 2).sum()) * len(heads), float(gaps.sum()),
                                     float((gaps ** 2).sum())])
        self.optimizer.zero_grad(set_to_none=True)
        ((errors ** 2).sum() / count).backward()  # each process's share of the whole batch's mean
        for p in self.heads.parameters():
            p.grad = total(p.grad)
        self.optimizer.step()
        spread = r2 / count - (r / count) ** 2
        explained = 1 - (e2 / count - (e / count) ** 2) / spread if spread > 1e-12 else None
        return {"critic_loss": e2 / count, "critic_explained_variance": explained}

    def state_dict(self):
        return {"heads": self.heads.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state):
        self.heads.load_state_dict(state["heads"])
        self.optimizer.load_state_dict(state["optimizer"])
