"""NGU's auxiliary networks (Badia et al. 2020, sec. 2 and App. H), each on the newest 84x84 frame.

- `EmbeddingNet` f: the controllable-state embedding (p = 32) whose neighbours give the episodic
  novelty; trained through `InverseDynamics` h, which predicts a_t from (f(x_t), f(x_{t+1})).
- `RandomNetworkDistillation`: a fixed random target g and a trained predictor g^; the error
  ||g^(x) - g(x)||^2 is the life-long novelty that lbc.ngu.lifelong_modulator normalises.
App. H's figures are missing from the text; the layer sizes are the digest's reading (seeds_003_004
A4): three convolutions 32@8x8/4, 64@4x4/2, 64@3x3/1, then a linear layer; the inverse head is one
hidden layer of 128. On the small built-in games (Catch) the convolutions are one fully connected
layer of 64.
"""

from __future__ import annotations

import torch
from torch import nn


def newest_frame(obs: torch.Tensor) -> torch.Tensor:
    """[N, stack, H, W] uint8 frame stacks -> [N, 1, H, W] floats in [0, 1] of the newest frame."""
    return obs[:, -1:].float().div(255.0)


def _torso(frame_size: tuple[int, int]) -> tuple[nn.Sequential, int]:
    """Three convolutions on an Atari frame; one fully connected layer on a small one (Catch)."""
    h, w = frame_size
    if min(h, w) >= 36:
        layers = nn.Sequential(nn.Conv2d(1, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                               nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
    else:
        layers = nn.Sequential(nn.Flatten(), nn.Linear(h * w, 64), nn.ReLU())
    with torch.no_grad():
        n = layers(torch.zeros(1, 1, h, w)).shape[-1]
    return layers, n


class EmbeddingNet(nn.Module):
    """f: O -> R^p (p = 32, App. B.1). The output layer is linear: with a ReLU there, 30 of the 32 units
    were dead after 500 learner steps on Pong and the episodic reward went flat (docs/decisions.md 27)."""

    def __init__(self, frame_size: tuple[int, int] = (84, 84), dim: int = 32) -> None:
        super().__init__()
        self.torso, n = _torso(frame_size)
        self.out = nn.Linear(n, dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, stack, H, W] uint8 -> [N, p]."""
        return self.out(self.torso(newest_frame(obs)))


class InverseDynamics(nn.Module):
    """h: p(a | x_t, x_{t+1}) = softmax(MLP([f(x_t), f(x_{t+1})])), one hidden layer of 128."""

    def __init__(self, dim: int, num_actions: int, hidden: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 * dim, hidden), nn.ReLU(), nn.Linear(hidden, num_actions))

    def forward(self, emb: torch.Tensor, emb_next: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([emb, emb_next], dim=-1))


def inverse_dynamics_loss(embed: EmbeddingNet, head: InverseDynamics, obs: torch.Tensor, obs_next: torch.Tensor,
                          actions: torch.Tensor, l2: float = 1e-5, mask: torch.Tensor | None = None) -> torch.Tensor:
    """-log p(a_t | x_t, x_{t+1}) averaged over the triplets where mask is 1 (all when None), plus
    l2 * ||weights of h||^2 (NGU Table 6: 1e-5)."""
    nll = nn.functional.cross_entropy(head(embed(obs), embed(obs_next)), actions, reduction="none")
    mean = nll.mean() if mask is None else (nll * mask).sum() / mask.sum().clamp_min(1.0)
    penalty = sum(p.pow(2).sum() for name, p in head.named_parameters() if name.endswith("weight"))
    return mean + l2 * penalty


class RandomNetworkDistillation(nn.Module):
    """g (fixed, random) and g^ (trained): err(x) = ||g^(x) - g(x)||^2 (NGU sec. 2, Burda et al. 2019)."""

    def __init__(self, frame_size: tuple[int, int] = (84, 84), dim: int = 128) -> None:
        super().__init__()
        torso, n = _torso(frame_size)
        self.target = nn.Sequential(torso, nn.Linear(n, dim))
        torso, n = _torso(frame_size)
        self.predictor = nn.Sequential(torso, nn.Linear(n, dim))
        self.target.requires_grad_(False)

    def error(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, stack, H, W] uint8 -> err [N]; the gradient reaches only the predictor."""
        x = newest_frame(obs)
        with torch.no_grad():
            target = self.target(x)
        return (self.predictor(x) - target).pow(2).sum(-1)


class NguAux(nn.Module):
    """NGU's networks beside the Q-network: the embedding f with its inverse-dynamics head, and RND.
    The learner trains them; actors use f and RND to compute intrinsic rewards."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, embedding_dim: int = 32,
                 rnd_dim: int = 128) -> None:
        super().__init__()
        frame = (obs_shape[-2], obs_shape[-1])
        self.embedding = EmbeddingNet(frame, embedding_dim)
        self.inverse = InverseDynamics(embedding_dim, num_actions)
        self.rnd = RandomNetworkDistillation(frame, rnd_dim)

    def loss(self, obs: torch.Tensor, obs_next: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor,
             l2: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(inverse-dynamics loss, RND loss) on triplets (x_t, a_t, x_{t+1}), [M, ...] each; mask [M] is 0
        where x_{t+1} starts a new episode (no transition to predict). RND trains on every x_t."""
        inverse = inverse_dynamics_loss(self.embedding, self.inverse, obs, obs_next, actions, l2, mask)
        return inverse, self.rnd.error(obs).mean()


class NguAgent(nn.Module):
    """What an NGU learner publishes and an NGU actor loads: the Q-network and the auxiliary networks."""

    def __init__(self, net: nn.Module, aux: NguAux) -> None:
        super().__init__()
        self.net = net
        self.aux = aux
