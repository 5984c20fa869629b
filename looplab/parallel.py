"""A process's place among data-parallel ranks, and the few collectives training needs.

:data:`SINGLE` is plain single-process training: every collective is a no-op.
``looplab.train.distributed.data_parallel`` hands out the others under torchrun.
Schedules draw their per-row randomness through :meth:`Parallel.draw_rows` and
:meth:`Parallel.fork`, so a rank trains its rows as single-process training would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.tasks import TaskBatch


@dataclass(frozen=True)
class Parallel:
    """This process's place among the data-parallel ranks.

    Attributes:
        rank: 0..world_size-1; rank 0 writes the run directory.
        world_size: number of processes (1 = plain single-process training).
        device: this rank's device (``cuda:LOCAL_RANK`` on CUDA).
    """

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, batch: TaskBatch) -> TaskBatch:
        """This rank's contiguous block of rows of the global batch [B, L] → [B / world_size, L].

        Rows keep the global batch's padded width, so each row is computed as in
        single-process training.
        """
        if self.world_size == 1:
            return batch
        size = len(batch.lengths) // self.world_size
        rows = slice(self.rank * size, (self.rank + 1) * size)
        return TaskBatch(batch.tokens[rows], batch.labels[rows], batch.valid[rows], batch.lengths[rows])

    def draw_rows(self, draw: Callable[[int], Tensor], rows: int) -> Tensor:
        """``draw(n)`` [n] for the whole global batch (n = rows · world_size), cut to this rank's ``rows``.

        Every rank makes the same draw, so each row gets the value single-process
        training gives it, and the generator ends in the same state.
        """
        if self.world_size == 1:
            return draw(rows)
        return draw(rows * self.world_size)[self.rank * rows : (self.rank + 1) * rows]

    def fork(self, generator: torch.Generator) -> torch.Generator:
        """A stream for draws on this rank's rows alone: ``generator`` itself in one process.

        Every rank advances ``generator`` alike and seeds its fork from the draw at
        its own rank, so shards never share noise while the run stays a function
        of the seed.
        """
        if self.world_size == 1:
            return generator
        seeds = torch.randint(2**62, (self.world_size,), generator=generator)
        return torch.Generator().manual_seed(int(seeds[self.rank]))

    def _sum(self, values: Tensor) -> Tensor:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)  # gloo has no AVG
        return values

    def mean(self, value: Tensor) -> float:
        """The mean over ranks of a scalar tensor (non-finite when any rank's is)."""
        if self.world_size == 1:
            return float(value)
        return float(self._sum(value.detach().reshape(1).double().to(self.device))) / self.world_size

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each scalar metric averaged over ranks, for the log (every rank holds the same keys)."""
        if self.world_size == 1:
            return metrics
        values = self._sum(torch.tensor(list(metrics.values()), dtype=torch.float64, device=self.device))
        return dict(zip(metrics, (values / self.world_size).tolist()))

    def average_gradients(self, modules: dict[str, nn.Module]) -> None:
        """Replace every gradient by its mean over ranks, in one coalesced all-reduce.

        A missing gradient counts as zeros, so every rank reduces the same buffer;
        one flag per parameter travels along, and a parameter no rank touched
        keeps ``grad = None`` (AdamW skips it, as in single-process training).
        """
        if self.world_size == 1:
            return
        params = [p for module in modules.values() for p in module.parameters() if p.requires_grad]
        grads = [torch.zeros_like(p).flatten() if p.grad is None else p.grad.flatten() for p in params]
        touched = torch.tensor([p.grad is not None for p in params], dtype=grads[0].dtype, device=self.device)
        flat = self._sum(torch.cat(grads + [touched]))
        flat[: -len(params)] /= self.world_size
        offset = 0
        for p, used in zip(params, flat[-len(params) :].tolist()):
            if used:
                p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def average_state(self, state: dict) -> dict:
        """``state`` with its float entries (e.g. RL-Halting's reward baseline) averaged over ranks.

        A baseline ``b ← m·b + (1 − m)·mean(R)`` updated on each shard and then
        averaged equals the update on the global batch, so every rank, and the
        checkpoint, holds the single-process value. (Only the first step's
        advantages differ: each rank starts its baseline at its shard's mean reward.)
        """
        keys = [key for key, value in state.items() if isinstance(value, float)]
        if self.world_size == 1 or not keys:
            return state
        averaged = self.mean_metrics({key: state[key] for key in keys})
        return {**state, **averaged}

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def on_main(self, action: Callable[[], None]) -> None:
        """Run ``action`` on rank 0 only; its LooplabError is raised on every rank.

        The other ranks wait here until rank 0 is done, so this is a barrier too.
        """
        if self.world_size == 1:
            action()
            return
        error = None
        if self.is_main:
            try:
                action()
            except LooplabError as err:
                error = err
        message = [None if error is None else str(error)]
        dist.broadcast_object_list(message, src=0)
        if error is not None:
            raise error
        if message[0] is not None:
            raise LooplabError(message[0])


SINGLE = Parallel()
