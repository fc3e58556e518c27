"""One typed configuration for every service.

Precedence, highest first: command-line ``--set a.b=value`` overrides, environment variables
(``LBC_LEARNER__LR=1e-3``; nested keys joined by ``__``, so a Kubernetes ConfigMap can drive a
service), the named preset, then the defaults below. Everything is validated at start: a typo in a
key or a value of the wrong type stops the service with a message naming the field.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from lbc.presets import PRESETS

GpuWait = Literal["sleep", "spin"]   # lbc.devices.wait_for_gpu
Precision = Literal["fp32", "bf16", "auto"]   # lbc.devices.compute_precision


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# MinAtar's games and the channels of their 10x10 boards (minatar 1.0.15; tests/unit/test_envs.py checks them)
MINATAR_CHANNELS = {"asterix": 4, "breakout": 4, "freeway": 7, "seaquest": 10, "space_invaders": 6}


class EnvConfig(_Section):
    kind: Literal["atari", "catch", "gymnasium", "minatar"] = Field(
        "atari", description="atari (ale-py), catch (built in), gymnasium (any registered id with discrete "
                             "actions: env.id), minatar (env.game one of MinAtar's five)")
    game: str = Field("pong", description="the Atari game (a ROM ale-py holds) or the MinAtar game")
    id: str = Field("", description="env.kind=gymnasium: the registered id, e.g. CartPole-v1 or ALE/Pong-v5")
    num_envs: int = Field(16, ge=1)
    num_threads: int = Field(1, ge=1, description="ALE worker threads per actor")
    seed: int = 0
    # DESIGN §5: the Agent57 / LBC Table 3 protocol.
    full_action_space: bool = True
    repeat_action_probability: float = Field(0.0, ge=0.0, le=1.0)
    noop_max: int = Field(30, ge=0)
    frameskip: int = Field(4, ge=1)
    stack: int = Field(4, ge=1)
    image_size: int = Field(84, ge=8)
    native_resize: bool = Field(True, description="Atari screens resized by lbc.native's C++ (OpenCV's INTER_AREA to "
                                "the bit, the games 3-19% less CPU; decision 94) where it is built and loads, "
                                "else by ALE's own code: the same frames either way")
    max_episode_frames: int = Field(108_000, ge=1)
    episodic_life: bool = Field(
        False, description="learn as if a life loss ended the episode (IMPALA's Atari table): the learner sees a "
                           "terminal step and the core restarts, while the game, its return and the bandit's "
                           "episode go on to the real game over (no effect in games without lives, e.g. Catch)")
    max_abs_reward: float = Field(1e6, gt=0.0, description="largest |reward| of one step an actor may send; "
                                                          "replay and the learner refuse bigger ones")
    max_abs_return: float = Field(1e9, gt=0.0, description="largest |episode return| the bandit accepts (Atari "
                                                          "world records reach 9e7)")
    catch_rows: int = Field(10, ge=3)
    catch_columns: int = Field(5, ge=2)

    @model_validator(mode="after")
    def _check_kind(self) -> EnvConfig:
        if self.kind == "minatar" and self.game not in MINATAR_CHANNELS:
            raise ValueError(unknown_name("MinAtar game (env.game)", self.game, sorted(MINATAR_CHANNELS)))
        if self.kind == "gymnasium" and not self.id:
            raise ValueError("env.kind=gymnasium needs env.id, a registered Gymnasium id (e.g. CartPole-v1)")
        return self

    @property
    def name(self) -> str:
        """What is played, for logs and reports: the Atari game, catch, the Gymnasium id, minatar-<game>."""
        names = {"atari": self.game, "catch": "catch", "gymnasium": self.id, "minatar": f"minatar-{self.game}"}
        return names[self.kind]

    @property
    def frames_per_step(self) -> int:
        """Frames of the game per agent step: Atari's frame skip, else 1."""
        return self.frameskip if self.kind == "atari" else 1


class PolicySpec(_Section):
    """h_i = (gamma_i, RS_i) of one policy model."""

    gamma: float = Field(gt=0.0, le=1.0)
    reward_shaping: Literal["rs1", "rs2", "rs3", "quarter_root", "identity", "clip"]


class NetConfig(_Section):
    torso: Literal["small", "deep", "minatar", "mlp", "auto"] = Field(
        "small", description="small / deep: IMPALA's convolutions (images of 36 px and more); minatar: one 3x3 "
                             "convolution (small boards); mlp: vectors and small boards; auto: picked by the "
                             "observation")
    hidden: int = Field(256, ge=8)
    lstm: int = Field(256, ge=8)
    core: Literal["lstm", "layernorm_lstm", "feedforward"] = Field(
        "layernorm_lstm", description="recurrent core; the plain LSTM saturates on Atari (docs/decisions.md 24); "
        "feedforward: none, the heads read the torso's features (docs/decisions.md 35)")
    centre_frames: bool = Field(False, description="subtract each frame's median (its background) before the "
                                                   "torso, so a bright background does not move with every "
                                                   "weight of the first convolution (docs/decisions.md 34); "
                                                   "vector observations go in as they come")
    init: Literal["torch", "orthogonal", "sonnet"] = Field(
        "torch", description="torso weights: torch's default, orthogonal with the ReLU gain sqrt(2) and zero "
                             "biases (features ~20x larger at the start; docs/decisions.md 34), or Sonnet 1's, "
                             "which IMPALA's code used (normal of std 1/sqrt(fan_in) cut at 2 std, zero biases)")


class BehaviourConfig(_Section):
    """The behaviour family F_psi and the space Psi the bandit discretises."""

    family: Literal["boltzmann_mixture", "epsilon_greedy_mixture"] = "boltzmann_mixture"
    controlled: bool = Field(True, description="False: fixed psi (tau = fixed_tau, omega uniform)")
    fixed_tau: float = 1.0
    tau_range: tuple[float, float] = (0.0, math.exp(4.0))
    tau_accuracy: float = Field(0.2, gt=0.0)
    omega_range: tuple[float, float] = (0.0, 1.0)
    omega_accuracy: float = Field(0.1, gt=0.0)
    component_heads: list[int] | None = Field(
        None, description="policy head of each mixture component (GDI-I3: [0, 0], GDI-H3: [0, 1]); "
                          "default one component per policy (LBC)")


class BanditConfig(_Section):
    """Population-based UCB bandits, LBC App. E.4 and Table 3; one population per dimension of psi.
    Or DiCE's Bandits Vote Algorithm (`bva`, App. A): `population` tile-coded bandits each proposing
    `top_d` candidates over x = log(1 + tau) at `bva_accuracy`."""

    algorithm: Literal["population_ucb", "bva", "sliding_window_ucb"] = Field(
        "population_ucb", description="sliding_window_ucb: Agent57's choice of NGU's j per episode (ngu.window, ...)")
    learn: bool = Field(True, description="False: the bandits never learn, psi is drawn at random (ablations)")
    population: int = Field(7, ge=1)
    c_range: tuple[float, float] = (0.5, 1.5)
    top_d: int = Field(4, ge=1)
    bva_accuracy: float = Field(0.1, gt=0.0, description="tile size in x = log(1 + tau)")
    bva_ucb_c: float = Field(1.0, ge=0.0)
    bva_widths: tuple[int, ...] = Field((1, 2, 3), min_length=1, description="window widths drawn per bandit")
    bva_epsilon_accuracy: float = Field(0.1, gt=0.0, description="tile size of GDI's epsilon on [0, 1]")
    replace_every: int = Field(50, ge=1)
    normalise_values: bool = True
    snapshot_every_s: float = Field(30.0, gt=0.0)
    max_actors: int = Field(256, ge=1, description="actors the bandit keeps state for; beyond it the one seen "
                                                   "least recently is forgotten (restarted pods get new names)")
    seed: int = 0


class SequenceConfig(_Section):
    burn_in: int = Field(10, ge=0)
    length: int = Field(20, ge=1, description="learning steps per sequence, after burn-in")

    @property
    def total(self) -> int:
        return self.burn_in + self.length


class ReplayConfig(_Section):
    capacity_sequences: int = Field(2_000, ge=1)
    capacity_bytes: int = Field(2_000_000_000, ge=1)
    replay_ratio: float = Field(2.0, gt=0.0, description="times each sequence is trained on, on average")
    min_sequences: int = Field(32, ge=1, description="no batch is served before this many are stored")
    ratio_tolerance: float = Field(256.0, ge=1.0, description="slack of the rate limiter, in samples")
    max_message_bytes: int = Field(64_000_000, ge=1024)
    snapshot_every_s: float = Field(0.0, ge=0.0, description="seconds between snapshots of the buffer to "
                                                             "<run_dir>/replay/snapshot.bin, also written at a clean "
                                                             "stop and restored at start (0: none)")
    # Prioritised sequence replay (R2D2): P(i) ~ p_i^alpha, importance weights (n P(i))^-beta.
    prioritised: bool = False
    priority_exponent: float = Field(0.9, ge=0.0, description="alpha")
    importance_exponent: float = Field(0.6, ge=0.0, description="beta")
    priority_eta: float = Field(0.9, ge=0.0, le=1.0, description="p = eta max|delta| + (1 - eta) mean|delta|")


class LearnerConfig(_Section):
    batch_size: int = Field(16, ge=1)
    optimiser: Literal["adamw", "rmsprop", "rmsprop_tf"] = Field(
        "adamw", description="adamw (LBC Table 3), rmsprop (torch's) or rmsprop_tf (TensorFlow 1's, which IMPALA's "
                             "code used: mean square from 1, eps inside the root; lbc.optimisers)")
    learning_rate: float = Field(5.3e-4, gt=0.0)
    warmup_steps: int = Field(4000, ge=0)
    anneal_steps: int = Field(1_000_000, ge=1, description="lr and weight decay reach 0 here")
    weight_decay: float = Field(0.01, ge=0.0)
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-6
    rmsprop_decay: float = Field(0.99, gt=0.0, lt=1.0)
    rmsprop_eps: float = Field(0.01, gt=0.0)
    rmsprop_momentum: float = Field(0.0, ge=0.0, lt=1.0)
    clip_norm: float = Field(50.0, gt=0.0)
    push_every: int = Field(25, ge=1)
    accept_pushes: bool = Field(False, description="let gRPC clients push parameters into the learner's "
                                                   "ParameterService (off: only the learner publishes)")
    checkpoint_every: int = Field(500, ge=1, description="learner steps between checkpoints")
    recycle_every: int = Field(0, ge=0, description="learner steps between recyclings of the torso's dormant units "
                                                     "(ReDo, Sokar et al. 2023; lbc.recycling); 0: never")
    recycle_threshold: float = Field(0.025, ge=0.0, description="ReDo's tau: a unit whose mean |activation| is at "
                                                               "most this share of its layer's mean is dormant")
    diagnose_every: int = Field(100, ge=0, description="learner steps between counts of the torso's dead "
                                                        "units (lbc_learner_dead_units_ratio) on the batch's frames; "
                                                        "0: never")
    v_loss_scale: float = 1.0
    q_loss_scale: float = 5.0
    pi_loss_scale: float = 5.0
    entropy_cost: float = 0.0
    rho_bar: float = Field(1.05, gt=0.0)
    c_bar: float = Field(1.05, gt=0.0)
    trace_lambda: float = Field(1.0, ge=0.0, le=1.0)
    loss_reduction: Literal["mean", "sum"] = Field(
        "mean", description="losses averaged or summed over time and batch (IMPALA's code sums; its RMSProp "
                            "eps of 0.01 assumes summed gradients)")
    target_policy: Literal["softmax", "fixed_temperature", "behaviour_temperature", "behaviour_mixture"] = Field(
        "softmax", description="pi_i = softmax(A_i) (LBC as printed), softmax(target_tau A_i) (one fixed inverse "
                               "temperature), softmax(tau_i A_i) with the episode's tau_i (DiCE), or the episode's "
                               "whole behaviour mixture for every policy (GDI)")
    centre_q: bool = Field(False, description="Q = V + A - E_pi[A] (GDI) instead of Q = V + A (LBC)")
    target_update_every: int = Field(0, ge=0, description="learner steps between copies of the network into a "
                                     "target network whose V and Q the V-trace and Retrace targets bootstrap from "
                                     "(DQN, R2D2); 0: none, the online network's own (LBC App. F)")
    target_cache: bool = Field(True, description="keep the target network's outputs per replayed sequence until "
                               "the next copy, so a sequence drawn again is not unrolled again (lbc.target_cache; "
                               "the same values)")
    standardise_advantages: bool = Field(False, description="policy gradient on the batch's advantages less their "
                                         "mean, over their std, per policy (PPO's normalisation)")
    min_target_tau: float = Field(0.05, gt=0.0, description="floor on tau_i in the target policy")
    target_tau: float = Field(1.0, gt=0.0, description="the inverse temperature of target_policy=fixed_temperature")
    threads: int = Field(1, ge=1, description="intra-op threads of the learner")
    split_batch: int = Field(1, ge=1, description="parts of each batch computed at once in threads (one "
                                                  "intra-op thread each suits a CPU shared with actors)")
    prefetch: int = Field(2, ge=1, description="batches fetched from replay ahead of the one training (one of "
                          "them held by the learner when prepare_ahead)")
    requests_in_flight: int = Field(2, ge=1, le=16, description="requests for batches replay holds at once (within "
                                    "prefetch + 1 batches ahead): with one, a batch comes once per round trip "
                                    "(replay stacks it, sends it, the learner checks and pins it); more overlap them")
    prepare_ahead: bool = Field(False, description="read the next batch's frames and unroll the target network "
                                "over it in a thread of its own while this step trains (the same values; "
                                "learner_svc.training)")
    frame_blocks: bool = Field(True, description="a CPU learner reads its frames in blocks of the first "
                               "convolution's stride where that convolution can, and convolves them as a stride-1 "
                               "convolution (the same sums; decisions 83, 92)")
    native_stacks: bool = Field(True, description="a CPU learner's frame stacks in 4x4 blocks written by lbc.native's "
                                "C++ in one pass (built by make install; the same values, decision 96), else by "
                                "torch's passes")
    native_unroll: bool = Field(True, description="a CPU learner unrolls its LayerNorm-LSTM by lbc.native's C++ "
                                "(built by make install; the same equations in one pass a row, decision 90), else by "
                                "TorchScript")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when a GPU is visible")
    replicas: int = Field(1, ge=1, le=64, description="learner processes training one model, each on its own "
                          "batches, gradients averaged every step (learner_svc.replicas); replica 0 publishes "
                          "and checkpoints; they meet at endpoints.learner_group")
    group_backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="how replicas average their gradients: auto is NCCL on GPUs and gloo on CPUs; gloo on "
        "GPUs too where replicas share one GPU, which NCCL refuses")
    precision: Precision = Field("fp32", description="bf16: the network's matrix products and convolutions under "
                                 "bfloat16 autocast (losses and weights stay fp32); auto: bf16 on a CPU that computes "
                                 "in bfloat16 natively (AVX-512 BF16, AMX), else fp32 (lbc.devices.compute_precision)")
    compile: bool = Field(False, description="the recurrent core (LayerNormLSTM) unrolled through torch.compile's "
                          "fused kernels, 8 steps per graph, compiled in the learner's first steps (the same function "
                          "within float rounding; docs/speed.md)")
    cuda_graphs: bool = Field(False, description="a GPU learner replays the recurrent core's unroll (LayerNormLSTM, "
                              "forward and backward) as CUDA graphs captured in its first steps: two launches "
                              "where eager launches about 22 a step (lbc.lstm_bptt; the same arithmetic)")
    mps_share: int = Field(100, ge=1, le=100, description="under NVIDIA's MPS, the percent of the GPU's threads "
                           "the learner's kernels may occupy (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), the rest left "
                           "to the actors' inference; without MPS CUDA ignores it (lbc.devices.limit_mps_share)")
    gpu_wait: GpuWait = Field("sleep", description="how a GPU learner's threads wait for its results: sleep "
                              "(the core is free meanwhile) or spin (CUDA's busy wait); lbc.devices.wait_for_gpu")
    seed: int = 0


class ActorConfig(_Section):
    pull_every: int = Field(64, ge=1, description="vector steps between parameter pulls")
    threads: int = Field(1, ge=1)
    device: Literal["auto", "cpu", "cuda"] = Field("cpu", description="where actors and the evaluator run their "
                                                   "network: cuda batches each actor's inference on the GPU")
    cuda_graphs: bool = Field(False, description="the acting network's pass on a GPU replayed as a CUDA graph "
                              "captured at its first step, one launch where eager launches about 100 operations: "
                              "in each actor (actor.device auto or cuda), or with actor.inference=remote in the "
                              "inference service (inference.device auto or cuda), its batch padded up to a power "
                              "of two of at least 32 games (lbc.acting.forward; the same arithmetic)")
    gpu_wait: GpuWait = Field("sleep", description="how actors and the evaluator wait for their inference on a "
                              "GPU: sleep (the core is free meanwhile) or spin (CUDA's busy wait); "
                              "lbc.devices.wait_for_gpu")
    inference: Literal["local", "remote"] = Field(
        "local", description="local: each actor runs its network on its own games; remote: actors send each step's "
        "inputs to the inference service (python -m actor_svc --mode infer, endpoints.inference), which batches "
        "every actor's games into one forward pass with the newest parameters (SEED RL's central inference; "
        "inference.* settings, actor_svc.remote)")
    frame_ring: bool = Field(True, description="a CPU actor keeps its games' frame stacks as its first "
                             "convolution reads them, in blocks of its stride, each frame read once as it comes "
                             "(lbc.frame_ring; the same sums, decisions 85, 92)")
    native_ring: bool = Field(True, description="the frame ring's push, where its blocks are 4x4, by lbc.native's C++ "
                              "in one pass (each game's median, its blocks centred and converted, fresh stacks' older "
                              "slots zeroed), torch's passes where the library does not load; the same values "
                              "(decision 97)")
    precision: Precision = Field("fp32", description="bf16: the acting network's convolutions and linear layers "
                                 "hold bfloat16 weights (each pull converts into them) and run in bfloat16, its "
                                 "outputs and recurrent state fp32; actors, the evaluator, lbc evaluate and lbc play; "
                                 "auto: bf16 on a CPU that computes in bfloat16 natively, else fp32 "
                                 "(lbc.acting.set_precision, lbc.devices.compute_precision)")


class InferenceConfig(_Section):
    """The inference service (`python -m actor_svc --mode infer`) that actors with actor.inference=remote act
    through: one network on inference.device, one forward pass over the games of every request that came in
    together. Its network computes in actor.precision on that device and pulls parameters every
    actor.pull_every passes."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when a GPU is visible")
    max_batch_envs: int = Field(1024, ge=1, description="a pass stops taking requests once it holds this many "
                                "games (its last request may take it past them); one request may carry no more")
    max_wait_ms: float = Field(1.0, ge=0.0, le=1000.0, description="after the first request of a pass, how long "
                               "to wait for more (requests already queued are always taken)")
    threads: int = Field(1, ge=1, description="torch's intra-op threads for the service's forward pass")


class NguConfig(_Section):
    """Never Give Up (Badia et al. 2020): one Q-network conditioned on the mixture index j, trained
    on r^e + beta_j r^i with gamma_j; the intrinsic reward r^i from an episodic memory of learned
    embeddings, modulated by random network distillation. Values from NGU Table 6 unless noted."""

    enabled: bool = False
    num_mixtures: int = Field(32, ge=2, description="N, the family (beta_j, gamma_j), j = 0..N-1")
    beta: float = Field(0.3, ge=0.0, description="intrinsic reward scale of the most exploratory member")
    gamma_max: float = Field(0.997, gt=0.0, lt=1.0)
    gamma_min: float = Field(0.99, gt=0.0, lt=1.0)
    embedding_dim: int = Field(32, ge=1, description="p, the size of the controllable-state embedding")
    rnd_dim: int = Field(128, ge=1)
    memory_capacity: int = Field(30_000, ge=1, description="episodic memory slots per environment (ring)")
    neighbours: int = Field(10, ge=1, description="k of the k-nearest-neighbour pseudo-count")
    kernel_eps: float = Field(1e-3, gt=0.0, description="docs/decisions.md 21")
    pseudo_count_c: float = Field(1e-3, gt=0.0)
    cluster_xi: float = Field(8e-3, ge=0.0)
    max_similarity: float = Field(8.0, gt=0.0)
    max_modulation: float = Field(5.0, ge=1.0, description="L, the clip of the RND modulator")
    target_update_every: int = Field(1500, ge=1, description="learner steps between target-network copies")
    aux_steps: int = Field(5, ge=1, description="last steps of each sequence the embedding and RND train on")
    aux_learning_rate: float = Field(5e-4, gt=0.0)
    inverse_l2: float = Field(1e-5, ge=0.0, description="L2 weight on the action-prediction head")
    retrace_lambda: float = Field(0.95, ge=0.0, le=1.0)
    target_epsilon: float = Field(0.01, ge=0.0, le=1.0, description="epsilon of the greedy target policy")
    value_rescale_eps: float = Field(1e-3, gt=0.0, description="epsilon of h(z) (R2D2)")
    actor_epsilon_base: float = Field(0.4, gt=0.0, le=1.0, description="eps_e = base^(1 + alpha e / (E - 1))")
    actor_epsilon_alpha: float = Field(7.0, ge=0.0)
    # Agent57's sliding-window UCB over j (used when behaviour.controlled, docs/decisions.md 22)
    window: int = Field(160, ge=1, description="episodes in the meta-controller's window")
    ucb_beta: float = Field(1.0, ge=0.0)
    ucb_epsilon: float = Field(0.5, ge=0.0, le=1.0, description="chance of a uniform j")


class EvalConfig(_Section):
    """The evaluator (`python -m actor_svc --mode eval`): the papers' protocol (30 no-ops, the frame cap,
    the full action set) with a fixed evaluation policy, on its own environments and seeds, never
    sending data to replay. docs/decisions.md 28."""

    enabled: bool = Field(True, description="the launcher starts an evaluator beside the actors")
    every_versions: int = Field(40, ge=1, description="parameter versions between two evaluations")
    episodes: int = Field(8, ge=1, description="episodes per evaluation")
    num_envs: int = Field(8, ge=1, description="environments the episodes are spread over")
    policy: Literal["auto", "greedy", "sample"] = Field(
        "auto", description="greedy: epsilon-greedy on the mean advantage of the behaviour's components (NGU: "
                            "on Q of j = 0); sample: draw from the target policy softmax(fixed_tau A); auto: "
                            "sample for uncontrolled Boltzmann behaviours (IMPALA, dice-fixed), else greedy")
    epsilon: float = Field(0.01, ge=0.0, le=1.0, description="epsilon of the greedy evaluation policy")
    sticky_actions: bool = Field(False, description="Machado et al. 2018: repeat the last action with p 0.25")
    seed: int = Field(1_000_003, description="seed of the evaluation games (apart from every actor's), applied at "
                                          "the first evaluation; later ones go on from the games' random "
                                          "numbers (decision 86)")


class Endpoints(_Section):
    """Where services listen and find each other. On Kubernetes these are service names."""

    params: str = "127.0.0.1:50051"
    bandit: str = "127.0.0.1:50052"
    replay_ingest: str = "tcp://127.0.0.1:5555"
    replay_serve: str = "tcp://127.0.0.1:5556"
    replay_health: str = "127.0.0.1:50053"
    actor_health_base: int = 50060
    learner_metrics: int = 9101
    replay_metrics: int = 9102
    bandit_metrics: int = 9103
    eval_metrics: int = 9104
    eval_health: str = "127.0.0.1:50054"
    inference: str = Field("tcp://127.0.0.1:5557", description="the inference service's ZeroMQ socket "
                           "(actor.inference=remote)")
    inference_health: str = "127.0.0.1:50055"
    inference_metrics: int = 9105
    actor_metrics_base: int = 9110
    learner_group: str = Field("127.0.0.1:29500", description="where learner replicas meet (replica 0 listens)")
    learner_replica_metrics_base: int = Field(9140, description="replica r > 0 serves its metrics at this + r")
    rpc_timeout_s: float = Field(5.0, gt=0.0)
    bind_host: str = Field("127.0.0.1", description="address every service listens on: loopback for a local "
                           "run; the Kubernetes ConfigMap sets 0.0.0.0 so probes and peers reach the pod")


def endpoint_port(endpoint: str) -> int:
    """The port of an endpoint ("host:port" or "tcp://host:port")."""
    return int(endpoint.rsplit(":", 1)[1])


# Ports from one base (the launcher's --port-base): fixed services at base..base+13, learner replica r's
# metrics at base+20+r, actor i's health and metrics at base+100+i and base+200+i, so up to 100 actors and
# 64 learner replicas never collide with a service.
PORT_BASE_SPAN = 300


class SecurityConfig(_Section):
    """Mutual TLS on the gRPC APIs and CURVE on replay's and the inference service's ZeroMQ sockets
    (lbc.security)."""

    enabled: bool = Field(False, description="only holders of the run's certificates and keys may connect; health-"
                                             "only ports stay plain (Kubernetes probes speak no TLS)")
    certs_dir: str = Field("", description="the run's certificates (lbc certs DIR); empty: <run_dir>/certs")


def endpoints_from_base(base: int) -> list[str]:
    """--set overrides placing every endpoint on loopback relative to one base port."""
    if not 1024 <= base <= 65535 - PORT_BASE_SPAN:
        raise ValueError(f"must lie in [1024, {65535 - PORT_BASE_SPAN}], got {base}")
    host = "127.0.0.1"
    return [f"endpoints.params={host}:{base}", f"endpoints.bandit={host}:{base + 1}",
            f"endpoints.replay_ingest=tcp://{host}:{base + 2}", f"endpoints.replay_serve=tcp://{host}:{base + 3}",
            f"endpoints.replay_health={host}:{base + 4}", f"endpoints.eval_health={host}:{base + 5}",
            f"endpoints.learner_metrics={base + 6}", f"endpoints.replay_metrics={base + 7}",
            f"endpoints.bandit_metrics={base + 8}", f"endpoints.eval_metrics={base + 9}",
            f"endpoints.learner_group={host}:{base + 10}", f"endpoints.inference=tcp://{host}:{base + 11}",
            f"endpoints.inference_health={host}:{base + 12}", f"endpoints.inference_metrics={base + 13}",
            f"endpoints.learner_replica_metrics_base={base + 20}",
            f"endpoints.actor_health_base={base + 100}", f"endpoints.actor_metrics_base={base + 200}"]


class Config(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LBC_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    preset: str = "cpu"
    run_dir: str = "runs/default"
    env: EnvConfig = EnvConfig()
    policies: tuple[PolicySpec, ...] = (
        PolicySpec(gamma=0.997, reward_shaping="rs1"),
        PolicySpec(gamma=0.999, reward_shaping="rs2"),
        PolicySpec(gamma=0.99, reward_shaping="rs3"),
    )
    net: NetConfig = NetConfig()
    behaviour: BehaviourConfig = BehaviourConfig()
    bandit: BanditConfig = BanditConfig()
    sequence: SequenceConfig = SequenceConfig()
    replay: ReplayConfig = ReplayConfig()
    learner: LearnerConfig = LearnerConfig()
    actor: ActorConfig = ActorConfig()
    inference: InferenceConfig = InferenceConfig()
    ngu: NguConfig = NguConfig()
    eval: EvalConfig = EvalConfig()
    endpoints: Endpoints = Endpoints()
    security: SecurityConfig = SecurityConfig()

    @property
    def certs_path(self) -> Path:
        return Path(self.security.certs_dir or Path(self.run_dir) / "certs")

    @property
    def num_policies(self) -> int:
        return len(self.policies)

    @property
    def components(self) -> list[int]:
        """The policy head behind each component of the behaviour mixture."""
        heads = self.behaviour.component_heads
        return list(range(self.num_policies)) if heads is None else list(heads)

    @property
    def num_components(self) -> int:
        return len(self.components)

    @property
    def tau_max(self) -> float:
        """The largest first half of psi an actor can act with: the bandit's range or the fixed tau."""
        return max(self.behaviour.tau_range[1], self.behaviour.fixed_tau) * (1 + 1e-6)

    @model_validator(mode="after")
    def _check(self) -> Config:
        if not self.policies:
            raise ValueError("policies: at least one policy is needed")
        # imported here: lbc.envs reads this module's EnvConfig
        from lbc.envs import env_spec
        from lbc.torsos import resolve_torso, torso_problem

        spec = env_spec(self.env)
        problem = torso_problem(self.net.torso, spec.obs_shape)
        if problem:
            raise ValueError(f"{problem} (env {self.env.name})")
        torso = resolve_torso(self.net.torso, spec.obs_shape)
        if self.learner.recycle_every and torso not in ("small", "mlp"):
            raise ValueError(f"learner.recycle_every covers the small and mlp torsos, not net.torso={torso}")
        if self.learner.split_batch > self.learner.batch_size:
            raise ValueError("learner.split_batch cannot exceed learner.batch_size")
        if self.learner.cuda_graphs and (self.learner.compile or self.learner.device == "cpu"):
            raise ValueError("learner.cuda_graphs needs a GPU learner (learner.device auto or cuda) and "
                             "learner.compile=false: both replace the same unroll")
        pass_device = self.inference.device if self.actor.inference == "remote" else self.actor.device
        if self.actor.cuda_graphs and pass_device == "cpu":
            raise ValueError("actor.cuda_graphs needs the acting pass on a GPU: actor.device (or, with "
                             "actor.inference=remote, inference.device) auto or cuda")
        if self.replay.min_sequences < self.learner.batch_size:
            raise ValueError("replay.min_sequences must be at least learner.batch_size")
        if self.replay.ratio_tolerance < self.learner.batch_size + self.replay.replay_ratio:
            raise ValueError("replay.ratio_tolerance must be at least learner.batch_size + replay.replay_ratio "
                             "(else the rate limiter can block both actors and learner)")
        if self.replay.capacity_sequences < self.replay.min_sequences:
            raise ValueError("replay.capacity_sequences must be at least replay.min_sequences")
        if self.learner.rho_bar < self.learner.c_bar:
            raise ValueError("V-trace needs rho_bar >= c_bar (IMPALA sec. 4.1)")
        if not self.components or not all(0 <= h < self.num_policies for h in self.components):
            raise ValueError(f"behaviour.component_heads must name policies 0..{self.num_policies - 1}")
        if self.bandit.algorithm == "bva" and (self.num_components > 2 or self.behaviour.family != "boltzmann_mixture"):
            raise ValueError("bandit.algorithm=bva (DiCE, GDI) needs one or two behaviour components and the "
                             "boltzmann_mixture family")
        if self.learner.target_policy != "softmax" and self.behaviour.family != "boltzmann_mixture":
            raise ValueError(f"learner.target_policy={self.learner.target_policy} needs behaviour.family="
                             "boltzmann_mixture")
        if self.learner.target_policy == "behaviour_temperature" and self.components != list(range(self.num_policies)):
            raise ValueError("learner.target_policy=behaviour_temperature needs one component per policy")
        if self.behaviour.family == "epsilon_greedy_mixture" and self.behaviour.tau_range[1] > 1.0:
            raise ValueError("behaviour.tau_range holds epsilon for epsilon_greedy_mixture and must lie in [0, 1]")
        if self.ngu.enabled and self.actor.inference == "remote":
            raise ValueError("actor.inference=remote covers the LBC family: NGU's actors compute their intrinsic "
                             "rewards with networks of their own, pulled with the policy")
        if self.ngu.enabled:
            self._check_ngu()
        elif self.bandit.algorithm == "sliding_window_ucb":
            raise ValueError("bandit.algorithm=sliding_window_ucb chooses NGU's j and needs ngu.enabled=true")
        for name in ("tau_range", "omega_range"):
            lo, hi = getattr(self.behaviour, name)
            if not 0.0 <= lo < hi:
                raise ValueError(f"behaviour.{name} must satisfy 0 <= low < high, got {(lo, hi)}")
        return self

    def _check_ngu(self) -> None:
        if self.num_policies != 1:
            raise ValueError("ngu.enabled: one policy (the j-conditioned Q-network) is needed; its gamma is "
                             "replaced by gamma_j")
        if self.behaviour.controlled and self.bandit.algorithm != "sliding_window_ucb":
            raise ValueError("ngu.enabled with behaviour.controlled needs bandit.algorithm=sliding_window_ucb "
                             "(Agent57); NGU itself fixes j per environment (behaviour.controlled=false)")
        if self.ngu.gamma_min > self.ngu.gamma_max:
            raise ValueError("ngu.gamma_min must not exceed ngu.gamma_max")
        if self.ngu.aux_steps > self.sequence.length:
            raise ValueError("ngu.aux_steps cannot exceed sequence.length")
        if self.net.core == "feedforward":
            raise ValueError("ngu.enabled needs a recurrent net.core: the network reads j and the intrinsic "
                             "reward through its core")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _PresetSource(settings_cls))


class _PresetSource(PydanticBaseSettingsSource):
    """Lowest-priority source: the values of the preset named by the higher sources."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        name = self.current_state.get("preset", "cpu")
        if name not in PRESETS:
            raise ValueError(unknown_name("preset", name, sorted(PRESETS)))
        return dict(PRESETS[name])


def unknown_name(kind: str, name: str, known: list[str]) -> str:
    """One line for a name that is not among `known`, with the closest ones ("did you mean")."""
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"did you mean {' or '.join(close)}?" if close else \
        (f"known: {', '.join(known)}" if len(known) <= 20 else f"{len(known)} known, e.g. {', '.join(known[:3])}")
    return f"unknown {kind} {name!r}: {hint}"


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Turn ``["learner.lr=1e-3", "env.game=breakout"]`` into a nested dict.

    Values are read as JSON when they parse (numbers, booleans, lists), else kept as strings.
    """
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key.path=value")
        key, raw = item.split("=", 1)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r} conflicts with an earlier one")
        node[parts[-1]] = value
    return out


def load_config(preset: str | None = None, overrides: Iterable[str] | Mapping[str, Any] = ()) -> Config:
    """Build the validated configuration: defaults < preset < environment < overrides."""
    init = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    if preset is not None:
        init["preset"] = preset
    return Config(**init)
