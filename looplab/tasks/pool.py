"""Pre-drawn training pools, for instances too slow to draw at every step.

A 9×9 Sudoku with 55 blanks takes ~80 ms to draw and check, a 30 × 30 maze
~140 ms (one core): a batch of 768 would cost a minute. ``looplab pool`` draws
them once (in parallel, each chunk of rows from its own generator derived from
the seed, so the pool is the same whatever the number of workers) into a
safetensors file, and ``task.pool`` makes training draw its instances of the
pool's sizes from it, uniformly with replacement, by the step's generator.
Sizes the pool lacks are drawn live. Evaluation never reads the pool: its
instances are drawn fresh from the run's seed, so no test board is a training
board by construction of the pool.
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open, save_file
from torch import Tensor

from looplab.errors import LooplabError, one_line
from looplab.io import atomic_write
from looplab.seeding import derive_generator
from looplab.tasks.base import Task, make_task

POOL_FORMAT = "looplab-pool-1"
#: rows drawn from one derived generator; fixed, so a pool does not depend on the number of workers
CHUNK = 64


@dataclass(frozen=True)
class PoolHeader:
    """What a pool file says about itself."""

    task: str
    alphabet: int
    seed: int
    sizes: dict[int, int]  # size → rows


def pool_header(path: str | Path) -> PoolHeader:
    """The header of the pool file ``path``; one-line errors for a missing or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise LooplabError(f"task.pool {path} is not a file; draw one with: looplab pool TASK --sizes ... --out {path}")
    try:
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or {}
    except Exception as err:  # safetensors raises several types for damaged files
        raise LooplabError(f"task.pool {path} is not a safetensors file ({err})") from None
    if meta.get("format") != POOL_FORMAT:
        raise LooplabError(f"task.pool {path} is not a looplab pool (format {meta.get('format')!r})")
    try:
        sizes = {int(n): int(rows) for n, rows in json.loads(meta["sizes"]).items()}
        return PoolHeader(meta["task"], int(meta["alphabet"]), int(meta["seed"]), sizes)
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        detail = f"no {err}" if isinstance(err, KeyError) else one_line(err)
        raise LooplabError(f"task.pool {path} has a damaged header ({detail}); draw it again") from None


def check_pool_task(path: str | Path, header: PoolHeader, task_name: str, alphabet: int) -> None:
    """A one-line error when the pool at ``path`` holds another task (or alphabet) than the run trains."""
    if (header.task, header.alphabet) != (task_name, alphabet):
        raise LooplabError(
            f"task.pool {path} holds {header.task} (alphabet {header.alphabet}), not {task_name} (alphabet {alphabet})"
        )


def _draw_chunk(task_name: str, alphabet: int, n: int, rows: int, seed: int, chunk: int) -> tuple[Tensor, Tensor]:
    torch.set_num_threads(1)
    task = make_task(task_name, alphabet)
    return task._sample_rows(n, rows, derive_generator(seed, "pool", n, chunk))


def draw_pool(
    task_name: str, alphabet: int, sizes: list[int], count: int, seed: int, workers: int = 1
) -> dict[int, tuple[Tensor, Tensor]]:
    """``count`` instances of every size in ``sizes`` (without the start token): size → (tokens, labels)."""
    make_task(task_name, alphabet)  # an unknown task or alphabet fails here, in one line
    jobs = [
        (task_name, alphabet, n, min(CHUNK, count - start), seed, start // CHUNK)
        for n in sizes
        for start in range(0, count, CHUNK)
    ]
    if workers > 1:
        with ProcessPoolExecutor(workers) as executor:
            parts = list(executor.map(_draw_chunk, *zip(*jobs)))
    else:
        parts = [_draw_chunk(*job) for job in jobs]
    drawn: dict[int, tuple[list[Tensor], list[Tensor]]] = {}
    for job, (tokens, labels) in zip(jobs, parts):
        drawn.setdefault(job[2], ([], []))
        drawn[job[2]][0].append(tokens)
        drawn[job[2]][1].append(labels)
    return {n: (torch.cat(tokens), torch.cat(labels)) for n, (tokens, labels) in drawn.items()}


def save_pool(path: str | Path, task_name: str, alphabet: int, seed: int, pool: dict[int, tuple[Tensor, Tensor]]):
    """Write ``pool`` (from :func:`draw_pool`) to ``path`` as safetensors, atomically."""
    tensors = {}
    for n, (tokens, labels) in pool.items():
        tensors[f"tokens.{n}"], tensors[f"labels.{n}"] = tokens.contiguous(), labels.contiguous()
    meta = {
        "format": POOL_FORMAT,
        "task": task_name,
        "alphabet": str(alphabet),
        "seed": str(seed),
        "sizes": json.dumps({str(n): len(tokens) for n, (tokens, _) in pool.items()}),
    }
    atomic_write(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def _pool_rows(path, tensors: dict[str, Tensor], n: int, rows: int) -> tuple[Tensor, Tensor]:
    """The (tokens, labels) [rows, L] of size ``n`` in pool file ``path``, checked against its header."""
    pair = tensors.get(f"tokens.{n}"), tensors.get(f"labels.{n}")
    if any(t is None for t in pair):
        raise LooplabError(f"task.pool {path} lacks the tensors of size {n} its header lists; draw it again")
    tokens, labels = pair
    if tokens.dtype != torch.int64 or labels.dtype != torch.int64 or tokens.dim() != 2:
        raise LooplabError(f"task.pool {path}: size {n} is not stored as rows of int64 token ids; draw it again")
    if tokens.shape != labels.shape or len(tokens) != rows:
        raise LooplabError(
            f"task.pool {path}: size {n} holds tokens {tuple(tokens.shape)} and labels {tuple(labels.shape)}, "
            f"its header {rows} rows; draw it again"
        )
    return tokens, labels


class PooledTask(Task):
    """``task`` whose instances of the pool's sizes come from the pool (training only)."""

    def __init__(self, task: Task, path: str | Path):
        header = pool_header(path)
        check_pool_task(path, header, task.name, task.alphabet)
        tensors = load_file(str(path))
        self.rows = {n: _pool_rows(path, tensors, n, rows) for n, rows in header.sizes.items()}
        self.task = task
        self.name = task.name
        super().__init__(task.alphabet)

    def symbols(self) -> list[str]:
        return self.task.symbols()

    def body_len(self, n: int) -> int:
        return self.task.body_len(n)

    def steps(self, n: Tensor) -> Tensor:
        return self.task.steps(n)

    def _sample_rows(self, n: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        if n not in self.rows:
            return self.task._sample_rows(n, count, generator)
        tokens, labels = self.rows[n]
        index = torch.randint(0, len(tokens), (count,), generator=generator)
        return tokens[index], labels[index]
