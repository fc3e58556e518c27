"""Data parallelism across learner replicas (`learner.replicas`): every replica trains the same model on
its own batches, and after each backward pass the group averages the gradients, so each optimiser step
is the step one learner would take on the union of the batches. torch.distributed with gloo on CPUs and
NCCL on GPUs (or gloo, where replicas share one GPU, which NCCL refuses: learner.group_backend); replica 0's
parameters and optimiser state are the group's at the start.

Only tensors cross between replicas (no pickled objects)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


class GroupBroken(RuntimeError):
    """A collective operation failed: a replica stopped or cannot be reached."""


class ReplicaGroup:
    """This process's place in a group of `world` learner replicas, rendezvous at tcp://address:port."""

    def __init__(self, rank: int, world: int, address: str, port: int, device: torch.device,
                 timeout_s: float = 120.0, backend: str = "auto") -> None:
        if not 0 <= rank < world:
            raise ValueError(f"replica rank {rank} outside [0, {world})")
        if backend == "nccl" and device.type != "cuda":
            raise ValueError(f"learner.group_backend=nccl needs the learner on a GPU, not {device}")
        self.rank, self.world, self.device = rank, world, device
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))

    @property
    def leads(self) -> bool:
        """Replica 0 publishes parameters and writes checkpoints."""
        return self.rank == 0

    def average_gradients(self, params: list[torch.nn.Parameter], finite: torch.Tensor) -> torch.Tensor:
        """Replace every parameter's gradient by the group's mean (a missing gradient counts as zeros);
        `finite`: whether this replica's loss is finite (a boolean tensor). Returns, as a boolean tensor on
        the device (nothing is read on the host here), whether every replica's was (else all of them skip the
        step). A gradient that is not finite needs no flag: the mean every replica gets is not finite either."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.detach().flatten().to(torch.float32) for g in grads]
                         + [(~finite).to(torch.float32).reshape(1).to(self.device)])
        try:
            dist.all_reduce(flat)
        except RuntimeError as exc:   # gloo and NCCL report a lost peer as a plain RuntimeError
            raise GroupBroken(str(exc).splitlines()[0]) from exc
        flat[:-1] /= self.world
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset: offset + n].view_as(p).to(p.dtype).clone()
            offset += n
        return flat[-1] == 0

    def share_state(self, module: torch.nn.Module, optimiser: torch.optim.Optimizer) -> None:
        """Replica 0's parameters, buffers and optimiser state, in place on every replica. Replica 0 may hold
        optimiser state (it resumed from a checkpoint) where the others have none yet: they create theirs
        with one step on zero gradients (its effect is overwritten here), then take replica 0's."""
        params = [p for group in optimiser.param_groups for p in group["params"]]
        has_state = torch.tensor([float(bool(optimiser.state.get(p))) for p in params], device=self.device)
        dist.broadcast(has_state, src=0)
        if self.rank != 0 and bool(has_state.any()) and not optimiser.state:
            for p in params:
                p.grad = torch.zeros_like(p)
            optimiser.step()
            optimiser.zero_grad(set_to_none=True)
        for p, present in zip(params, has_state.tolist(), strict=True):
            if not present:
                optimiser.state.pop(p, None)
                continue
            state = optimiser.state[p]
            for key in sorted(state):
                if isinstance(state[key], torch.Tensor):
                    dist.broadcast(state[key], src=0)
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)

    def close(self) -> None:
        dist.destroy_process_group()
