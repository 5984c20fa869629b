"""Data-parallel training under torchrun: one process per device, one global batch.

``torchrun --nproc_per_node=N -m looplab train ...`` sets WORLD_SIZE, RANK and
LOCAL_RANK; :func:`data_parallel` reads them, joins the process group (NCCL on
CUDA, gloo on CPU) and always leaves it again, error or not. Without torchrun
(or with one process) it hands back :data:`SINGLE`, whose collectives do nothing.

Every rank draws the same global batch of step s from (seed, "train", s) and
trains on its own contiguous block of rows (:meth:`Parallel.shard`). Every
training loss is a mean over rows, so with equal blocks the mean of the
ranks' gradients is the gradient of the global batch: clipping and AdamW see
what single-process training would see.

Gradients are averaged by hand, in one all-reduce over a flat buffer, rather
than by DistributedDataParallel: DDP readies its reducer in its own
``forward``, but the schedules call the model's methods (``start``, ``step``,
``forward_at_depths``, ``readout``), never the model itself, and a learned
schedule's halting head is a second module beside the model.

Rank 0 alone writes the run directory; :meth:`Parallel.on_main` shares its
errors so that no rank waits at a collective for a rank that has stopped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from looplab.config import Config
from looplab.errors import LooplabError
from looplab.parallel import Parallel


def check_world_size(batch_size: int, world_size: int) -> None:
    """Raise a one-line :class:`LooplabError` unless ``batch_size`` splits evenly over ``world_size`` ranks."""
    if batch_size % world_size:
        raise LooplabError(
            f"train.batch_size {batch_size} does not split evenly over {world_size} processes "
            f"(world size); use a multiple of {world_size}"
        )


@contextmanager
def data_parallel(config: Config) -> Iterator[Parallel]:
    """This process's :class:`Parallel`, inside the torchrun process group when there is one.

    Raises:
        LooplabError: ``train.batch_size`` does not split evenly over the ranks
            (checked before joining the group, so each rank stops at once).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        yield Parallel(device=config.run.device)
        return
    check_world_size(config.train.batch_size, world_size)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cuda = config.run.device.startswith("cuda")
    device = f"cuda:{local_rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=torch.device(device) if cuda else None)
    try:
        yield Parallel(rank, world_size, device)
    finally:
        dist.destroy_process_group()
