"""GRPO on several GPUs: the rollouts are split, the update is not.

Under ``torchrun --nproc_per_node=N`` (``make grpo GPUS=0,1``) every rank holds the policy and
its own environment (a share of the simulator workers, or the model pair on its GPU) and runs
the groups ``g`` with ``g % N == rank`` of each step. Start states, the rollout numbers, the
policy's chunk noise and the world models' sampling noise are pure functions of (seed, step,
group, member, chunk), so the ranks together collect the rollouts one process would (up to
the rounding of batched GPU arithmetic). Rank 0 gathers them, computes the advantages and
makes the update, then sends its weights to the others (the learner / actor split; the update
is a second or less of a step, the rollouts the rest). Evaluations, checkpoints and logs are
rank 0's. One process (no torchrun) is world size 1 and every function here is a no-op.
"""

from __future__ import annotations

import datetime
import os

import torch


def world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def init(device: torch.device) -> None:
    """Join the process group (NCCL on GPUs, gloo on CPUs). The timeout covers rank 0's final
    10 x 50 evaluation, while the other ranks wait at the next collective."""
    if world()[1] == 1:
        return
    import torch.distributed as dist

    from wmrl.device import before_process_group

    before_process_group()  # or the group outlives close() and can abort the process at exit
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(hours=3))


def close() -> None:
    """Leave the process group together: every rank waits for the others before it tears its
    connections down (see also ``wmrl.device.before_process_group``)."""
    if world()[1] > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def share(items: list) -> list:
    """This rank's share of a step's group starts."""
    rank, n = world()
    return items[rank::n]


def gather(obj) -> list | None:
    """Every rank's ``obj`` on rank 0 (in rank order); None on the others."""
    rank, n = world()
    if n == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * n if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def from_rank0(value):
    """Rank 0's value of a small Python object, on every rank (e.g. "stop after this step")."""
    if world()[1] == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@torch.no_grad()
def send_weights(model: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers to every rank (after rank 0's update)."""
    if world()[1] == 1:
        return
    import torch.distributed as dist

    for t in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(t.data, src=0)
