"""STARS on a pretrained model: fine-tune a retrofitted loop at a fixed depth or with STARS, measure it by loops.

The retrofit (:class:`looplab.lm.retrofit.RetrofittedLoop`, W_I = ``mix`` so the
input is injected at every loop) is fine-tuned on chain-arithmetic text
(:mod:`looplab.tasks.reasoning`), tokenised by the model's own tokenizer, the
answer tokens supervised:

    fixed   every batch at ``depth`` loops, plain cross-entropy           (the paper's SFT)
    stars   each batch at t ~ clip(round(exp(N(μ, σ))), lo, hi) loops,     (the paper's STARS)
            loss (1 − λ)·CE + λ·‖J v‖², J the one-loop Jacobian at h_t, v a random unit direction

Both see the same problems in the same order and take the same number of steps.
:func:`retrofit_by_loops` then reads, after every loop t = 1..T of one unroll,
exact match on problems of the training sizes and longer ones (teacher-forced
argmax at every answer token = greedy decoding), the KJV validation loss, ‖h_t‖
per token and ρ(∂Φ/∂h at h_t) by power iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from looplab.config.schema import ScheduleConfig
from looplab.errors import LooplabError, choice_error
from looplab.lm.retrofit import RetrofittedLoop
from looplab.schedules import make_schedule
from looplab.seeding import derive_generator
from looplab.stability.jacobian import jacobian_vector, power_iteration, random_direction
from looplab.tasks import IGNORE
from looplab.tasks.reasoning import draw_problems

RECIPES = ("fixed", "stars")


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
        if self.name == "fixed":
            return make_schedule(ScheduleConfig(name="fixed", depth=self.depth))
        return make_schedule(
            ScheduleConfig(name="lognormal", mu=self.mu, sigma=self.sigma, lo=self.lo, hi=self.hi, depth=self.depth)
        )


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


def _loss(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)


def jsrr_penalty(loop: RetrofittedLoop, h: Tensor, e: Tensor, rope, mask: Tensor, valid: Tensor, generator) -> Tensor:
    """Mean over rows of ‖J v‖², J = ∂ step(·, e)/∂h at h, v a random unit direction per row."""
    v = random_direction(valid.bool(), h.shape[-1], generator, dtype=h.dtype)
    jv = jacobian_vector(lambda x: loop.step(x, e, rope, mask), h, v) * valid[..., None]
    return jv.flatten(1).pow(2).sum(1).mean()


def fine_tune_recipe(
    loop: RetrofittedLoop,
    tokenizer,
    recipe: RetrofitRecipe,
    steps: int,
    lengths: list[int],
    per_length: int,
    lr: float,
    seed: int,
) -> pd.DataFrame:
    """Fine-tune ``loop`` in place; one row per step: step, loops, loss (CE), jsrr (NaN for ``fixed``).

    AdamW with a cosine decay to 10 % of ``lr``; gradients clipped to norm 1. The problems
    come from ``derive_generator(seed, "retrofit-data")`` and the depths and directions from
    their own generators, so both recipes see the same problems in the same order.
    """
    if steps < 1 or per_length < 1 or not lengths:
        raise LooplabError("fine-tuning needs steps >= 1, per_length >= 1 and at least one problem size")
    params = [p for p in loop.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    decay = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    schedule = recipe.schedule()
    data, depths, directions = (derive_generator(seed, "retrofit", part) for part in ("data", "depth", "jsrr"))
    rows = []
    loop.train()
    try:
        for step in range(1, steps + 1):
            batch = problem_batch(tokenizer, lengths, per_length, data)
            loops = int(schedule.train_depths(torch.tensor([1]), depths)[0])
            e, rope, mask, valid = loop.encode(batch["input_ids"], batch["attention_mask"])
            h = e
            for _ in range(loops):
                h = loop.step(h, e, rope, mask)
            answer = batch["labels"] != IGNORE
            ce = F.cross_entropy(loop.readout(h, rope, mask, at=answer).float(), batch["labels"][answer])
            loss, penalty = ce, float("nan")
            if recipe.name == "stars":
                jsrr = jsrr_penalty(loop, h, e, rope, mask, valid, directions)
                loss, penalty = (1 - recipe.jsrr_weight) * ce + recipe.jsrr_weight * jsrr, float(jsrr.detach())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            decay.step()
            rows.append({"step": step, "loops": loops, "loss": float(ce.detach()), "jsrr": penalty})
    finally:
        loop.eval()
    return pd.DataFrame(rows)


@torch.no_grad()
def exact_match_by_loops(loop: RetrofittedLoop, batch: dict[str, Tensor], max_loops: int) -> tuple[Tensor, Tensor]:
    """correct [B, T] (every answer token's argmax right after t loops) and ‖h_t‖ per token [B, T]."""
    e, rope, mask, valid = loop.encode(batch["input_ids"], batch["attention_mask"])
    answer = batch["labels"] != IGNORE
    tokens = valid.sum(1).clamp_min(1).double().sqrt()
    h, correct, norms = e, [], []
    for _ in range(max_loops):
        h = loop.step(h, e, rope, mask)
        logits = loop.readout(h, rope, mask, at=answer).float()  # [N, V], the answer positions only
        right = torch.ones_like(answer)
        right[answer] = (logits.argmax(-1) == batch["labels"][answer]) & torch.isfinite(logits).all(-1)
        correct.append(right.all(1))
        norms.append((h * valid[..., None]).flatten(1).double().norm(dim=1) / tokens)
    return torch.stack(correct, 1), torch.stack(norms, 1)


@torch.no_grad()
def kjv_loss_by_loops(loop: RetrofittedLoop, batch: dict[str, Tensor], max_loops: int) -> np.ndarray:
    """[T] next-token loss on tokenised KJV validation text after t = 1..T loops."""
    e, rope, mask, _ = loop.encode(batch["input_ids"], batch["attention_mask"])
    targets = batch["input_ids"][:, 1:].masked_fill(~batch["attention_mask"][:, 1:].bool(), IGNORE)
    h, losses = e, []
    for _ in range(max_loops):
        h = loop.step(h, e, rope, mask)
        losses.append(float(_loss(loop.readout(h, rope, mask)[:, :-1], targets)))
    return np.array(losses)


def spectral_by_loops(loop: RetrofittedLoop, batch: dict[str, Tensor], max_loops: int, iters: int, seed: int):
    """[T] mean ρ(∂ step/∂h at h_t) over the batch's rows: power iteration warm-started from the
    previous loop's direction, ``iters`` per loop (4 × ``iters`` at the first)."""
    generator = derive_generator(seed, "retrofit-power")
    with torch.no_grad():
        e, rope, mask, valid = loop.encode(batch["input_ids"], batch["attention_mask"])
        valid = valid.bool()
        v = random_direction(valid, e.shape[-1], generator, dtype=e.dtype)
        h, radii = e, []

        def phi(x: Tensor) -> Tensor:  # one loop, the input held fixed
            return loop.step(x, e, rope, mask)

        for t in range(max_loops):
            h = loop.step(h, e, rope, mask)
            growth, _, v = power_iteration(phi, h, valid, 4 * iters if t == 0 else iters, v)
            radii.append(float(growth.mean()))
    return np.array(radii)


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
    """(per-loop frame, per-size grid) with the columns of :mod:`looplab.lm.reasoning`.

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
    frame = pd.DataFrame(
        {
            "loops": np.arange(1, max_loops + 1),
            "loss": kjv_loss_by_loops(loop, kjv_batch, max_loops),
            **{
                f"reasoning_{split}": (torch.cat(parts).mean(0).numpy() if parts else np.full(max_loops, np.nan))
                for split, parts in pooled.items()
            },
            "state_norm": torch.cat(norms).mean(0).numpy(),
            "spectral_radius": spectral_by_loops(loop, probe, max_loops, spectral_iters, seed),
        }
    )
    return frame, pd.DataFrame(grid)
