"""actor_svc: steps a vector of games with the hybrid behaviour mu_psi and streams sequences to replay."""

from __future__ import annotations

import os
import socket
import threading
import time
import zlib
from collections import deque
from functools import partial

import numpy as np
import torch
from prometheus_client import Counter, Gauge

from actor_svc import evaluator, inference_server
from actor_svc.peers import BehaviourSource, ParamPuller, SequenceSender
from actor_svc.remote import RemoteNetwork, Stopped
from actor_svc.sequencer import SequenceBuilder
from lbc.acting import CoreInputs, acting_agent, acting_graphs, cut_episode_values, forward, frame_ring, precision_of
from lbc.agents import make_acting
from lbc.behaviour import EpisodeBehaviour, sample_actions
from lbc.config import Config
from lbc.devices import pick_device, set_gpu_wait
from lbc.envs import AtariEnvs, make_envs
from lbc.nets import policy_net
from lbc.scores import human_normalised
from lbc.sequences import sequence_layout
from lbc.service import (
    Backoff,
    base_parser,
    config_from_args,
    exit_service,
    grpc_bind_address,
    grpc_server,
    listen_address,
    set_serving,
    setup_logging,
    start_metrics,
    stop_event,
)

STEPS = Counter("lbc_actor_steps_total", "Agent steps, summed over environments")
FRAMES = Counter("lbc_actor_frames_total", "Emulator frames (agent steps x frame skip)")
EPISODES = Counter("lbc_actor_episodes_total", "Episodes finished")
RETURN_LAST = Gauge("lbc_actor_episode_return", "Return of the last finished episode")
RETURN_MEAN = Gauge("lbc_actor_return_mean100", "Mean return of the last 100 episodes")
RETURN_COUNT = Gauge("lbc_actor_return_window", "Episodes in the return window (up to 100)")
EXPLOIT_MEAN = Gauge("lbc_actor_exploit_return_mean100", "NGU: mean return of the last 100 episodes of j = 0")
EXPLOIT_COUNT = Gauge("lbc_actor_exploit_return_window", "NGU: episodes in the j = 0 return window (up to 100)")
HNS_MEAN = Gauge("lbc_actor_hns_mean100", "Human-normalised score of the mean return of the last 100 episodes")
# A recurrent core whose cell state runs away saturates tanh(c): no gradient reaches the torso.
LSTM_CELL = Gauge("lbc_actor_lstm_cell_abs_mean", "Mean |c| of the actors' LSTM cell state (saturation watch)")
INFER_SECONDS = Counter("lbc_actor_inference_seconds_total", "Seconds in the network forward pass")
ENV_SECONDS = Counter("lbc_actor_env_seconds_total", "Seconds stepping the environments")
INTRINSIC_MEAN = Gauge("lbc_actor_intrinsic_reward_mean", "NGU: mean intrinsic reward r^i over the environments, "
                                                            "last step")
INTRINSIC_SECONDS = Counter("lbc_actor_intrinsic_seconds_total",
                            "Seconds computing the per-observation inputs besides the frame (NGU's intrinsic "
                            "rewards: embedding, RND, episodic memory)")


def actor_seed(base: int, index: int, name: str | None) -> int:
    """A distinct seed per actor. On one machine actors differ by index; the replicas of a Kubernetes
    Deployment all run index 0, so their unique pod name is mixed in."""
    return base + 9973 * index + (zlib.crc32(name.encode()) if name else 0)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("actor_svc", __doc__)
    parser.add_argument("--index", type=int, default=int(os.environ.get("LBC_ACTOR_INDEX", "0")),
                        help="actor number: seeds its games, offsets its local ports (default $LBC_ACTOR_INDEX or 0)")
    parser.add_argument("--actor-id", default=os.environ.get("LBC_ACTOR_ID"),
                        help="name towards the bandit, also mixed into the seed; on Kubernetes the pod name "
                             "(default $LBC_ACTOR_ID, else host name + index)")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many vector steps (0: never)")
    parser.add_argument("--mode", choices=("act", "eval", "infer"), default="act",
                        help="act: play the hybrid behaviour and feed replay; eval: the evaluator, which plays the "
                             "evaluation policy on its own games and reports scores (eval.* settings); infer: the "
                             "inference service that actors with actor.inference=remote act through (inference.*)")
    args = parser.parse_args(argv)
    cfg: Config = config_from_args(args)
    log = setup_logging({"act": f"actor-{args.index}", "eval": "evaluator", "infer": "inference"}[args.mode],
                        args.log_level)
    stop = stop_event()
    torch.set_num_threads(cfg.actor.threads)
    set_gpu_wait(cfg.actor.gpu_wait)
    if args.mode == "eval":
        return evaluate(cfg, stop)
    if args.mode == "infer":
        return infer(cfg, stop)
    actor_id = args.actor_id or f"{socket.gethostname()}-{args.index}"

    num_envs = cfg.env.num_envs
    seed = actor_seed(cfg.env.seed, args.index, args.actor_id)
    envs = make_envs(cfg.env, num_envs, seed=seed)
    if isinstance(envs, AtariEnvs):
        log.info("Atari screens resized by %s (env.native_resize)", envs.resized_by)
    spec = envs.spec
    remote = cfg.actor.inference == "remote"
    # with remote inference the actor's own network only shapes its state; its parameters are never pulled
    device = torch.device("cpu") if remote else pick_device(cfg.actor.device, "actor.device")
    # refuses before anything starts where no GPU was found; with remote inference the service replays them
    graphs = None if remote else acting_graphs(cfg, device)
    agent = acting_agent(cfg, spec.obs_shape, spec.num_actions, device)
    net = policy_net(agent)
    acting = make_acting(cfg, agent, num_envs, args.index)
    puller = None if remote else ParamPuller(cfg, actor_id, agent)
    network = RemoteNetwork(cfg, actor_id, spec, net.num_policies, net.lstm_size, stop) if remote else None
    step = network.forward if network is not None else partial(forward, net, graphs=graphs)
    ring = None if remote else frame_ring(cfg, net, num_envs)   # the stacks as the local pass reads them
    behaviours = BehaviourSource(cfg, actor_id, ahead=num_envs)
    sender = SequenceSender(cfg, actor_id, stop)
    builder = SequenceBuilder(num_envs, cfg.sequence.burn_in, sequence_layout(cfg))
    health_address = grpc_bind_address(cfg.endpoints.bind_host, cfg.endpoints.actor_health_base + args.index)
    server, health = grpc_server(health_address, workers=2)
    server.start()
    start_metrics(cfg.endpoints.actor_metrics_base + args.index, cfg.endpoints.bind_host)
    generator = torch.Generator().manual_seed(seed + 1)

    backoff = Backoff()
    while not remote and not stop.is_set() and not puller.pull():
        log.info("waiting for the first parameters from %s", cfg.endpoints.params)
        backoff.wait(stop)
    set_serving(health, ["lbc.v1.Actor"])
    if remote:
        log.info("actor %s up: %d x %s, inference at %s", actor_id, num_envs, cfg.env.name, cfg.endpoints.inference)
    else:
        log.info("actor %s up: %d x %s, version %d, inference in %s%s", actor_id, num_envs, cfg.env.name,
                 puller.version, precision_of(net),
                 "" if ring is None else f", the stacks kept in {ring.blocks}x{ring.blocks} blocks (actor.frame_ring) "
                 f"pushed by {ring.pushed_by} (actor.native_ring)")
    try:   # Stopped: told to stop while the inference service had not answered
        obs = envs.reset()
        inputs = CoreInputs.start(net, num_envs)
        episode: list[EpisodeBehaviour] = [behaviours.next() for _ in range(num_envs)]
        for e, chosen in enumerate(episode):
            acting.begin_episode(e, chosen)
        ep_return = np.zeros(num_envs)
        recent: deque[float] = deque(maxlen=100)
        recent_exploit: deque[float] = deque(maxlen=100)   # episodes of the exploiting member (NGU: j = 0)
        episodes = 0
        frame_skip = cfg.env.frames_per_step
        steps = 0
        last_log = time.monotonic()
        while not stop.is_set():
            if not remote and steps % cfg.actor.pull_every == 0 and steps > 0:
                puller.pull()
            t0 = time.perf_counter()
            fields = acting.observe(obs, inputs.reset)
            if fields:
                INTRINSIC_SECONDS.inc(time.perf_counter() - t0)
            t0 = time.perf_counter()
            extra = acting.extra_inputs(fields)   # also the cut episodes' values' (cut_episode_values)
            out = step(obs if ring is None else ring.push(obs), inputs, extra)
            forward_seconds = time.perf_counter() - t0
            # the version that acted on x_t: remote inference knows it once it has answered
            version = network.version if network is not None else puller.version
            h, c = (s.cpu().numpy() for s in inputs.state)
            for seq, seq_version in builder.observe(obs, inputs.prev_action, inputs.prev_reward, inputs.reset, h, c,
                                                    version, fields):
                if not sender.send(seq, seq_version):
                    break
            t0 = time.perf_counter()
            actions, mu = sample_actions(acting.behaviour(out), generator)
            t1 = time.perf_counter()
            action_np = actions.numpy()
            result = envs.step(action_np)
            t2 = time.perf_counter()
            INFER_SECONDS.inc(forward_seconds + t1 - t0)
            ENV_SECONDS.inc(t2 - t1)
            # what the learner sees as an episode end: the game's, or also a life loss (env.episodic_life)
            boundary = result.done | result.life_lost if cfg.env.episodic_life else result.done
            cut_values = cut_episode_values(step, result, action_np, out.state, extra)
            builder.act(action_np, result.reward, boundary, mu.numpy(), acting.psi, result.truncated, cut_values)

            ep_return += result.reward
            for e in np.flatnonzero(result.done):
                recent.append(float(ep_return[e]))
                if acting.exploits(e):
                    recent_exploit.append(float(ep_return[e]))
                    EXPLOIT_MEAN.set(float(np.mean(recent_exploit)))
                    EXPLOIT_COUNT.set(len(recent_exploit))
                episodes += 1
                EPISODES.inc()
                RETURN_LAST.set(ep_return[e])
                behaviours.report(episode[e].episode_id, float(ep_return[e]))
                ep_return[e] = 0.0
                episode[e] = behaviours.next()
                acting.begin_episode(e, episode[e])
            if result.done.any():
                RETURN_MEAN.set(float(np.mean(recent)))
                RETURN_COUNT.set(len(recent))
                hns = human_normalised(cfg.env.game, float(np.mean(recent)))   # None outside the Atari table
                if hns is not None:
                    HNS_MEAN.set(hns)

            obs = result.obs
            inputs.advance(action_np, result.reward, boundary, out.state)
            steps += 1
            STEPS.inc(num_envs)
            FRAMES.inc(num_envs * frame_skip)
            if steps % 100 == 0:
                LSTM_CELL.set(float(inputs.state[1].abs().mean()))
                if "prev_intrinsic" in fields:
                    INTRINSIC_MEAN.set(float(fields["prev_intrinsic"].mean()))
            if time.monotonic() - last_log > 30:
                last_log = time.monotonic()
                mean = float(np.mean(recent)) if recent else float("nan")
                log.info("steps %d, episodes %d, mean return %.2f, version %d", steps * num_envs, episodes, mean,
                         version)
            if args.max_steps and steps >= args.max_steps:
                break
    except Stopped:
        pass

    set_serving(health, ["lbc.v1.Actor"], serving=False)
    if network is not None:
        network.close()
    behaviours.close()
    sender.close()
    envs.close()
    server.stop(grace=0.5).wait()
    log.info("actor stopped")
    return 0


def infer(cfg: Config, stop: threading.Event) -> int:
    """The inference service: health and metrics on its own endpoints around inference_server.run."""
    server, health = grpc_server(listen_address(cfg.endpoints.inference_health, cfg.endpoints.bind_host), workers=2)
    server.start()
    start_metrics(cfg.endpoints.inference_metrics, cfg.endpoints.bind_host)
    try:   # serving once it holds parameters: before, an actor's requests would wait and be asked again
        return inference_server.run(cfg, stop, ready=lambda: set_serving(health, ["lbc.v1.Inference"]))
    finally:
        set_serving(health, ["lbc.v1.Inference"], serving=False)
        server.stop(grace=0.5).wait()


def evaluate(cfg: Config, stop: threading.Event) -> int:
    """The evaluator as a service: health and metrics on its own endpoints around evaluator.run."""
    server, health = grpc_server(listen_address(cfg.endpoints.eval_health, cfg.endpoints.bind_host), workers=2)
    server.start()
    start_metrics(cfg.endpoints.eval_metrics, cfg.endpoints.bind_host)
    set_serving(health, ["lbc.v1.Evaluator"])
    try:
        return evaluator.run(cfg, stop)
    finally:
        set_serving(health, ["lbc.v1.Evaluator"], serving=False)
        server.stop(grace=0.5).wait()


if __name__ == "__main__":
    exit_service(main())
