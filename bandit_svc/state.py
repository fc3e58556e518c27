"""The bandit service's state: one meta-controller per actor (lbc.controllers), the episodes in flight, and
atomic JSON snapshots so a restart loses nothing."""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

from lbc.bandit import Choice
from lbc.config import Config
from lbc.controllers import Controller, dimension_names, dimensions, make_controller
from lbc.files import remove_stale_temporaries, write_atomically
from lbc.peers import MAX_RETURNS_PER_EXCHANGE

SNAPSHOT_FORMAT = 3   # 2: BVA controllers hold one ensemble per dimension; 3: the layout names NGU's N
# an actor has one episode in flight per environment; an Exchange carries no more returns than these
MAX_PENDING_PER_ACTOR = MAX_RETURNS_PER_EXCHANGE


class UnknownEpisode(KeyError):
    pass


class BanditState:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.tau_dim, self.omega_dim = dimensions(cfg)
        self.lock = threading.Lock()
        # least recently seen first: beyond bandit.max_actors the first is forgotten
        self.controllers: OrderedDict[str, Controller] = OrderedDict()
        self.evicted = 0
        self.pending: dict[str, OrderedDict[str, tuple[int, ...]]] = {}
        self.next_episode: dict[str, int] = {}
        self.dimension_names = dimension_names(cfg)

    def _controller(self, actor_id: str) -> Controller:
        if actor_id in self.controllers:
            self.controllers.move_to_end(actor_id)
        else:
            while len(self.controllers) >= self.cfg.bandit.max_actors:
                gone, _ = self.controllers.popitem(last=False)
                del self.pending[gone], self.next_episode[gone]
                self.evicted += 1
            seed = self.cfg.bandit.seed * 1_000_003 + zlib.crc32(actor_id.encode())
            self.controllers[actor_id] = make_controller(self.cfg, seed)
            self.pending[actor_id] = OrderedDict()
            self.next_episode[actor_id] = 0
        return self.controllers[actor_id]

    def select(self, actor_id: str) -> tuple[str, Choice]:
        with self.lock:
            choice = self._controller(actor_id).select()
            n = self.next_episode[actor_id]
            self.next_episode[actor_id] = n + 1
            # unguessable, so that only the actor that was given an episode can report its return
            episode_id = f"{actor_id}/{n}/{secrets.token_hex(8)}"
            pending = self.pending[actor_id]
            pending[episode_id] = choice.arms
            while len(pending) > MAX_PENDING_PER_ACTOR:
                pending.popitem(last=False)
            return episode_id, choice

    def report(self, actor_id: str, episode_id: str, episode_return: float) -> None:
        with self.lock:
            pending = self.pending.get(actor_id)
            if pending is None or episode_id not in pending:
                raise UnknownEpisode(episode_id)
            arms = pending.pop(episode_id)
            self.controllers[actor_id].update(arms, episode_return)

    def stats(self, actor_id: str = "") -> dict[str, Any]:
        with self.lock:
            ids = [actor_id] if actor_id else sorted(self.controllers)
            out = {}
            for aid in ids:
                ctl = self.controllers.get(aid)
                if ctl is None:
                    continue
                out[aid] = {"episodes": ctl.episodes, "dimensions": ctl.stats()}
            return out

    # ------------------------------------------------------------ snapshots
    def to_dict(self) -> dict[str, Any]:
        with self.lock:
            return {"format": SNAPSHOT_FORMAT,
                    "layout": self._layout(),
                    "actors": {aid: {"controller": ctl.to_dict(),
                                     "pending": {k: list(v) for k, v in self.pending[aid].items()},
                                     "next_episode": self.next_episode[aid]}
                               for aid, ctl in self.controllers.items()}}

    def _layout(self) -> dict[str, Any]:
        return {"components": self.cfg.num_components, "tau_arms": self.tau_dim.num_arms,
                "omega_arms": self.omega_dim.num_arms, "population": self.cfg.bandit.population,
                "algorithm": self.cfg.bandit.algorithm, "mixtures": self.cfg.ngu.num_mixtures}

    def load_dict(self, d: dict[str, Any]) -> None:
        if d.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"snapshot format {d.get('format')}, expected {SNAPSHOT_FORMAT}")
        if d.get("layout") != self._layout():
            raise ValueError(f"snapshot layout {d.get('layout')} differs from the configured {self._layout()}")
        with self.lock:
            for aid, a in d["actors"].items():
                self._controller(aid).load_dict(a["controller"])
                self.pending[aid] = OrderedDict((k, tuple(v)) for k, v in a["pending"].items())
                self.next_episode[aid] = int(a["next_episode"])

    def save(self, path: Path) -> None:
        """Write the snapshot atomically; the one before stays beside it as <name>.prev."""
        data = json.dumps(self.to_dict()).encode()
        if path.exists():
            os.replace(path, previous(path))
        write_atomically(path, lambda f: f.write(data))

    def restore(self, path: Path, log: logging.Logger | None = None) -> bool:
        """Load the newest snapshot that reads whole: a damaged one is skipped (with a warning naming it)
        for the one before. False when there is none; ValueError when none of them loads."""
        remove_stale_temporaries(path.parent, log)
        candidates = [p for p in (path, previous(path)) if p.exists()]
        for candidate in candidates:
            try:
                self.load_dict(json.loads(candidate.read_text()))
                return True
            except json.JSONDecodeError as exc:   # cut short or corrupted; a layout mismatch is not skipped
                (log or logging.getLogger("bandit")).warning("bandit snapshot %s does not read (%s); trying the "
                                                             "one before", candidate, exc)
        if candidates:
            raise ValueError(f"no bandit snapshot in {path.parent} reads")
        return False


def previous(path: Path) -> Path:
    return path.with_name(path.name + ".prev")
