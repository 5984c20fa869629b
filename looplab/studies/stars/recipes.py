"""STARS on a pretrained model: fine-tune a retrofitted loop at a fixed depth or with STARS, measure it by loops.

The retrofit (:class:`looplab.lm.retrofit.RetrofittedLoop`, W_I = ``mix`` so the
input is injected at every loop) is fine-tuned on chain-arithmetic problems
(:mod:`looplab.tasks.reasoning`, the answer tokens supervised) and KJV passages
(every next token), tokenised by the model's own tokenizer:

    fixed   every batch at ``depth`` loops, plain cross-entropy           (the paper's SFT)
    stars   each batch at t ~ clip(round(exp(N(μ, σ))), lo, hi) loops,     (the paper's STARS)
            loss (1 − λ)·CE + λ·‖J v‖², J the one-loop Jacobian at h_t, v a random unit direction

Both see the same batches in the same order and take the same number of steps.
:func:`retrofit_by_loops` then reads, after every loop t = 1..T of one unroll,
exact match on problems of the training sizes and longer ones (teacher-forced
argmax at every answer token = greedy decoding), the KJV validation loss, ‖h_t‖
per token and ρ(∂Φ/∂h at h_t) by power iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from looplab.config.schema import ScheduleConfig
from looplab.errors import LooplabError, choice_error
from looplab.lm.retrofit import RetrofittedLoop
from looplab.model.protocol import readouts_by_loops
from looplab.regularisers import JacobianPenalty, Regulariser
from looplab.schedules import make_schedule
from looplab.seeding import derive_generator
from looplab.stability.spectral import warm_spectral_radii
from looplab.tasks import IGNORE
from looplab.tasks.reasoning import draw_problems
from looplab.text.finetune import fine_tune, last_loop_objective, next_token_batch


@dataclass(frozen=True)
class RecipeKind:
    """What a named recipe trains with, from a :class:`RetrofitRecipe`'s numbers: the schedule that draws
    each step's depth and the regularisers added to the loss."""

    schedule: Callable[[RetrofitRecipe], ScheduleConfig]
    regularisers: Callable[[RetrofitRecipe], list[Regulariser]]


#: the recipes: ``fixed`` trains at ``depth``; STARS at a clipped log-normal depth with its JSRR term,
#: λ·‖J v‖² from one random unit direction (looplab's ``jsrr``, estimator jvp)
RECIPES: dict[str, RecipeKind] = {
    "fixed": RecipeKind(lambda r: ScheduleConfig(name="fixed", depth=r.depth), lambda r: []),
    "stars": RecipeKind(
        lambda r: ScheduleConfig(name="lognormal", mu=r.mu, sigma=r.sigma, lo=r.lo, hi=r.hi, depth=r.depth),
        lambda r: [JacobianPenalty(weight=r.jsrr_weight, estimator="jvp", power_iters=0)],
    ),
}


@dataclass(frozen=True)
class RetrofitRecipe:
    """How one fine-tune picks its depth and loss (the paper's LM settings by default)."""

    name: str = "fixed"
    depth: int = 4
    mu: float = 1.7
    sigma: float = 0.4
    lo: int = 1
    hi: int = 16
    jsrr_weight: float = 0.1

    def __post_init__(self):
        if self.name not in RECIPES:
            raise choice_error("recipe", self.name, RECIPES)

    def schedule(self):
        """The schedule that draws the depth of each step (:data:`RECIPES`)."""
        return make_schedule(RECIPES[self.name].schedule(self))

    def regularisers(self) -> list[Regulariser]:
        """The regularisers added to the loss (:data:`RECIPES`)."""
        return RECIPES[self.name].regularisers(self)


def encode_problems(tokenizer, problems: list[tuple[str, str]]) -> dict[str, Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` [B, T] of (question, answer) pairs.

    Question and answer are tokenised apart and joined, so the answer starts on a token
    boundary; ``labels[i]`` is the token at i + 1 where that token belongs to the answer,
    IGNORE elsewhere (next-token alignment, as the logits at i predict token i + 1).
    """
    rows = []
    for question, answer in problems:
        q = tokenizer(question, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"]
        rows.append((q + a, len(q)))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (ids, question) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
        labels[i, question - 1 : len(ids) - 1] = torch.tensor(ids[question:])
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def problem_batch(tokenizer, lengths: list[int], per_length: int, generator: torch.Generator) -> dict[str, Tensor]:
    """``per_length`` problems of each size in ``lengths``, encoded as one batch."""
    problems = [p for n in lengths for p in draw_problems(n, per_length, generator)]
    return encode_problems(tokenizer, problems)


def text_batch(tokenizer, split: str, count: int, tokens: int, generator: torch.Generator) -> dict[str, Tensor]:
    """``count`` random KJV passages of ``split``, tokenised and cut to ``tokens``, every next token supervised."""
    from looplab.tasks.corpus import load_corpus

    text = load_corpus().text(split)
    chars = 8 * tokens  # comfortably more characters than tokens
    starts = torch.randint(0, len(text) - chars, (count,), generator=generator).tolist()
    batch = tokenizer([text[s : s + chars] for s in starts], truncation=True, max_length=tokens, padding=True)
    return next_token_batch(torch.tensor(batch["input_ids"]), torch.tensor(batch["attention_mask"]))


def join_batches(first: dict[str, Tensor], second: dict[str, Tensor], pad: int) -> dict[str, Tensor]:
    """The rows of both batches, right-padded to the wider one."""
    width = max(first["input_ids"].shape[1], second["input_ids"].shape[1])
    fill = {"input_ids": pad, "attention_mask": 0, "labels": IGNORE}
    return {
        key: torch.cat([F.pad(part[key], (0, width - part[key].shape[1]), value=fill[key]) for part in (first, second)])
        for key in fill
    }


def fine_tune_recipe(
    loop: RetrofittedLoop,
    tokenizer,
    recipe: RetrofitRecipe,
    steps: int,
    lengths: list[int],
    per_length: int,
    lr: float,
    seed: int,
    text_rows: int = 0,
    text_tokens: int = 48,
    probe: Callable[[int], None] | None = None,
    probe_every: int = 0,
) -> pd.DataFrame:
    """Fine-tune ``loop`` in place (:func:`looplab.text.finetune.fine_tune`); one row per step: step, loops,
    loss (CE), jsrr (NaN for ``fixed``).

    Each batch holds ``per_length`` problems of every size in ``lengths`` and ``text_rows``
    KJV training passages of ``text_tokens`` tokens (text keeps the retrofit a language
    model while it learns the problems); the loss is the mean over rows of each row's
    mean cross-entropy. AdamW with a cosine decay to 10 % of ``lr``; gradients clipped to
    norm 1. Data, depths and directions come from generators derived from ``seed``, so
    both recipes see the same batches in the same order.

    ``probe(step)`` is called, with the model in eval mode, before the first step and
    after every ``probe_every``-th (a learning curve); it draws nothing from the
    fine-tune's generators, so probing does not change the run.
    """
    if steps < 1 or per_length < 1 or not lengths:
        raise LooplabError("fine-tuning needs steps >= 1, per_length >= 1 and at least one problem size")
    schedule = recipe.schedule()
    data, depths, directions = (derive_generator(seed, "retrofit", part) for part in ("data", "depth", "jsrr"))

    def batch_at(_step: int) -> dict[str, Tensor]:
        batch = problem_batch(tokenizer, lengths, per_length, data)
        if text_rows:
            text = text_batch(tokenizer, "train", text_rows, text_tokens, data)
            batch = join_batches(batch, text, tokenizer.pad_token_id or 0)
        return batch

    log = fine_tune(
        loop,
        batch_at,
        steps,
        lr,
        last_loop_objective(lambda _step: int(schedule.train_depths(torch.tensor([1]), depths)[0])),
        regularisers=[(regulariser, directions) for regulariser in recipe.regularisers()],
        lr_factor=lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
        probe=probe,
        probe_every=probe_every,
    )
    return log.reindex(columns=["step", "loops", "loss", JacobianPenalty.name])


@torch.no_grad()
def exact_match_by_loops(loop: RetrofittedLoop, batch: dict[str, Tensor], max_loops: int) -> tuple[Tensor, Tensor]:
    """correct [B, T] (every answer token's argmax right after t loops) and ‖h_t‖ per token [B, T]."""
    valid = batch["attention_mask"].bool()
    answer = batch["labels"] != IGNORE
    tokens = valid.sum(1).clamp_min(1).double().sqrt()
    correct, norms = [], []
    for h, logits in readouts_by_loops(loop, batch["input_ids"], batch["attention_mask"], max_loops, at=answer):
        logits = logits.float()  # [N, V], the answer positions only
        right = torch.ones_like(answer)
        right[answer] = (logits.argmax(-1) == batch["labels"][answer]) & torch.isfinite(logits).all(-1)
        correct.append(right.all(1))
        norms.append((h * valid[..., None]).flatten(1).double().norm(dim=1) / tokens)
    return torch.stack(correct, 1), torch.stack(norms, 1)


@torch.no_grad()
def kjv_loss_by_loops(loop: RetrofittedLoop, batch: dict[str, Tensor], max_loops: int) -> np.ndarray:
    """[T] mean next-token loss on a :func:`text_batch` after t = 1..T loops."""
    scored = batch["labels"] != IGNORE
    unroll = readouts_by_loops(loop, batch["input_ids"], batch["attention_mask"], max_loops, at=scored)
    return np.array([float(F.cross_entropy(logits.float(), batch["labels"][scored])) for _, logits in unroll])


def retrofit_by_loops(
    loop: RetrofittedLoop,
    tokenizer,
    kjv_batch: dict[str, Tensor],
    lengths: list[int],
    train_max: int,
    samples: int,
    max_loops: int,
    seed: int,
    spectral_iters: int = 3,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-loop frame, per-size grid) with the columns of :mod:`looplab.text.reasoning`.

    ``samples`` problems per size from ``derive_generator(seed, "retrofit-eval", n)``.
    """
    loop.eval()
    grid, pooled = [], {"id": [], "ood": []}
    norms = []
    for n in lengths:
        batch = problem_batch(tokenizer, [n], samples, derive_generator(seed, "retrofit-eval", n))
        correct, norm = exact_match_by_loops(loop, batch, max_loops)
        pooled["id" if n <= train_max else "ood"].append(correct.double())
        norms.append(norm)
        for t, acc in enumerate(correct.double().mean(0).tolist(), start=1):
            grid.append({"length": n, "loops": t, "split": "id" if n <= train_max else "ood", "accuracy": acc})
    probe = problem_batch(tokenizer, [train_max], 4, derive_generator(seed, "retrofit-spectral"))
    radii = warm_spectral_radii(
        loop,
        probe["input_ids"],
        probe["attention_mask"],
        max_loops,
        spectral_iters,
        derive_generator(seed, "retrofit-power"),
    )
    frame = pd.DataFrame(
        {
            "loops": np.arange(1, max_loops + 1),
            "loss": kjv_loss_by_loops(loop, kjv_batch, max_loops),
            **{
                f"reasoning_{split}": (torch.cat(parts).mean(0).numpy() if parts else np.full(max_loops, np.nan))
                for split, parts in pooled.items()
            },
            "state_norm": torch.cat(norms).mean(0).numpy(),
            "spectral_radius": radii.mean(1).numpy(),
        }
    )
    return frame, pd.DataFrame(grid)
