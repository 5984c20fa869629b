"""The pretrained half of the ``stars-lm`` study: SmolLM2-135M retrofitted, fine-tuned fixed vs STARS.

Settings come from the ``[retrofit]`` table of a TOML file (the preset is
``configs/stars-lm/retrofit.toml``); every key is a :class:`RetrofitStudy` field.
Each (recipe, seed) writes ``OUT/retrofit/<recipe>-seed<seed>/``:

    train.csv             step, loops, loss, jsrr of the fine-tune
    loops.csv             per loop t: loss (KJV validation), reasoning_id, reasoning_ood, state_norm,
                          spectral_radius
    reasoning_loops.csv   per (length, loops): exact match
    summary.json          the loop-scaling summary (:func:`looplab.text.reasoning.scaling_summary`), wall time
    curve.csv             with ``curve_every`` > 0: the learning curve, every ``curve_every`` steps (and
                          before the first): step, elapsed_s, exact match at the training depth on
                          ``curve_samples`` held-out problems of each training size, KJV validation loss there

``as_is`` is the retrofit before any fine-tuning (the paper's base model). A
finished (recipe, seed) — its ``summary.json`` exists — is not run again, so an
interrupted study resumes where it stopped.
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pandas as pd
import torch

from looplab.errors import LooplabError, choice_error
from looplab.io import atomic_write, read_json_object
from looplab.provenance import record_start
from looplab.seeding import derive_generator
from looplab.studies.stars.recipes import (
    RECIPES,
    RetrofitRecipe,
    exact_match_by_loops,
    fine_tune_recipe,
    kjv_loss_by_loops,
    problem_batch,
    retrofit_by_loops,
    text_batch,
)
from looplab.text.reasoning import REASONING_FILE, scaling_summary

RETROFIT_DIR = "retrofit"
AS_IS = "as_is"
LOOPS_FILE = "loops.csv"
SUMMARY_FILE = "summary.json"
CURVE_FILE = "curve.csv"


@dataclass(frozen=True)
class RetrofitStudy:
    """What the pretrained half of the study runs (see ``configs/stars-lm/retrofit.toml``)."""

    recipes: tuple[str, ...] = tuple(RECIPES)
    seeds: tuple[int, ...] = (0,)
    steps: int = 60
    lr: float = 1e-4
    depth: int = 4
    per_length: int = 2
    text_rows: int = 4
    train_lengths: tuple[int, ...] = (1, 2, 3, 4)
    eval_lengths: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    samples: int = 32
    max_loops: int = 16
    spectral_iters: int = 3
    prelude: int = 4
    core: int = 6
    coda: int = 4
    inject: str = "mix"
    kjv_passages: int = 8
    kjv_tokens: int = 48
    threads: int = 2
    curve_every: int = 0
    curve_samples: int = 16

    def __post_init__(self):
        for recipe in self.recipes:
            if recipe not in (AS_IS, *RECIPES):
                raise choice_error("retrofit recipe", recipe, (AS_IS, *RECIPES))
        numbers = (
            "steps",
            "depth",
            "per_length",
            "samples",
            "max_loops",
            "spectral_iters",
            "core",
            "threads",
            "curve_samples",
        )
        for name in numbers:
            if getattr(self, name) < 1:
                raise LooplabError(f"retrofit.{name} must be >= 1, got {getattr(self, name)}")
        if not self.train_lengths or not self.eval_lengths or 2 * self.depth > self.max_loops:
            raise LooplabError("retrofit needs train and eval lengths, and max_loops >= 2 x depth")
        if not self.lr > 0:
            raise LooplabError(f"retrofit.lr must be > 0, got {self.lr}")
        if self.curve_every < 0:
            raise LooplabError(f"retrofit.curve_every must be >= 0 (0: no learning curve), got {self.curve_every}")

    @property
    def train_max(self) -> int:
        return max(self.train_lengths)


def load_study(path: str | Path) -> RetrofitStudy:
    """The ``[retrofit]`` table of a TOML file; an unknown key is an error naming the valid ones."""
    try:
        table = tomllib.loads(Path(path).read_text()).get("retrofit", {})
    except tomllib.TOMLDecodeError as err:
        raise LooplabError(f"{path}: not valid TOML ({err})") from None
    known = {f.name for f in fields(RetrofitStudy)}
    for key in table:
        if key not in known:
            raise choice_error("retrofit key", key, sorted(known))
    return RetrofitStudy(**{k: tuple(v) if isinstance(v, list) else v for k, v in table.items()})


def first_reaching(curve: pd.DataFrame, threshold: float) -> tuple[float, float]:
    """(step, elapsed seconds) of the first ``curve.csv`` row whose accuracy is >= ``threshold``; NaNs if none."""
    reached = curve[curve.accuracy >= threshold]
    if reached.empty:
        return float("nan"), float("nan")
    return float(reached.step.iloc[0]), float(reached.elapsed_s.iloc[0])


def curve_probe(study: RetrofitStudy, loop, tokenizer, kjv_batch, seed: int, began: float, out: Path):
    """``probe(step)``: append one learning-curve row and rewrite ``out/curve.csv`` with the rows so far
    (so a long fine-tune can be watched, and a killed one read).

    Its problems (``curve_samples`` per training size, drawn once from
    ``derive_generator(seed, "retrofit-curve", n)``) are neither the fine-tune's nor the
    final reading's, and it reads them at the training depth only.
    """
    problems = [
        problem_batch(tokenizer, [n], study.curve_samples, derive_generator(seed, "retrofit-curve", n))
        for n in study.train_lengths
    ]
    rows: list[dict] = []

    def probe(step: int) -> None:
        correct = torch.cat([exact_match_by_loops(loop, batch, study.depth)[0][:, -1] for batch in problems])
        rows.append(
            {
                "step": step,
                "elapsed_s": round(time.perf_counter() - began, 1),
                "accuracy": float(correct.double().mean()),
                "problems": len(correct),
                "kjv_loss": float(kjv_loss_by_loops(loop, kjv_batch, study.depth)[-1]),
            }
        )
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / CURVE_FILE, lambda p: pd.DataFrame(rows).to_csv(p, index=False))

    return probe


def run_one(study: RetrofitStudy, model, tokenizer, recipe: str, seed: int, out: Path) -> dict:
    """Retrofit, fine-tune (unless ``as_is``) and measure one (recipe, seed); write its folder."""
    from looplab.lm.retrofit import RetrofittedLoop

    began = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    record_start(out, json.dumps({"study": asdict(study), "recipe": recipe, "seed": seed}, sort_keys=True))
    torch.manual_seed(seed)
    loop = RetrofittedLoop(model, study.prelude, study.core, study.coda, inject_init=study.inject)
    kjv = text_batch(tokenizer, "val", study.kjv_passages, study.kjv_tokens, derive_generator(seed, "retrofit-kjv"))
    probe = curve_probe(study, loop, tokenizer, kjv, seed, began, out)
    if recipe != AS_IS:
        log = fine_tune_recipe(
            loop,
            tokenizer,
            RetrofitRecipe(recipe, depth=study.depth),
            study.steps,
            list(study.train_lengths),
            study.per_length,
            study.lr,
            seed,
            study.text_rows,
            study.kjv_tokens,
            probe=probe,
            probe_every=study.curve_every,
        )
    else:
        log = pd.DataFrame(columns=["step", "loops", "loss", "jsrr"])
    frame, grid = retrofit_by_loops(
        loop,
        tokenizer,
        kjv,
        list(study.eval_lengths),
        study.train_max,
        study.samples,
        study.max_loops,
        seed,
        study.spectral_iters,
    )
    summary = {
        "recipe": recipe,
        "seed": seed,
        "training_depth": study.depth,
        **scaling_summary(frame, study.depth),
        "wall_s": round(time.perf_counter() - began, 1),
        "study": asdict(study),
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "train.csv", lambda p: log.to_csv(p, index=False))
    atomic_write(out / LOOPS_FILE, lambda p: frame.to_csv(p, index=False))
    atomic_write(out / REASONING_FILE, lambda p: grid.to_csv(p, index=False))
    atomic_write(out / SUMMARY_FILE, lambda p: p.write_text(json.dumps(summary, indent=2)))  # last: marks it done
    return summary


def run_study(study: RetrofitStudy, sweep_dir: str | Path, progress: bool = True) -> list[dict]:
    """Every (recipe, seed) not yet finished under ``sweep_dir/retrofit``; returns all their summaries."""
    from looplab.text.pretrained import load_smollm2

    root = Path(sweep_dir) / RETROFIT_DIR
    todo = [(r, s) for s in study.seeds for r in study.recipes if not (root / f"{r}-seed{s}" / SUMMARY_FILE).is_file()]
    if todo:
        torch.set_num_threads(study.threads)
        model, tokenizer = load_smollm2()
        for recipe, seed in todo:
            summary = run_one(study, model, tokenizer, recipe, seed, root / f"{recipe}-seed{seed}")
            if progress:
                print(f"retrofit {recipe} seed {seed}: {summary['wall_s']:.0f} s")
    return [
        read_json_object(root / f"{r}-seed{s}" / SUMMARY_FILE, "retrofit summary")
        for s in study.seeds
        for r in study.recipes
    ]
