"""The inference service (`python -m actor_svc --mode infer`): one network, the newest parameters, one forward
pass over the games of every actor's request that came in together (actor.inference=remote).

A pass takes the first request, every request already queued behind it and those that arrive within
inference.max_wait_ms, up to inference.max_batch_envs games; each actor gets its own rows back
(actor_svc.remote holds the wire). On a GPU this puts every actor's inference in one process's CUDA
context and in large batches, where actors with actor.device=cuda each hold a context and pass their own
32 games; SEED RL (Espeholt et al. 2020) runs its actors this way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import torch
import zmq
from prometheus_client import Counter

from actor_svc.peers import ParamPuller
from actor_svc.remote import (
    HEADER_BYTES,
    REFUSED,
    REPLY,
    REQUEST,
    check_request,
    request_layout,
)
from lbc import codec
from lbc.acting import CoreInputs, acting_agent, acting_graphs, forward, precision_of
from lbc.config import Config
from lbc.devices import pick_device, to_device
from lbc.envs import env_spec
from lbc.lstm_bptt import GraphCache
from lbc.nets import LBCNet, policy_net
from lbc.security import secure_server_socket
from lbc.service import Backoff, zmq_bind_address
from lbcproto import lbc_pb2

log = logging.getLogger("inference")

PASSES = Counter("lbc_inference_passes_total", "Forward passes")
REQUESTS = Counter("lbc_inference_requests_total", "Requests answered")
GAMES = Counter("lbc_inference_games_total", "Games stepped, summed over passes (games per pass: this / passes)")
FORWARD_SECONDS = Counter("lbc_inference_forward_seconds_total", "Seconds in the forward pass")
REJECTED = Counter("lbc_inference_rejected_total", "Requests refused", ["reason"])


# With CUDA graphs (actor.cuda_graphs) a pass runs over its games padded up to a power of two of at least
# this many, so that a few graphs serve every batch size (GraphCache keeps at most MAX_GRAPHS per service)
GRAPH_MIN_GAMES = 32


def input_buffers(layout: codec.Layout, games: int, pin: bool) -> dict[str, np.ndarray]:
    """Room for a pass's inputs of up to `games` games (request_layout): in page-locked memory where `pin`
    (a GPU service), so that the pass's one copy to the device starts from them without another copy. Zeros
    at first: a padded pass reads rows past its games, which must be valid inputs (an action in range)."""
    return {name: torch.zeros((games, *shape), dtype=getattr(torch, dtype), pin_memory=pin).numpy()
            for name, (dtype, shape) in layout.items()}


def padded_games(games: int, room: int) -> int:
    """The games a pass by CUDA graphs runs over: `games` padded up to a power of two of at least
    GRAPH_MIN_GAMES, at most the `room` its buffers have."""
    return min(room, max(GRAPH_MIN_GAMES, 1 << (games - 1).bit_length()))


def batched_forward(net: LBCNet, requests: list[dict[str, np.ndarray]],
                    buffers: dict[str, np.ndarray] | None = None,
                    graphs: GraphCache | None = None) -> list[dict[str, np.ndarray]]:
    """One forward pass (lbc.acting.forward) over the games of all `requests` (request_layout arrays), split
    back into each request's rows: adv [E, N, A], value [E, N] and the state after the step, h and c [E, H].
    Every game's row is what a pass over its own request alone gives, up to the rounding of another batch
    size (the network treats the games of a batch apart). The requests are joined into `buffers`
    (input_buffers) where given, else into new arrays; the pass has read them when it returns. With `graphs`
    and buffers the pass runs over padded_games rows of the buffers, the rows past the requests' left as an
    earlier pass left them, and replays a CUDA graph on a GPU (forward)."""
    games = sum(len(r["reset"]) for r in requests)
    joined = {name: np.concatenate([r[name] for r in requests], out=None if buffers is None else buffers[name][:games])
              for name in requests[0]}
    if graphs is not None and buffers is not None:
        rows = padded_games(games, len(buffers["reset"]))
        joined = {name: buffers[name][:rows] for name in joined}
    device = net.heads.weight.device
    inputs = CoreInputs(joined["prev_action"], joined["prev_reward"], joined["reset"],
                        (to_device(joined["h"], device), to_device(joined["c"], device)))
    out = forward(net, joined["obs"], inputs, state_to_host=True, graphs=graphs)
    rows = {"adv": out.adv[0].numpy(), "value": out.value[0].numpy(), "h": out.state[0].numpy(),
            "c": out.state[1].numpy()}
    ends = np.cumsum([len(r["reset"]) for r in requests])
    return [{name: a[end - len(r["reset"]):end] for name, a in rows.items()}
            for r, end in zip(requests, ends, strict=True)]


def gather(sock: zmq.Socket, max_games: int, max_wait_s: float) -> list[list[zmq.Frame]]:
    """The messages of one pass, after the socket has one ready: it, those queued behind it, and those that
    come within `max_wait_s`, until they carry about `max_games` games (counted from their first array's
    leading axis as the header gives it)."""
    messages = [sock.recv_multipart(copy=False)]
    games = games_claimed(messages[0])
    deadline = time.monotonic() + max_wait_s
    while games < max_games:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sock.poll(max(1, int(remaining * 1000))):
                break
            continue
        messages.append(frames)
        games += games_claimed(frames)
    return messages


def header_of(frames: list[zmq.Frame]) -> lbc_pb2.FrameHeader | None:
    """The header of a request as the ROUTER socket gives it ([identity, header, arrays...]), None where it
    does not parse (decode says why when the pass reads it)."""
    header = lbc_pb2.FrameHeader()
    try:
        header.ParseFromString(bytes(frames[1].buffer))
    except Exception:   # protobuf raises DecodeError; a missing frame IndexError
        return None
    return header


def games_claimed(frames: list[zmq.Frame]) -> int:
    """The games a request's header says it carries: its first array's leading axis (1 where it has none)."""
    header = header_of(frames)
    if header is None or not header.arrays or not header.arrays[0].shape:
        return 1
    return max(1, int(header.arrays[0].shape[0]))


def run(cfg: Config, stop: threading.Event, ready: Callable[[], None] = lambda: None) -> int:
    """The service's loop; returns when `stop` is set. `ready()` is called once it holds parameters and
    listens (its health turns to serving)."""
    ic = cfg.inference
    torch.set_num_threads(ic.threads)
    spec = env_spec(cfg.env)
    device = pick_device(ic.device, "inference.device")
    graphs = acting_graphs(cfg, device)   # refuses before anything starts where no GPU was found
    agent = acting_agent(cfg, spec.obs_shape, spec.num_actions, device)
    net = policy_net(agent)
    layout = request_layout(spec, net.lstm_size)
    max_request_bytes = codec.layout_bytes(layout) * ic.max_batch_envs + HEADER_BYTES   # a game's bytes x games
    # a pass stops gathering at max_batch_envs games, its last request of at most as many taking it past them
    buffers = input_buffers(layout, 2 * ic.max_batch_envs, pin=net.heads.weight.device.type == "cuda")
    puller = ParamPuller(cfg, "inference", agent)

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_request_bytes)   # per frame: a request's largest array fits
    secure_server_socket(sock, cfg)
    sock.bind(zmq_bind_address(cfg.endpoints.inference, cfg.endpoints.bind_host))

    backoff = Backoff()
    while not stop.is_set() and not puller.pull():
        log.info("waiting for the first parameters from %s", cfg.endpoints.params)
        backoff.wait(stop)
    log.info("inference up at %s: %s on %s in %s%s, up to %d games a pass, %.1f ms to gather, version %d",
             cfg.endpoints.inference, cfg.env.name, net.heads.weight.device, precision_of(net),
             " by CUDA graphs" if graphs is not None else "", ic.max_batch_envs, ic.max_wait_ms, puller.version)
    ready()

    passes = 0
    while not stop.is_set():
        if passes % cfg.actor.pull_every == 0 and passes > 0:
            puller.pull()
        if not sock.poll(100):
            continue
        senders, requests = [], []
        for frames in gather(sock, ic.max_batch_envs, ic.max_wait_ms / 1000):
            identity, body = frames[0], frames[1:]
            try:
                msg = codec.decode(body, max_bytes=max_request_bytes, expected_kind=REQUEST)
                check_request(msg.arrays, layout, ic.max_batch_envs, spec.num_actions)
            except codec.CodecError as exc:
                REJECTED.labels(exc.reason).inc()
                log.warning("refused a request (%s): %s", exc.reason, str(exc)[:200])
                header = header_of(frames)   # its id, where the header parses: else the actor asks again
                meta = {"reason": str(exc)[:300], "id": header.meta.get("id", "")[:12] if header else ""}
                sock.send_multipart([identity, *codec.encode(REFUSED, {}, sender="inference", meta=meta)])
                continue
            senders.append((identity, msg.meta.get("id", "")[:12]))
            requests.append(msg.arrays)
        if not requests:
            continue
        started = time.perf_counter()
        replies = batched_forward(net, requests, buffers, graphs)
        FORWARD_SECONDS.inc(time.perf_counter() - started)
        for (identity, request_id), arrays in zip(senders, replies, strict=True):
            frames = codec.encode(REPLY, arrays, sender="inference", param_version=puller.version,
                                  meta={"id": request_id})
            # copied into the message: a core without state (feed-forward) answers with views of the buffers,
            # which the next pass overwrites
            sock.send_multipart([identity, *frames])
        passes += 1
        PASSES.inc()
        REQUESTS.inc(len(requests))
        GAMES.inc(sum(len(r["reset"]) for r in requests))
    sock.close(linger=0)
    return 0

