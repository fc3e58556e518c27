"""lbc's native code, torch operators in one library:
- the LayerNorm-LSTM's unroll on a CPU (lbc/csrc/ln_lstm.cpp, decision 90), the same equations as lbc.lstm_bptt's
  unroll_forward and unroll_backward with each step's elementwise work in one pass over each row, where TorchScript
  runs a dozen small kernels a step;
- the area resize of ALE's screens (lbc/csrc/area_resize.cpp, decision 94): OpenCV's INTER_AREA to the bit, for
  lbc.screens;
- a CPU learner's frame stacks in 4x4 blocks written in one pass (lbc/csrc/frame_stacks.cpp, decision 96), for
  lbc.nets, and an actor's frame ring pushed the same way (decision 97), for lbc.frame_ring.

`make install` builds it (`python -m lbc.native`: g++ against the installed torch's headers and libraries) into
the package, beside this file. A learner on a CPU loads it (learner.native_unroll) and unrolls by TorchScript
where it is not built, does not load, or the CPU lacks AVX2 (the build's target), saying so in its log; Atari
games resize by ALE's own code there (env.native_resize).

    python -m lbc.native            # build (again)
    python -m lbc.native --check    # whether it loads here
"""

from __future__ import annotations

import argparse
import functools
import logging
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
LIBRARY = Path(__file__).with_name("liblbc_native.so")
COMMON_FLAGS = ["-O3", "-march=x86-64-v3", "-fPIC", "-std=c++20"]
# x86-64-v3: AVX2 and FMA, which glibc's vector maths (libmvec) uses for the LSTM's exp and tanh. -ffast-math
# (for those vector calls and the loops' reductions) is given to the compile step only: given to the link it would
# add the start-up code that flushes denormals for the whole process (gcc 12's crtfastmath.o), changing torch's maths.
# The resize must round each product and each sum as OpenCV's loop does: no fast maths, no fused multiply-adds.
SOURCES = {
    "ln_lstm.cpp": ["-ffast-math", "-fopenmp-simd"],
    "area_resize.cpp": ["-fno-fast-math", "-ffp-contract=off"],
    "frame_stacks.cpp": [],
}
CPU_CAPABILITIES = ("AVX2", "AVX512")   # torch.backends.cpu.get_cpu_capability() on a CPU the build runs on

Op = Callable[..., list[torch.Tensor]]
STACK_BLOCK = 4   # the side of the blocks frame_stacks.cpp writes


def build() -> None:
    """Compile SOURCES against this torch with g++ into LIBRARY (written whole, then moved into place: a running
    learner keeps the library it loaded). The sources compile at once, each in its own g++, and include only the
    headers they use (not ATen/ATen.h, every operator's): `make install` runs this on every fresh clone, CI's
    among them, where the three took 60 s one after another with ATen/ATen.h and take about 20 s so on two cores."""
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libs = [f"-L{p}" for p in cpp_extension.library_paths()]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    with tempfile.TemporaryDirectory() as tmp:
        compiles = {}
        for name, flags in SOURCES.items():
            obj = str(Path(tmp) / name.replace(".cpp", ".o"))
            compiles[obj] = subprocess.Popen(["g++", *COMMON_FLAGS, *flags, abi, *includes, "-c", str(CSRC / name),
                                              "-o", obj])
        failed = [obj for obj, proc in compiles.items() if proc.wait() != 0]
        if failed:
            raise subprocess.CalledProcessError(1, f"g++ -c (for {', '.join(Path(f).name for f in failed)})")
        out = Path(tmp) / LIBRARY.name
        subprocess.run(["g++", "-shared", *compiles, "-o", str(out), *libs, "-ltorch_cpu", "-lc10"], check=True)
        out.replace(LIBRARY)


def unavailable() -> str | None:
    """Why the native unroll cannot run here, or None where it can."""
    if not LIBRARY.exists():
        return f"{LIBRARY} is not built (make install builds it)"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in CPU_CAPABILITIES:
        return f"the CPU's vector capability is {capability}; the build needs AVX2"
    return None


@functools.cache
def load() -> str | None:
    """Loads the library into torch.ops.lbc_native once; why it cannot (unavailable, or it fails to load: a torch
    other than the one it was built against), or None where it has."""
    problem = unavailable()
    if problem is None:
        try:
            torch.ops.load_library(str(LIBRARY))
        except (OSError, RuntimeError) as err:
            problem = f"{LIBRARY} does not load: {err}"
    return problem


def _loaded_op(name: str, instead: str) -> Op | None:
    """The operator torch.ops.lbc_native.`name`, or None where the library cannot run here, logging why and what runs
    `instead` (each caller's cache makes that once)."""
    problem = load()
    if problem is not None:
        log.warning("%s: %s", instead, problem)
        return None
    return getattr(torch.ops.lbc_native, name)


@functools.cache
def ln_lstm_ops() -> tuple[Op, Op] | None:
    """(forward, backward): the unroll's two operators (torch.ops.lbc_native), or None where they cannot run here,
    logged once."""
    forward = _loaded_op("ln_lstm_forward", "the LayerNorm-LSTM unrolls by TorchScript")
    return None if forward is None else (forward, torch.ops.lbc_native.ln_lstm_backward)


@functools.cache
def area_resize_op() -> Op | None:
    """The area resize's operator (lbc.screens), or None where it cannot run here, logged once."""
    return _loaded_op("area_resize", "Atari screens are resized by ALE's own code")


@functools.cache
def frame_ring_op() -> Op | None:
    """The frame ring's push (lbc.frame_ring), or None where it cannot run here, logged once."""
    return _loaded_op("frame_ring_push", "an actor's frame ring is written by torch's passes")


@functools.cache
def blocked_stacks_op() -> Op | None:
    """The blocked frame stacks' operator (lbc.nets), or None where it cannot run here, logged once."""
    return _loaded_op("blocked_stacks", "a CPU learner's frame stacks are written by torch's passes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lbc.native", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="say whether the built library loads here; build nothing")
    args = parser.parse_args(argv)
    if not args.check:
        build()
        print(f"built {LIBRARY}")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    ops = (ln_lstm_ops(), area_resize_op(), blocked_stacks_op(), frame_ring_op())
    ok = all(op is not None for op in ops)
    print(f"native unroll, area resize, frame stacks and frame ring {'load' if ok else 'unavailable'} here")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
