"""A sequence replayed by the learner reproduces what the actor computed: starting from the stored
LSTM state and running the burn-in then the learning steps, the network gives back the recorded
behaviour probabilities mu(a_t|x_t) at every step, across episode boundaries inside the sequence."""

from __future__ import annotations

import numpy as np
import torch

from actor_svc.sequencer import SequenceBuilder
from lbc.behaviour import behaviour_probs, sample_actions
from lbc.config import load_config
from lbc.envs import make_envs
from lbc.nets import build_net
from lbc.sequences import sequence_layout
from learner_svc.training import to_time_major


def test_replayed_sequences_reproduce_the_actors_behaviour_probabilities() -> None:
    cfg = load_config("catch", ["sequence.burn_in=3", "sequence.length=7"])
    envs = make_envs(cfg.env, 4, seed=3)
    torch.manual_seed(0)
    net = build_net(cfg, envs.spec.obs_shape, envs.spec.num_actions).eval()
    n = cfg.num_policies
    builder = SequenceBuilder(4, cfg.sequence.burn_in, sequence_layout(cfg))
    gen = torch.Generator().manual_seed(1)
    tau = torch.rand(4, n, generator=gen) * 5
    omega = torch.softmax(torch.randn(4, n, generator=gen), -1)
    psi = torch.cat([tau, omega], 1).numpy()
    obs, state = envs.reset(), net.initial_state(4)
    prev_action, prev_reward, reset = np.zeros(4, np.int64), np.zeros(4, np.float32), np.ones(4, bool)
    sequences = []
    with torch.no_grad():
        for _ in range(60):
            sequences += [s for s, _ in builder.observe(obs, prev_action, prev_reward, reset, state[0].numpy(),
                                                        state[1].numpy(), 0)]
            out = net(torch.from_numpy(obs)[None], torch.from_numpy(prev_action)[None],
                      torch.from_numpy(prev_reward)[None], torch.from_numpy(reset)[None], state)
            probs = behaviour_probs(cfg.behaviour.family, out.adv[0], tau, omega)
            actions, mu = sample_actions(probs, gen)
            result = envs.step(actions.numpy())
            builder.act(actions.numpy(), result.reward, result.done, mu.numpy(), psi)
            obs, state = result.obs, out.state
            prev_action = np.where(result.done, 0, actions.numpy())
            prev_reward = np.where(result.done, 0.0, result.reward).astype(np.float32)
            reset = result.done
    assert len(sequences) >= 16
    assert any(s["done"].any() for s in sequences), "no episode boundary inside a sequence"

    batch = {k: np.stack([s[k] for s in sequences]) for k in sequences[0]}
    b = to_time_major(batch)
    with torch.no_grad():
        out = net(b["obs"][:-1], b["prev_action"][:-1].long(), b["prev_reward"][:-1], b["reset"][:-1],
                  (b["h0"], b["c0"]))
    seq_psi = b["psi"]                                             # [L, B, 2N]
    probs = behaviour_probs(cfg.behaviour.family, out.adv, seq_psi[..., :n], seq_psi[..., n:])
    replayed = probs.gather(-1, b["action"].long().unsqueeze(-1)).squeeze(-1)
    np.testing.assert_allclose(replayed.numpy(), b["behaviour_prob"].numpy(), rtol=1e-4, atol=1e-6)
