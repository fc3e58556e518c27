"""Networks: IMPALA small and deep torsos, an LSTM core and N dueling heads (A_i, V_i).

One forward pass yields every policy's head at once: the torso and core are shared, the heads are
one linear layer of N * (|A| + 1) outputs (see docs/decisions.md: shared torso).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


class _ConvTorso(nn.Module):
    """Convolutions, then fc `hidden` + ReLU.

    With channels_last the convolutions run in oneDNN's NHWC layout: measured on a 2-core CPU, the
    small torso's training step is ~10-20% faster, but batch-16 inference is ~40% slower, so the
    learner turns it on and actors do not (see set_channels_last)."""

    def __init__(self, convs: nn.Sequential, in_channels: int, image_size: int, hidden: int) -> None:
        super().__init__()
        self.convs = convs
        with torch.no_grad():
            n = self.convs(torch.zeros(1, in_channels, image_size, image_size)).shape[-1]
        self.fc = nn.Sequential(nn.Linear(n, hidden), nn.ReLU())
        self.memory_format = torch.contiguous_format

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(x.contiguous(memory_format=self.memory_format)))


class SmallTorso(_ConvTorso):
    """IMPALA shallow net: conv 16@8x8/4, conv 32@4x4/2, fc 256 (about 1.2M params with the LSTM)."""

    def __init__(self, in_channels: int, image_size: int, hidden: int) -> None:
        convs = nn.Sequential(nn.Conv2d(in_channels, 16, 8, stride=4), nn.ReLU(),
                              nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(), nn.Flatten())
        super().__init__(convs, in_channels, image_size, hidden)


class _ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class DeepTorso(_ConvTorso):
    """IMPALA deep ResNet: per (channels, blocks) in (16,2),(32,2),(32,2): conv 3x3, max-pool 3x3/2,
    two residual blocks; then ReLU, fc 256. 15 conv layers."""

    def __init__(self, in_channels: int, image_size: int, hidden: int) -> None:
        layers: list[nn.Module] = []
        c_in = in_channels
        for c_out in (16, 32, 32):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       _ResBlock(c_out), _ResBlock(c_out)]
            c_in = c_out
        super().__init__(nn.Sequential(*layers, nn.ReLU(), nn.Flatten()), in_channels, image_size, hidden)


class MlpTorso(nn.Module):
    """For the small built-in games (Catch): two fully connected layers."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: int) -> None:
        super().__init__()
        n = 1
        for d in obs_shape:
            n *= d
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(n, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclass
class NetOutput:
    adv: torch.Tensor    # [T, B, N, A] dueling advantages A_i (mean over actions removed)
    value: torch.Tensor  # [T, B, N]
    state: tuple[torch.Tensor, torch.Tensor]  # LSTM (h, c) after the last step, [B, H] each


class LBCNet(nn.Module):
    """Torso -> LSTM core (input: features, one-hot previous action, clipped previous reward) -> N heads."""

    def __init__(self, torso: str, obs_shape: tuple[int, ...], num_actions: int, num_policies: int,
                 hidden: int = 256, lstm: int = 256, core_input_norm: bool = False) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.num_policies = num_policies
        self.lstm_size = lstm
        if torso == "small":
            self.torso: nn.Module = SmallTorso(obs_shape[0], obs_shape[-1], hidden)
        elif torso == "deep":
            self.torso = DeepTorso(obs_shape[0], obs_shape[-1], hidden)
        elif torso == "mlp":
            self.torso = MlpTorso(obs_shape, hidden)
        else:
            raise ValueError(f"unknown torso {torso!r}")
        # LayerNorm on the core's input keeps its pre-activations centred: without it, Adam's equal-size
        # steps on every weight of a wide, all-positive (ReLU) input saturate the gates within a few
        # hundred steps on Pong, and the cell state becomes a counter that passes no gradient.
        self.core_norm: nn.Module = nn.LayerNorm(hidden + num_actions + 1) if core_input_norm else nn.Identity()
        self.core = nn.LSTMCell(hidden + num_actions + 1, lstm)
        self.heads = nn.Linear(lstm, num_policies * (num_actions + 1))

    def set_channels_last(self, enabled: bool) -> LBCNet:
        """Run the convolutional torso in NHWC layout (faster training, slower small-batch inference)."""
        if isinstance(self.torso, _ConvTorso):
            self.torso.memory_format = torch.channels_last if enabled else torch.contiguous_format
            self.torso.convs.to(memory_format=self.torso.memory_format)
        return self

    def initial_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.zeros(batch, self.lstm_size)
        return z, z.clone()

    def forward(
        self,
        obs: torch.Tensor,
        prev_action: torch.Tensor,
        prev_reward: torch.Tensor,
        reset: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
    ) -> NetOutput:
        """obs [T, B, *obs_shape] uint8; prev_action [T, B] int64; prev_reward [T, B] raw reward;
        reset [T, B] bool, True where x_t starts an episode (the state is zeroed before the step)."""
        steps, batch = obs.shape[:2]
        x = obs.reshape(steps * batch, *obs.shape[2:]).float().div_(255.0)
        feats = self.torso(x).view(steps, batch, -1)
        one_hot = nn.functional.one_hot(prev_action, self.num_actions).to(feats.dtype)
        core_in = self.core_norm(
            torch.cat([feats, one_hot, prev_reward.clamp(-1.0, 1.0).unsqueeze(-1).to(feats.dtype)], -1))
        keep = (~reset).to(feats.dtype).unsqueeze(-1)
        h, c = state
        outs = []
        for t in range(steps):
            h, c = self.core(core_in[t], (h * keep[t], c * keep[t]))
            outs.append(h)
        core_out = torch.stack(outs)
        heads = self.heads(core_out).view(steps, batch, self.num_policies, self.num_actions + 1)
        raw_adv, value = heads[..., :-1], heads[..., -1]
        adv = raw_adv - raw_adv.mean(-1, keepdim=True)
        return NetOutput(adv=adv, value=value, state=(h, c))


def build_net(cfg, obs_shape: tuple[int, ...], num_actions: int) -> LBCNet:
    """The network the configuration describes (cfg: lbc.config.Config)."""
    return LBCNet(cfg.net.torso, obs_shape, num_actions, cfg.num_policies, cfg.net.hidden, cfg.net.lstm,
                  cfg.net.core_input_norm)
