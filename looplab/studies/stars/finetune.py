"""STARS' protocol shape at CPU scale (docs/results/stars-finetune/PROTOCOL.md): fine-tunes of a looped LM
pretrained at a fixed 4 loops, read to 128 loops; per-seed rows and the page.

Decision rules, stated in the protocol before any run (Welch 95 % t-interval of the difference in seed
means; exact match on 1..4-step chain arithmetic, "em"; post-sandwich unless named):

    JSRR with random loops   stars − lognormal, em at 32 loops          "adds" / "hurts" / "not resolved"
    JSRR alone               fixed4_jsrr − fixed4, em at 8 loops         the same words
    random loops             lognormal − fixed4, em at 8 loops           the same words
    stabilisers              frobenius, state_l2, prelude_coda, contractive − stars, em at 32 loops
                                                                         "better" / "worse" / "not resolved"
    ρ below 1                per arm, the t-interval of ρ at 4 and at 32 loops: "below 1" / "above 1" /
                             "not resolved"
    placement                fixed4, lognormal, stars: post − pre em at 64 loops, "post holds more" /
                             "pre holds more"; pre − post KJV loss at 64 loops in the same words

A diverged run counts as em 0 and loss n/a at every depth.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from looplab.report.aggregate import seed_cell, t_interval
from looplab.report.effect import comparison_line, welch_interval
from looplab.report.pages import markdown_table, register_block, register_collector, register_frozen
from looplab.report.runs import read_results, run_status, seconds_per_step

STUDY = "stars-finetune"
READ_LOOPS = (4, 8, 16, 32, 64, 128)
RHO_LOOPS = (4, 32)
#: a run's curve columns (eval/lm_loops.csv) → their short names in runs.csv (<name>_<loops>)
CURVE_COLUMNS = {
    "reasoning_id": "em",
    "reasoning_ood": "em_ood",
    "loss": "loss",
    "state_norm": "norm",
    "spectral_radius": "rho",
}
ARM_ORDER = (
    "pretrain",
    "fixed4",
    "fixed4_jsrr",
    "lognormal",
    "stars",
    "frobenius",
    "state_l2",
    "prelude_coda",
    "contractive",
)
POST, PRE = "post_sandwich", "pre_sandwich"
#: (question, arm, against it, read depth, word above 0, word below 0), post-sandwich
COMPARISONS = (
    ("JSRR with random loops", "stars", "lognormal", 32, "adds", "hurts"),
    ("JSRR alone", "fixed4_jsrr", "fixed4", 8, "adds", "hurts"),
    ("random loops", "lognormal", "fixed4", 8, "adds", "hurts"),
    *(
        ("stabiliser", arm, "stars", 32, "better", "worse")
        for arm in ("frobenius", "state_l2", "prelude_coda", "contractive")
    ),
)
PLACEMENT_ARMS, PLACEMENT_LOOPS = ("fixed4", "lognormal", "stars"), 64
RUNS_FILE, CURVES_FILE, LM_CURVE = "runs.csv", "curves.csv", "lm_loops.csv"
register_frozen(STUDY, f"{STUDY}/PROTOCOL.md")


@register_collector(STUDY)
def collect(sweep_dirs: list[Path], out: Path) -> pd.DataFrame:
    """``out/runs.csv`` (one row per run: placement, arm, seed; em, OOD em, loss, state norm and ρ at the read
    depths; seconds per training step) and ``out/curves.csv`` (the same at every loop of every run)."""
    rows, curves = [], []
    for sweep_dir in sweep_dirs:
        for _, run in read_results(Path(sweep_dir)).iterrows():
            run_dir = Path(sweep_dir) / "runs" / run["run_id"]
            row = {
                "placement": str(run["model.placement"]),
                "arm": arm_name(str(run["variant"]), run),
                "seed": int(run["run.seed"]),
                "run_id": run["run_id"],
            }
            row.update(_run_row(run_dir))
            rows.append(row)
            curve = run_dir / "eval" / LM_CURVE
            if curve.is_file():
                frame = pd.read_csv(curve)[["loops", *CURVE_COLUMNS]].rename(columns=CURVE_COLUMNS)
                curves.append(frame.assign(placement=row["placement"], arm=row["arm"], seed=row["seed"]))
    runs = pd.DataFrame(rows).sort_values(["placement", "arm", "seed"], key=_sort_key).reset_index(drop=True)
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / RUNS_FILE, index=False)
    if curves:
        frame = pd.concat(curves, ignore_index=True)
        frame = frame[["placement", "arm", "seed", "loops", *CURVE_COLUMNS.values()]]
        frame.sort_values(["placement", "arm", "seed", "loops"], key=_sort_key).round(5).to_csv(
            out / CURVES_FILE, index=False
        )
    return runs


def arm_name(variant: str, run: pd.Series) -> str:
    """A fine-tune's arm (its config's stem after the placement) or, for a pretrained run, "pretrain" with
    its model shape when it is not the plain one ("pretrain (prelude_coda)", "pretrain (contractive)")."""
    if not variant.startswith("pretrain"):
        return variant.split("-", 1)[1]
    if int(run.get("model.prelude_layers", 0) or 0) > 0:
        return "pretrain (prelude_coda)"
    if run.get("model.injection") == "contractive":
        return "pretrain (contractive)"
    return "pretrain"


def _run_row(run_dir: Path) -> dict:
    """One run's columns of runs.csv; a diverged run (no curve) reads em 0 at every depth."""
    status = run_status(run_dir)
    row: dict = {"status": status}
    curve_path = run_dir / "eval" / LM_CURVE
    if curve_path.is_file():
        curve = pd.read_csv(curve_path).set_index("loops")
        for column, name in CURVE_COLUMNS.items():
            row.update({f"{name}_{k}": float(curve[column].get(k, np.nan)) for k in READ_LOOPS})
    elif status == "diverged":
        row.update({f"em_{k}": 0.0 for k in READ_LOOPS})
    row["step_s"] = seconds_per_step(run_dir)
    return row


def _rank(arm: str) -> tuple[int, str]:
    stem = arm.split(" ")[0]
    return (ARM_ORDER.index(stem) if stem in ARM_ORDER else len(ARM_ORDER), arm)


def _sort_key(column: pd.Series) -> pd.Series:
    if column.name == "arm":
        return column.map(_rank)
    if column.name == "placement":
        return column.map(lambda p: (p != POST, p))
    return column


def _values(runs: pd.DataFrame, placement: str, arm: str, column: str) -> np.ndarray:
    part = runs[(runs.placement == placement) & (runs.arm == arm)]
    return part[column].dropna().to_numpy(dtype=float) if column in part else np.array([])


def decision_lines(runs: pd.DataFrame) -> list[str]:
    """The protocol's decisions, each with its interval and seed counts."""
    lines = [
        comparison_line(
            question,
            arm,
            other,
            _values(runs, POST, arm, f"em_{k}"),
            _values(runs, POST, other, f"em_{k}"),
            f"exact match at {k} loops",
            above,
            below,
        )
        for question, arm, other, k, above, below in COMPARISONS
    ]
    for arm in [a for a in _arms(runs[runs.placement == POST]) if not a.startswith("pretrain")]:
        lines += [rho_line(arm, k, _values(runs, POST, arm, f"rho_{k}")) for k in RHO_LOOPS]
    k = PLACEMENT_LOOPS
    for arm in PLACEMENT_ARMS:
        post, pre = (_values(runs, p, arm, f"em_{k}") for p in (POST, PRE))
        lines.append(
            comparison_line(
                f"placement, {arm}",
                "post",
                "pre",
                post,
                pre,
                f"exact match at {k} loops",
                "post holds more",
                "pre holds more",
            )  # fmt: skip
        )
        post, pre = (_values(runs, p, arm, f"loss_{k}") for p in (POST, PRE))
        lines.append(loss_line(f"placement, {arm}", pre, post, k))
    return lines


def rho_line(arm: str, loops: int, rho: np.ndarray) -> str:
    """Rule 5: ρ's Student-t interval against 1, with the seeds below 1."""
    if len(rho) < 2:
        return f"ρ at {loops} loops, {arm}: n/a ({len(rho)} seeds; needs 2)"
    low, high = t_interval(rho)
    verdict = "below 1" if high < 1 else "above 1" if low > 1 else "not resolved"
    return (
        f"ρ at {loops} loops, {arm}: {rho.mean():.3f}, 95% [{low:.3f}, {high:.3f}] ({int((rho < 1).sum())} of "
        f"{len(rho)} seeds below 1): {verdict}"
    )


def loss_line(question: str, pre: np.ndarray, post: np.ndarray, loops: int) -> str:
    """Rule 6's loss half: pre − post KJV loss (nats per byte), positive when post-sandwich predicts better."""
    if len(pre) < 2 or len(post) < 2:
        return f"{question}: pre vs post KJV loss: n/a ({len(pre)} and {len(post)} seeds; needs 2 each)"
    low, high = welch_interval(pre, post)
    verdict = "post holds more" if low > 0 else "pre holds more" if high < 0 else "not resolved"
    return (
        f"{question}: pre − post, KJV loss at {loops} loops {pre.mean() - post.mean():+.3f} nats/byte, Welch 95% "
        f"[{low:+.3f}, {high:+.3f}] ({len(pre)} vs {len(post)} seeds): {verdict}"
    )


def _arms(runs: pd.DataFrame) -> list[str]:
    return sorted(set(runs.arm), key=_rank)


def _read(results_dir: Path) -> pd.DataFrame:
    return pd.read_csv(results_dir / STUDY / RUNS_FILE)


@register_block(f"{STUDY}/decisions")
def decisions_block(results_dir: Path) -> str:
    """The protocol's decisions, one line each."""
    return "\n".join(f"- {line}" for line in decision_lines(_read(results_dir)))


def _depth_table(runs: pd.DataFrame, name: str, scale: float, digits: int, bounds, order_by: str | None) -> str:
    """Per (placement, arm): ``name`` at each read depth, mean ± std [t-interval] over seeds."""
    body = []
    for placement in (POST, PRE):
        arms = _arms(runs[runs.placement == placement])
        if order_by is not None:
            arms.sort(key=lambda a: (a.startswith("pretrain"), -np.nanmean(_values(runs, placement, a, order_by))))
        for arm in arms:
            part = runs[(runs.placement == placement) & (runs.arm == arm)]
            diverged = int((part.status == "diverged").sum())
            cells = [
                placement.removesuffix("_sandwich"),
                arm,
                f"{len(part)}" + (f" ({diverged} diverged)" * bool(diverged)),
            ]
            cells += [
                seed_cell(part.get(f"{name}_{k}", pd.Series(dtype=float)), scale, digits, bounds) for k in READ_LOOPS
            ]
            body.append(cells)
    return markdown_table(["placement", "arm", "seeds", *(f"{k} loops" for k in READ_LOOPS)], body)


@register_block(f"{STUDY}/exact-match")
def exact_match_block(results_dir: Path) -> str:
    """Exact match (%) at the read depths, arms by their mean at 32 loops (pretrained runs last)."""
    return _depth_table(_read(results_dir), "em", 100, 1, (0.0, 1.0), "em_32")


@register_block(f"{STUDY}/loss")
def loss_block(results_dir: Path) -> str:
    """KJV validation loss (nats per byte) at the read depths."""
    return _depth_table(_read(results_dir), "loss", 1, 3, (0.0, np.inf), None)


@register_block(f"{STUDY}/rho")
def rho_block(results_dir: Path) -> str:
    """ρ of the loop Jacobian at the read depths."""
    return _depth_table(_read(results_dir), "rho", 1, 3, (0.0, np.inf), None)


#: the unregularised arm every arm's seconds per step are read against
COST_REFERENCE = "lognormal"


@register_block(f"{STUDY}/cost")
def cost_block(results_dir: Path) -> str:
    """Per post-sandwich arm: seconds per training step against lognormal's, the state norm at 128 loops and
    the seeds with ρ < 1 at each read depth."""
    runs = _read(results_dir)
    post = runs[runs.placement == POST]
    base = post.loc[post.arm == COST_REFERENCE, "step_s"].mean()
    body = []
    for arm in _arms(post):
        part = post[post.arm == arm]
        below = []
        for k in READ_LOOPS:
            rho = part[f"rho_{k}"].dropna() if f"rho_{k}" in part else pd.Series(dtype=float)
            below.append(f"{int((rho < 1).sum())}/{len(rho)}" if len(rho) else "n/a (0 seeds)")
        ratio = part.step_s.mean() / base if np.isfinite(base) and base > 0 else np.nan
        body.append(
            [
                arm,
                f"{part.step_s.mean():.3f}",
                f"{ratio:.2f}x" if np.isfinite(ratio) else "n/a",
                seed_cell(part.get("norm_128", pd.Series(dtype=float)), 1, 2, (0.0, np.inf)),
                *below,
            ]
        )
    header = ["arm", "s / step", "vs lognormal", "state norm, 128 loops", *(f"ρ < 1 at {k}" for k in READ_LOOPS)]
    return markdown_table(header, body)
