"""Cuts the stream of every environment into fixed-length sequences that overlap by the burn-in.

All environments of an actor advance in lockstep, so one time index serves them all. Per step:
observe(x_t, ...) then act(a_t, ...). When observation L = burn_in + length has been written,
one sequence per environment is complete (L steps, L + 1 observations); its last burn_in steps and
observation L are kept as the start of the next one. `extras` names further per-observation fields
(NGU's mixture and intrinsic reward) and their dtypes.
"""

from __future__ import annotations

import numpy as np


class SequenceBuilder:
    def __init__(self, num_envs: int, burn_in: int, length: int, obs_shape: tuple[int, ...], lstm: int,
                 psi_dim: int, extras: dict[str, str] | None = None) -> None:
        self.burn_in, self.steps = burn_in, burn_in + length
        n, big = num_envs, burn_in + length + 1
        self.obs = np.zeros((n, big, *obs_shape), np.uint8)
        self.prev_action = np.zeros((n, big), np.int32)
        self.prev_reward = np.zeros((n, big), np.float32)
        self.reset = np.zeros((n, big), bool)
        self.h = np.zeros((n, big, lstm), np.float32)
        self.c = np.zeros((n, big, lstm), np.float32)
        self.version = np.zeros(big, np.int64)
        self.action = np.zeros((n, big - 1), np.int32)
        self.reward = np.zeros((n, big - 1), np.float32)
        self.done = np.zeros((n, big - 1), bool)
        self.behaviour_prob = np.zeros((n, big - 1), np.float32)
        self.psi = np.zeros((n, big - 1, psi_dim), np.float32)
        self.extras = {name: np.zeros((n, big), dtype) for name, dtype in (extras or {}).items()}
        self.t = 0

    def observe(self, obs: np.ndarray, prev_action: np.ndarray, prev_reward: np.ndarray, reset: np.ndarray,
                h: np.ndarray, c: np.ndarray, version: int,
                extras: dict[str, np.ndarray] | None = None) -> list[tuple[dict[str, np.ndarray], int]]:
        """Record x_t and the LSTM state before it. Returns the completed (sequence, version) pairs."""
        t = self.t
        given = extras or {}
        if set(given) != set(self.extras):
            raise ValueError(f"observe() needs the extra fields {sorted(self.extras)}, got {sorted(given)}")
        for name, arr in self.extras.items():
            arr[:, t] = given[name]
        self.obs[:, t] = obs
        self.prev_action[:, t] = prev_action
        self.prev_reward[:, t] = prev_reward
        self.reset[:, t] = reset
        self.h[:, t] = h
        self.c[:, t] = c
        self.version[t] = version
        if t < self.steps:
            return []
        done = [(self._sequence(e), int(self.version.min())) for e in range(self.obs.shape[0])]
        self._shift()
        return done

    def act(self, action: np.ndarray, reward: np.ndarray, done: np.ndarray, behaviour_prob: np.ndarray,
            psi: np.ndarray) -> None:
        t = self.t
        self.action[:, t] = action
        self.reward[:, t] = reward
        self.done[:, t] = done
        self.behaviour_prob[:, t] = behaviour_prob
        self.psi[:, t] = psi
        self.t += 1

    def _sequence(self, e: int) -> dict[str, np.ndarray]:
        return {"obs": self.obs[e].copy(), "prev_action": self.prev_action[e].copy(),
                "prev_reward": self.prev_reward[e].copy(), "reset": self.reset[e].copy(),
                "action": self.action[e].copy(), "reward": self.reward[e].copy(), "done": self.done[e].copy(),
                "behaviour_prob": self.behaviour_prob[e].copy(), "psi": self.psi[e].copy(),
                "h0": self.h[e, 0].copy(), "c0": self.c[e, 0].copy(),
                **{name: arr[e].copy() for name, arr in self.extras.items()}}

    def _shift(self) -> None:
        """Keep steps L-b..L-1 and observations L-b..L as the next sequence's first ones."""
        b, s = self.burn_in, self.steps
        for arr in (self.obs, self.prev_action, self.prev_reward, self.reset, self.h, self.c, *self.extras.values()):
            arr[:, : b + 1] = arr[:, s - b: s + 1]
        self.version[: b + 1] = self.version[s - b: s + 1]
        for arr in (self.action, self.reward, self.done, self.behaviour_prob, self.psi):
            arr[:, :b] = arr[:, s - b: s]
        self.t = b
