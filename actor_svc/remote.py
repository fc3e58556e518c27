"""Central inference (actor.inference=remote): the wire between actors and the inference service, and the
network an actor acts through when it holds none of its own parameters.

Each vector step an actor sends what `lbc.acting.forward` reads for its games (the newest observations,
the previous actions and rewards, where episodes restart, the recurrent state before the step) as one
ZeroMQ message (lbc.codec); the service (actor_svc.inference_server) answers with the heads' outputs and
the state after the step, stamped with the parameter version it used. The recurrent state travels both
ways, so the service keeps nothing per actor: an actor or the service may die and come back at any time.
SEED RL (Espeholt et al. 2020) keeps the state on the server instead; carrying it costs 2 x H floats a game
a step and keeps the service stateless.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch
import zmq
from prometheus_client import Counter, Gauge

from lbc import codec
from lbc.acting import CoreInputs
from lbc.config import Config
from lbc.envs import EnvSpec
from lbc.nets import NetOutput
from lbc.security import secure_client_socket

log = logging.getLogger("actor")

REQUEST, REPLY, REFUSED = "inference_request", "inference_reply", "inference_refused"
HEADER_BYTES = 1 << 16   # a message's header frame and the reason of a refusal, generously

TIMEOUTS = Counter("lbc_actor_inference_timeouts_total", "Requests the inference service did not answer in time "
                   "(asked again on a fresh socket)")
VERSION = Gauge("lbc_actor_inference_version", "Parameter version of the inference service's last answer")


class Stopped(Exception):
    """The actor was told to stop while it waited for the inference service."""


def request_layout(spec: EnvSpec, state_size: int) -> codec.Layout:
    """A request's arrays after their leading [E] (games) axis. No inputs besides the frame's (NGU's j and
    intrinsic reward): lbc.config refuses actor.inference=remote for NGU, whose actors need networks of their own."""
    return {"obs": (spec.obs_dtype, spec.obs_shape), "prev_action": ("int64", ()), "prev_reward": ("float32", ()),
            "reset": ("bool", ()), "h": ("float32", (state_size,)), "c": ("float32", (state_size,))}


def reply_layout(num_policies: int, num_actions: int, state_size: int) -> codec.Layout:
    """A reply's arrays after their leading [E] axis: one step's NetOutput without its time axis."""
    return {"adv": ("float32", (num_policies, num_actions)), "value": ("float32", (num_policies,)),
            "h": ("float32", (state_size,)), "c": ("float32", (state_size,))}


def check_message(arrays: dict[str, np.ndarray], layout: codec.Layout, max_games: int) -> int:
    """E of a request or reply whose arrays match `layout` with one leading axis of 1..max_games games;
    CodecError otherwise."""
    first = next(iter(layout))
    if first not in arrays or arrays[first].ndim < 1:
        raise codec.CodecError(f"array {first!r} missing or without a games axis", "layout")
    games = int(arrays[first].shape[0])
    if not 1 <= games <= max_games:
        raise codec.CodecError(f"{games} games in one message; 1 to {max_games} are accepted", "layout")
    codec.check_layout(arrays, layout, (games,))
    return games


def check_request(arrays: dict[str, np.ndarray], layout: codec.Layout, max_games: int, num_actions: int) -> int:
    """check_message for a request, and its previous actions among the network's: E, or CodecError."""
    games = check_message(arrays, layout, max_games)
    actions = arrays["prev_action"]
    if actions.min() < 0 or actions.max() >= num_actions:
        raise codec.CodecError(f"previous actions outside 0..{num_actions - 1}", "value")
    return games


def request_arrays(obs: np.ndarray, inputs: CoreInputs) -> dict[str, np.ndarray]:
    """What one step's request carries for `lbc.acting.forward(net, obs, inputs)`."""
    # no copies where the inputs hold these dtypes already (they do in the actor's loop, every step)
    h, c = (s.detach().cpu().numpy().astype(np.float32, copy=False) for s in inputs.state)
    return {"obs": obs, "prev_action": inputs.prev_action.astype(np.int64, copy=False),
            "prev_reward": inputs.prev_reward.astype(np.float32, copy=False),
            "reset": inputs.reset.astype(bool, copy=False), "h": h, "c": c}


class RemoteNetwork:
    """The actor's network behind the inference service: `forward` takes and returns what
    `lbc.acting.forward` does (adv and value [1, E, N, A] / [1, E, N], the state after the step on the CPU),
    and `version` is the parameter version of the last answer (-1 before the first).

    A request not answered within endpoints.rpc_timeout_s is asked again on a fresh socket (the service may
    have restarted; a late answer to the old one is recognised by its id and dropped), for as long as the
    actor runs: with no service the actor waits, as it waits for a replay that is full. A request the service
    refuses is a bug in one of the two and stops the actor with the service's reason."""

    def __init__(self, cfg: Config, actor_id: str, spec: EnvSpec, num_policies: int, state_size: int,
                 stop: threading.Event) -> None:
        self.cfg = cfg
        self.actor_id = actor_id
        self.stop = stop
        self.layout = reply_layout(num_policies, spec.num_actions, state_size)
        self.reply_bytes = codec.layout_bytes(self.layout)   # a game's bytes in a reply
        self.version = -1
        self.next_id = 0
        self.sock: zmq.Socket | None = None
        self.connect()

    def connect(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        secure_client_socket(self.sock, self.cfg)
        self.sock.connect(self.cfg.endpoints.inference)

    def forward(self, obs: np.ndarray, inputs: CoreInputs, extra: torch.Tensor | None = None) -> NetOutput:
        if extra is not None:
            raise ValueError("the inference service takes no inputs besides the frame's (NGU's stay local)")
        games = obs.shape[0]
        self.next_id += 1
        frames = codec.encode(REQUEST, request_arrays(obs, inputs), sender=self.actor_id,
                              meta={"id": str(self.next_id)})
        timeout_s = self.cfg.endpoints.rpc_timeout_s
        sent = time.monotonic()
        self.sock.send_multipart(frames, copy=False)
        while True:
            if self.stop.is_set():
                raise Stopped
            if not self.sock.poll(100):
                if time.monotonic() - sent > timeout_s:
                    TIMEOUTS.inc()
                    log.warning("no answer from the inference service at %s in %.0f s; asking again",
                                self.cfg.endpoints.inference, timeout_s)
                    self.connect()
                    sent = time.monotonic()
                    self.sock.send_multipart(frames, copy=False)
                continue
            msg = codec.decode(self.sock.recv_multipart(copy=False),
                               max_bytes=self.reply_bytes * games + HEADER_BYTES)
            if codec.meta_int(msg.meta, "id", -1) != self.next_id:
                continue   # the answer to a request asked again since
            if msg.kind == REFUSED:
                raise RuntimeError(f"the inference service refused this actor's request: "
                                   f"{msg.meta.get('reason', '')[:300]}")
            if msg.kind != REPLY:
                raise codec.CodecError(f"kind {msg.kind[:40]!r} from the inference service", "header")
            answered = check_message(msg.arrays, self.layout, games)
            if answered != games:
                raise codec.CodecError(f"an answer for {answered} games to a request for {games}", "layout")
            self.version = msg.param_version
            VERSION.set(self.version)
            a = msg.arrays
            # copies: the arrays are read-only views of the message's frames
            adv, value, h, c = (torch.from_numpy(a[name].copy()) for name in ("adv", "value", "h", "c"))
            return NetOutput(adv=adv[None], value=value[None], state=(h, c))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
