"""Where tensors live: the device a service's setting names, host-to-device copies of batches, the learner's one
read of its figures back to the host, how a thread waits for a GPU, and the precision the learner and the actors
compute in."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Literal

import numpy as np
import torch

from lbc.config import GpuWait, Precision

_gpu_wait: GpuWait = "sleep"


def set_gpu_wait(mode: GpuWait) -> None:
    """How this process's threads wait for a GPU's results (learner.gpu_wait, actor.gpu_wait; a service sets it
    once at start, as torch.set_num_threads): `sleep` or `spin`, see wait_for_gpu."""
    global _gpu_wait
    if mode not in ("sleep", "spin"):
        raise ValueError(f"gpu_wait is sleep or spin, not {mode!r}")
    _gpu_wait = mode


def wait_for_gpu(stream: torch.cuda.Stream) -> None:
    """Return once what was queued on `stream` so far has run.

    CUDA's own waits (a copy to the host, Stream.synchronize) spin a core for as long as they wait whenever
    the process holds fewer CUDA contexts than the machine has cores, which is every lbc service: a learner
    step that waits about 100 ms for its GPU, or an actor whose inference queues behind the learner's kernels,
    kept a core busy doing nothing that the other services' processes could have used. With `sleep` the
    thread sleeps on an event made with cudaEventBlockingSync instead (woken some microseconds later than a
    spinning one); `spin` keeps CUDA's way, for comparison."""
    if _gpu_wait == "spin":
        stream.synchronize()
        return
    done = torch.cuda.Event(blocking=True)
    done.record(stream)
    done.synchronize()


MPS_SHARE_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def limit_mps_share(percent: int, environ: MutableMapping[str, str]) -> bool:
    """Under NVIDIA's MPS, let this process's kernels occupy at most `percent` of the GPU's threads (learner.
    mps_share): the rest stay free for the other processes' kernels, which would otherwise queue behind a
    learner's that fill every SM. CUDA reads the setting once, when the process first calls it, so this runs
    before that; without MPS CUDA ignores it. 100 leaves `environ` as it is. True where it set the share."""
    if percent >= 100:
        return False
    if torch.cuda.is_initialized():
        raise RuntimeError("limit_mps_share must run before the process's first CUDA call")
    environ[MPS_SHARE_VAR] = str(percent)
    return True


def pick_device(setting: str, what: str) -> torch.device:
    """`setting` is auto, cpu or cuda (`what` names the setting in the error): auto takes the GPU when
    one is visible; cuda without one is refused with a clear message."""
    if setting == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{what}=cuda but no CUDA device is visible")
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(setting)


def cpu_computes_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX tiles), as oneDNN's bf16
    convolutions and matrix products need to be faster than float32 rather than emulated."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def compute_precision(setting: Precision, device: torch.device,
                      native_bf16: bool | None = None) -> Literal["fp32", "bf16"]:
    """The precision a network computes in on `device` (learner.precision, actor.precision): `fp32` or
    `bf16` (its matrix products and convolutions). `auto` is bf16 where that was measured faster: a CPU that
    computes in bfloat16 natively (`native_bf16`, default cpu_computes_bf16()), where the `impala` learner
    made 1.42x and `cpu`'s 1.19x its fp32 samples/s on one core (decision 63) and the actors' inference
    1.25-1.55x (decision 64; docs/speed.md). It is fp32 on a GPU, where the learner's bf16 autocast measured
    0.85-0.90x on an H100 and an H200 (decision 40), and on CPUs without it (0.18x, emulated)."""
    if setting != "auto":
        return setting
    if device.type != "cpu":
        return "fp32"
    return "bf16" if (cpu_computes_bf16() if native_bf16 is None else native_bf16) else "fp32"


def pinned(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same arrays copied into page-locked host memory (numpy views of pinned tensors, which keep the
    memory alive). The learner's batch fetcher calls this on its own thread when the learner trains on a
    GPU, so that `to_device` on the training thread finds the batch pinned: its host-side copy into pinned
    memory (18% of an H100 learner step, docs/speed.md) leaves the step, and the copy to the GPU that
    remains runs without blocking the host. Needs a visible GPU. Torch does not track these views' copies,
    so the batch must outlive its copy: the learner's step reads its figures on the host (`to_host`) before it
    drops the batch, and that waits for the copy."""
    out = {}
    for name, arr in arrays.items():
        host = torch.empty(arr.shape, dtype=torch.from_numpy(arr[:0]).dtype, pin_memory=True).numpy()
        np.copyto(host, arr)
        out[name] = host
    return out


def to_device(array: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host array on `device`: as it is on the CPU (no copy for a contiguous numpy array), through
    pinned memory and a copy that does not block the host on a GPU."""
    t = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cpu":
        return t
    if not t.is_pinned():   # `pinned` did it on the fetcher's thread, or this copy does it here
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def to_host(*tensors: torch.Tensor) -> list[np.ndarray]:
    """The tensors as float32 arrays of their shapes on the host, by one copy: a GPU learner's step waits for
    its device once, where a read per figure (loss, gradient norms, terms, priorities) waited at each and left
    the GPU idle while the host went on to launch what came next. The wait is wait_for_gpu's."""
    flat = torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])
    if flat.is_cuda:
        wait_for_gpu(torch.cuda.current_stream(flat.device))
    flat = flat.cpu().numpy()
    ends = np.cumsum([t.numel() for t in tensors])
    return [flat[end - t.numel():end].reshape(t.shape) for t, end in zip(tensors, ends, strict=True)]
