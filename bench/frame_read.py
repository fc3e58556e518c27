"""How the learner and the actors read frames, each way against the others, on one core.

Four reads: float32 pixels from the uint8 stacks (before decision 65); bfloat16 pixels under bf16 autocast,
which the first convolution computes in anyway (decision 65); bfloat16 pixels read straight from a batch's
single frames, each frame read once and the stacks written once in the torso's layout (decision 66), where the
learner built the uint8 stacks first and read those; and those stacks in 4x4 blocks, which the first convolution
reads as a stride-1 convolution (decision 83; the learner's alone). This measures them on the stages they act on,
interleaved in blocks so that the machine's drift falls on all alike: CPU milliseconds per learner step (both
threads with learner.prepare_ahead) and acting steps' samples per CPU second (actors read the games' own stacks, so
the last three reads are the same code there: their difference is the noise). Figures are printed, never asserted.

    python -m bench.frame_read --preset impala --rounds 8
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

import lbc.nets
from bench.throughput import acting_step, allocate_as_services, cpu_block, cpu_timed, learner_step
from lbc.config import PRESETS, load_config
from lbc.devices import compute_precision
from lbc.frame_stacks import observations


def _stacks_first(net: lbc.nets.LBCNet, b: Mapping[str, torch.Tensor]) -> torch.Tensor | lbc.nets.Frames:
    """The learner's read before decision 66: the batch's uint8 stacks built, then read."""
    return net.torso_input(observations(b))


# the learner's read as lbc.nets defines it, kept before any Read.install replaces it
_SEQUENCE_INPUT = lbc.nets.LBCNet.sequence_input


def _plain_frames(net: lbc.nets.LBCNet, b: Mapping[str, torch.Tensor]) -> torch.Tensor | lbc.nets.Frames:
    """The learner's read before decision 83: the stacks of single frames in the torso's plain layout."""
    blocks, net.frame_blocks = net.frame_blocks, 1
    try:
        return _SEQUENCE_INPUT(net, b)
    finally:
        net.frame_blocks = blocks


@dataclass(frozen=True)
class Read:
    pixel_dtype: Callable[[str], torch.dtype]
    sequence_input: Callable[[lbc.nets.LBCNet, Mapping[str, torch.Tensor]], torch.Tensor | lbc.nets.Frames]

    def install(self) -> None:
        lbc.nets.pixel_dtype = self.pixel_dtype
        lbc.nets.LBCNet.sequence_input = self.sequence_input


READS: dict[str, Read] = {
    "float32 stacks": Read(lambda device_type: torch.float32, _stacks_first),
    "bfloat16 stacks": Read(lbc.nets.pixel_dtype, _stacks_first),
    "bfloat16 frames": Read(lbc.nets.pixel_dtype, _plain_frames),
    "frames in blocks": Read(lbc.nets.pixel_dtype, _SEQUENCE_INPUT),
}
CURRENT = "frames in blocks"


def interleaved(step: Callable[[], float], rounds: int, block_seconds: float) -> dict[str, float]:
    """Median seconds per step of each read, by what `step` returns (cpu_timed), blocks of `block_seconds`
    taking turns."""
    per_step: dict[str, list[float]] = {name: [] for name in READS}
    try:
        for _ in range(rounds):
            for name, read in READS.items():
                read.install()
                per_step[name].append(cpu_block(step, block_seconds))
    finally:
        READS[CURRENT].install()
    return {name: statistics.median(times) for name, times in per_step.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--game", default="pong")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    allocate_as_services("bench.frame_read")
    torch.set_num_threads(1)
    cfg = load_config(args.preset, [f"env.game={args.game}"])
    cpu = torch.device("cpu")
    print(f"preset {args.preset}, frames centred: {cfg.net.centre_frames}, learner in "
          f"{compute_precision(cfg.learner.precision, cpu)}, actor in {compute_precision(cfg.actor.precision, cpu)} "
          f"(fp32: every read is float32); {args.rounds} rounds of {args.block_seconds:g} s blocks, one core")
    learner = interleaved(cpu_timed(learner_step(cfg)[1]), args.rounds, args.block_seconds)
    samples = cfg.learner.batch_size * cfg.sequence.length
    acting = interleaved(cpu_timed(acting_step(cfg)), args.rounds, args.block_seconds)
    print(f"{'read':16} {'learner ms CPU/step':>20} {'learner samples/CPU-s':>22} {'acting samples/CPU-s':>21}")
    for name in READS:
        print(f"{name:16} {learner[name] * 1e3:20.1f} {samples / learner[name]:22,.0f} "
              f"{cfg.env.num_envs / acting[name]:21,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
