"""The named presets, as data: each is an algorithm (what its paper specifies) laid over a sizing (what
the machine affords: `PAPER_SIZING`, `CPU_SIZING`, `CATCH_SIZING`) by one deep merge, `deep_merge`,
which the tests use too. Only values that differ from lbc.config's defaults are written here;
`lbc config show --preset P` prints a preset resolved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Tree = dict[str, Any]


def deep_merge(base: Mapping[str, Any], *layers: Mapping[str, Any]) -> Tree:
    """`base` with each layer laid over it in turn: nested sections merge key by key, any other value
    (lists included) replaces the one below. The inputs are left untouched."""
    out: Tree = {key: deep_merge(value) if isinstance(value, Mapping) else value for key, value in base.items()}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = deep_merge(out[key], value)
            else:
                out[key] = deep_merge(value) if isinstance(value, Mapping) else value
    return out


# ---- sizings -----------------------------------------------------------------------------------------

# LBC Table 3's scale: needs a GPU learner.
PAPER_SIZING: Tree = {
    "net": {"torso": "deep"},
    "sequence": {"burn_in": 40, "length": 80},
    "replay": {"replay_ratio": 2.0, "capacity_sequences": 50_000, "capacity_bytes": 60_000_000_000,
               "min_sequences": 1_000},
    "learner": {"batch_size": 64, "warmup_steps": 4000},
    "actor": {"pull_every": 64},
    "env": {"num_envs": 32},
}

# Two cores and no GPU (DESIGN §6). The learner bounds throughput and the actor leaves ~half a core idle.
# Two halves of each batch in two threads of one intra-op thread each use that half core better than two
# intra-op threads, whose barriers wait on the actor (measured: 15% more learner steps/s beside a 60% load).
CPU_SIZING: Tree = {
    "net": {"torso": "small"},
    "sequence": {"burn_in": 10, "length": 20},
    "replay": {"replay_ratio": 2.0, "capacity_sequences": 2_000, "capacity_bytes": 2_500_000_000,
               "min_sequences": 64},
    "learner": {"batch_size": 16, "warmup_steps": 200, "anneal_steps": 200_000, "checkpoint_every": 500,
                "threads": 1, "split_batch": 2},
    "actor": {"pull_every": 64},
    "env": {"num_envs": 16},
}

# The built-in Catch game (minutes on two cores), laid over any preset for the end-to-end tests.
CATCH_SIZING: Tree = {
    "env": {"kind": "catch", "num_envs": 8},
    "net": {"torso": "mlp", "hidden": 64, "lstm": 64},
    "sequence": {"burn_in": 2, "length": 10},
    "replay": {"replay_ratio": 2.0, "capacity_sequences": 1_000, "min_sequences": 32},
    "learner": {"batch_size": 32, "learning_rate": 2e-3, "warmup_steps": 20, "anneal_steps": 100_000,
                "push_every": 5, "checkpoint_every": 200, "clip_norm": 40.0},
    "actor": {"pull_every": 10},
    "eval": {"every_versions": 10, "episodes": 32, "num_envs": 8},
}

# MinAtar (Young & Tian 2019; env.kind=minatar): 10x10 boards, one frame per agent step, sticky actions 0.1
# as its paper trains and reports, MinAtar's one-convolution network with 128 features. Laid over a preset
# with the game chosen by --set env.game=... (breakout, space_invaders, freeway, asterix, seaquest).
MINATAR_SIZING: Tree = {
    "env": {"kind": "minatar", "game": "breakout", "num_envs": 16, "repeat_action_probability": 0.1,
            "max_episode_frames": 100_000},
    "net": {"torso": "minatar", "hidden": 128, "lstm": 128},
    "sequence": {"burn_in": 5, "length": 20},
    "replay": {"replay_ratio": 2.0, "capacity_sequences": 5_000, "capacity_bytes": 2_000_000_000, "min_sequences": 64},
    "learner": {"batch_size": 16, "learning_rate": 1e-3, "warmup_steps": 100, "anneal_steps": 1_000_000,
                "push_every": 10, "checkpoint_every": 500, "threads": 1, "split_batch": 1},
    "actor": {"pull_every": 20},
    "eval": {"every_versions": 20, "episodes": 16, "num_envs": 8},
}

# ---- algorithms --------------------------------------------------------------------------------------

# LBC-BM (Table 3): three policies (gamma_i, RS_i), the Boltzmann mixture over all of them chosen per
# episode by the bandits, Retrace + V-trace + policy gradient at 1 / 5 / 5 (lbc.config's defaults).
LBC_POLICIES: list[Tree] = [
    {"gamma": 0.997, "reward_shaping": "rs1"},
    {"gamma": 0.999, "reward_shaping": "rs2"},
    {"gamma": 0.99, "reward_shaping": "rs3"},
]
LBC: Tree = {"policies": LBC_POLICIES, "learner": {"learning_rate": 5.3e-4}}

# What LBC-BM needs to hold a score on Atari with a CPU's batch of 16 x 20 (docs/decisions.md 48): DiCE's
# target (each policy's softmax at the episode's temperature, centred Q) in place of LBC's printed
# softmax(A_i), under which Breakout collapsed in 3 of 3 runs that rose; impala-cpu's optimisation
# (orthogonal initialisation, Adam at 2.5e-4 with eps 1e-5, no weight decay, gradients clipped at 0.5);
# each frame less its median (the torso stays alive on Pong, decision 34); an episode end at a life loss for
# learning (IMPALA's Atari table; scores stay whole games). Breakout at 5M frames went from 4.5 to 16.75 and
# 32.75 (two seeds). Only `cpu` has it: the ablations, Catch and MinAtar keep LBC's printed design (not
# measured with these settings). The three policies keep LBC's reward shapes RS1-3 with gamma 0.99 each
# (decision 51): with LBC's 0.997 / 0.999 no run learned Pong in 10M frames; with 0.99 it reached about 0.
LBC_CPU_TRAINING: Tree = {
    "policies": [{**policy, "gamma": 0.99} for policy in LBC_POLICIES],
    "net": {"init": "orthogonal", "centre_frames": True},
    # decision 91: 32 games an actor, pulling every 32 passes (the same pulls a frame as 16 games every 64): on two
    # cores one actor's serial loop bounds `cpu`, and a pass of 32 games costs a sample 0.5-0.7x of 16's
    "env": {"episodic_life": True, "num_envs": 32},
    "learner": {"target_policy": "behaviour_temperature", "centre_q": True, "learning_rate": 2.5e-4,
                "adam_betas": [0.9, 0.999], "adam_eps": 1e-5, "weight_decay": 0.0, "clip_norm": 0.5,
                "target_update_every": 250,   # decision 53: a target network for the bootstrap values
                # one thread trains the whole batch (decision 55) and prepares it too (decision 84): the next batch
                # prepared in a second thread gains on free cores, but beside the actor on two it cost 4-5% frames/s
                "split_batch": 1, "prepare_ahead": False,
                "precision": "auto"},   # decision 63: bf16 autocast on a CPU that computes in bfloat16
    "actor": {"precision": "auto", "pull_every": 32},   # decision 64: the actors' network in bf16 there too
}

# IMPALA (Espeholt et al. 2018): one policy, V-trace actor-critic, entropy bonus, clipped rewards,
# no behaviour control. The Atari table of IMPALA (App. G) is its own sizing: unroll 20, batch 32, RMSProp
# (decay 0.99, eps 0.01, no momentum), learning rate 6e-4 annealed linearly, baseline 0.5, entropy 0.01,
# clip 40, gamma 0.99, an episode end at a life loss (for learning; scores are whole games).
IMPALA: Tree = {
    "policies": [{"gamma": 0.99, "reward_shaping": "clip"}],
    "net": {"torso": "small"},
    "behaviour": {"controlled": False, "fixed_tau": 1.0},
    "sequence": {"burn_in": 0, "length": 20},
    "replay": {"replay_ratio": 1.0, "capacity_sequences": 500, "min_sequences": 32},
    "learner": {"batch_size": 32, "optimiser": "rmsprop", "learning_rate": 6e-4, "warmup_steps": 0,
                "anneal_steps": 200_000, "weight_decay": 0.0, "rmsprop_decay": 0.99, "rmsprop_eps": 0.01,
                "rmsprop_momentum": 0.0, "loss_reduction": "sum", "v_loss_scale": 0.5, "q_loss_scale": 0.0,
                "pi_loss_scale": 1.0, "entropy_cost": 0.01, "rho_bar": 1.0, "c_bar": 1.0, "clip_norm": 40.0,
                # decision 77: the whole batch in one thread; on two cores the halves in two threads cost 14% more
                # learner CPU an agent step, and the actors want that CPU (1.4-4.9% more frames/s in five pairs)
                "threads": 1, "split_batch": 1,
                "precision": "auto"},   # decision 63: bf16 autocast on a CPU that computes in bfloat16
    # decision 64: the actors' network in bf16 there too. Decisions 78 and 80: 64 games an actor, whose inference a
    # sample costs half of 16's on a CPU, pulling every 16 passes (the same pulls a frame as 16 games every 64)
    "actor": {"precision": "auto", "pull_every": 16},
    "env": {"num_envs": 64, "episodic_life": True},
    "eval": {"every_versions": 5},   # a version every 25 x 640 samples: evaluate about every 320k frames
}

# IMPALA sized for a CPU (docs/decisions.md 29, 36): the paper's losses (V-trace, baseline 0.5, entropy 0.01),
# clipped rewards, life-loss ends and unroll 20, with a batch of 8 (TorchBeast's: four times the paper's
# updates per frame), the feed-forward network of IMPALA's Atari table, and the optimisation of the
# actor-critics that learn Atari on a few cores (cleanrl, OpenAI baselines): orthogonal initialisation,
# Adam at 2.5e-4 (eps 1e-5) on the mean loss, gradients clipped at 0.5. With the paper's RMSProp on summed
# losses and torch's initialisation, 80% of the features were dead and nothing was learnt in 5M Breakout
# frames in any of seven variants; with these, the dead share fell to 4% and Breakout rose to 5-6. Each sample
# is learnt from four times (replay ratio 4, the sample reuse of PPO's epochs; decision 45): Breakout at 5M
# frames went from 5.1 (ratio 1) to 12.3 (2) and 17.3 (4).
IMPALA_CPU_SIZING: Tree = {
    "net": {"core": "feedforward", "init": "orthogonal"},
    "replay": {"min_sequences": 16, "replay_ratio": 4.0},
    "learner": {"batch_size": 8, "optimiser": "adamw", "learning_rate": 2.5e-4, "adam_betas": [0.9, 0.999],
                "adam_eps": 1e-5, "loss_reduction": "mean", "clip_norm": 0.5,
                "split_batch": 2},   # CPU_SIZING's layout: four samples learnt per frame bound it, not the actor
    # 16 games an actor, not impala's 64 (decisions 78, 80): its learner bounds it, as `cpu`'s (32 measured no faster)
    "actor": {"pull_every": 64},
    "env": {"num_envs": 16},
    "eval": {"every_versions": 20},
}

# DiCE (P1 Table 5): one policy (gamma 0.997, the asymmetric log reward shape = RS_2), behaviour
# softmax(A / tau_DiCE) with 1/tau_DiCE on [0, 50] chosen per episode by the Bandits Vote Algorithm
# (7 tile-coded bandits, 7 candidates, value normalisation, UCB 1.0), the target policy at the episode's
# temperature with the temperature-scaled gradient, no entropy term, loss scales 1 / 10 / 10.
DICE: Tree = {
    "policies": [{"gamma": 0.997, "reward_shaping": "rs2"}],
    "behaviour": {"controlled": True, "tau_range": [0.0, 50.0]},
    "bandit": {"algorithm": "bva", "population": 7, "top_d": 7, "bva_accuracy": 0.1, "bva_ucb_c": 1.0,
               "normalise_values": True},
    "learner": {"learning_rate": 5e-4, "v_loss_scale": 1.0, "q_loss_scale": 10.0, "pi_loss_scale": 10.0,
                "entropy_cost": 0.0, "rho_bar": 1.05, "c_bar": 1.05, "target_policy": "behaviour_temperature"},
}

# GDI (P2, Table 6): behaviour eps softmax(A_1/tau_1) + (1 - eps) softmax(A_2/tau_2) with
# (1/tau_1, 1/tau_2, eps) per episode from three BVA ensembles (7 bandits, 3 candidates, widths {2, 3, 4},
# lr {0.05, 0.1, 0.2}, UCB 1.0), the mixture itself as every policy's target, centred Q, no entropy term,
# loss scales 1 / 10 / 10, gamma 0.997. GDI-I3: one head twice, the log shape; GDI-H3: two heads under the
# log and the quarter-root shapes (docs/decisions.md 25).
GDI_I3: Tree = deep_merge(DICE, {
    "behaviour": {"component_heads": [0, 0]},
    "bandit": {"top_d": 3, "bva_widths": [2, 3, 4], "bva_epsilon_accuracy": 0.1},
    "learner": {"target_policy": "behaviour_mixture", "centre_q": True},
})
GDI_H3: Tree = deep_merge(GDI_I3, {
    "policies": [{"gamma": 0.997, "reward_shaping": "rs2"}, {"gamma": 0.997, "reward_shaping": "quarter_root"}],
    "behaviour": {"component_heads": [0, 1]},
})

# NGU (P3, App. A, Table 6): one Q-network conditioned on j (one-hot) and on the intrinsic reward,
# epsilon-greedy actors with j fixed per environment, the intrinsic reward from the episodic memory and RND,
# transformed Retrace(0.95) with a target network, prioritised sequence replay, Adam (Q: 1e-4, auxiliary:
# 5e-4, eps 1e-4), clip 40, unclipped rewards (h rescales them). On the cpu sizing one actor of 16
# environments plays 16 mixture members (the paper: N = 32 over hundreds of actors; --set
# ngu.num_mixtures=32 with two actors or 32 environments). docs/decisions.md 27.
NGU: Tree = {
    "policies": [{"gamma": 0.997, "reward_shaping": "identity"}],
    "behaviour": {"controlled": False},
    "replay": {"prioritised": True, "priority_exponent": 0.9, "importance_exponent": 0.6, "priority_eta": 0.9},
    "learner": {"optimiser": "adamw", "learning_rate": 1e-4, "warmup_steps": 0, "anneal_steps": 1_000_000_000,
                "weight_decay": 0.0, "adam_betas": [0.9, 0.999], "adam_eps": 1e-4, "clip_norm": 40.0},
    "ngu": {"enabled": True, "num_mixtures": 16},
}
# Agent57-style selection (Badia et al. 2020a, App. D): NGU with j chosen per episode by a sliding-window
# UCB bandit per actor in bandit_svc, from the episode's extrinsic return.
AGENT57: Tree = deep_merge(NGU, {"behaviour": {"controlled": True}, "bandit": {"algorithm": "sliding_window_ucb"}})

# ---- the presets ---------------------------------------------------------------------------------------

_LBC_PAPER = deep_merge(PAPER_SIZING, LBC)
_LBC_CPU = deep_merge(CPU_SIZING, LBC)
_DICE_CPU = deep_merge(CPU_SIZING, DICE)   # paper scale: deep_merge(PAPER_SIZING, DICE)
_NGU_CPU = deep_merge(CPU_SIZING, NGU)

PRESETS: dict[str, Tree] = {
    "lbc-bm": _LBC_PAPER,
    "paper": _LBC_PAPER,   # the same preset, by the name DESIGN uses for the paper's scale
    "cpu": deep_merge(_LBC_CPU, LBC_CPU_TRAINING),   # the embedded default
    "impala": IMPALA,
    "impala-cpu": deep_merge(IMPALA, IMPALA_CPU_SIZING),
    # LBC's ablations (section 5.3, Fig. 5 / Table 12): reduce H (all three policy models are h_1), reduce
    # H and Psi (one policy, psi = tau), random behaviour selection (the bandits never learn). Decision 20.
    "lbc-reduce-h": deep_merge(_LBC_CPU, {"policies": [LBC_POLICIES[0]] * 3}),
    "lbc-reduce-h-psi": deep_merge(_LBC_CPU, {"policies": [LBC_POLICIES[0]]}),
    "lbc-random": deep_merge(_LBC_CPU, {"bandit": {"learn": False}}),
    "dice": _DICE_CPU,
    # DiCE's ablations (P1 section 4.3): "baseline" fixes tau = 1; "random" never updates the bandits.
    "dice-fixed": deep_merge(_DICE_CPU, {"behaviour": {"controlled": False, "fixed_tau": 1.0}}),
    "dice-random": deep_merge(_DICE_CPU, {"bandit": {"learn": False}}),
    "gdi-i3": deep_merge(CPU_SIZING, GDI_I3),
    "gdi-h3": deep_merge(CPU_SIZING, GDI_H3),
    "ngu": _NGU_CPU,
    "agent57": deep_merge(CPU_SIZING, AGENT57),
    # MinAtar: LBC-BM and IMPALA (its CPU optimisation) on MinAtar's boards; --set env.game=space_invaders etc.
    "minatar": deep_merge(_LBC_CPU, MINATAR_SIZING),
    "impala-minatar": deep_merge(IMPALA, IMPALA_CPU_SIZING, MINATAR_SIZING),
    # LBC-BM on the built-in Catch game: the end-to-end learning check.
    "catch": deep_merge(_LBC_CPU, CATCH_SIZING, {"behaviour": {"tau_range": [0.0, 10.0], "tau_accuracy": 1.0}}),
}
