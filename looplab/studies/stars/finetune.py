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
from looplab.studies.prose import names, said, span, split_decision, verdict_of
from looplab.studies.stars.verdicts import after_holm, decided, direction_p, holm_block, mean_p

STUDY = "stars-finetune"
READ_LOOPS = (4, 8, 16, 32, 64, 128)
RHO_LOOPS = (4, 32)
RHO_RANGE = (0.0, np.inf)  # a spectral radius is the largest |eigenvalue|: never below 0
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
    return [line for line, _ in decisions(runs)]


def decisions(runs: pd.DataFrame) -> list[tuple[str, float]]:
    """The protocol's decisions as (line, p): p < α exactly when the line names a direction
    (:mod:`looplab.studies.stars.verdicts`)."""
    found = []
    for comparison in COMPARISONS:
        _, arm, other, k = comparison[:4]
        a, b = (_values(runs, POST, name, f"em_{k}") for name in (arm, other))
        found.append((_comparison(runs, *comparison), direction_p(a, b)))
    for arm in [a for a in _arms(runs[runs.placement == POST]) if not a.startswith("pretrain")]:
        for k in RHO_LOOPS:
            rho = _values(runs, POST, arm, f"rho_{k}")
            found.append((rho_line(arm, k, rho), mean_p(rho, 1.0)))
    k = PLACEMENT_LOOPS
    for arm in PLACEMENT_ARMS:
        post, pre = (_values(runs, p, arm, f"em_{k}") for p in (POST, PRE))
        words = ("post holds more", "pre holds more")
        line = comparison_line(f"placement, {arm}", "post", "pre", post, pre, f"exact match at {k} loops", *words)
        found.append((line, direction_p(post, pre)))
        post, pre = (_values(runs, p, arm, f"loss_{k}") for p in (POST, PRE))
        found.append((loss_line(f"placement, {arm}", pre, post, k), direction_p(pre, post)))
    return found


def _comparison(runs: pd.DataFrame, question: str, arm: str, other: str, k: int, above: str, below: str) -> str:
    """Rules 1–4: ``arm`` − ``other``, post-sandwich exact match at ``k`` loops."""
    a, b = (_values(runs, POST, name, f"em_{k}") for name in (arm, other))
    return comparison_line(question, arm, other, a, b, f"exact match at {k} loops", above, below)


def rho_line(arm: str, loops: int, rho: np.ndarray) -> str:
    """Rule 5: ρ's Student-t interval against 1, with the seeds below 1."""
    if len(rho) < 2:
        return f"ρ at {loops} loops, {arm}: n/a ({len(rho)} seeds; needs 2)"
    low, high = np.clip(t_interval(rho), *RHO_RANGE)
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


@register_block(f"{STUDY}/holm")
def holm_table_block(results_dir: Path) -> str:
    """Every decision's p-value, unadjusted and after Holm over all of them, beside the rule's verdict."""
    return holm_block(decided(decisions(_read(results_dir))))


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
    return _depth_table(_read(results_dir), "rho", 1, 3, RHO_RANGE, None)


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


# ------------------------------------------------------------------------------ what the data say, generated
# Each block below is one finding of the page: the rules' lines said as sentences (looplab.studies.prose)
# and plain descriptions of the committed rows (seed means, ranges), so the page's prose says no more
# than its rules; the interpretation beside each block is hand-written and marked as such.

#: the penalised arms with random loops (STARS and the penalties it is compared with)
PENALISED = ("stars", "frobenius", "state_l2")


def _mean(runs: pd.DataFrame, placement: str, arm: str, column: str) -> float:
    values = _values(runs, placement, arm, column)
    return float(values.mean()) if len(values) else float("nan")


def _em(runs: pd.DataFrame, arm: str, k: int, placement: str = POST) -> str:
    """Seed-mean exact match of ``arm`` at ``k`` loops, in percent."""
    return f"{100 * _mean(runs, placement, arm, f'em_{k}'):.1f} %"


def _line(runs: pd.DataFrame, arm: str, other: str) -> str:
    return _comparison(runs, *next(c for c in COMPARISONS if c[1:3] == (arm, other)))


def _said(runs: pd.DataFrame, line: str) -> str:
    """:func:`said`, with Holm's verdict where it differs from the rule's."""
    return f"{said(line).removesuffix('.')}{after_holm(decided(decisions(runs)), line)}."


def _fine_tuned(runs: pd.DataFrame, placement: str = POST) -> list[str]:
    return [a for a in _arms(runs[runs.placement == placement]) if not a.startswith("pretrain")]


@register_block(f"{STUDY}/says-jsrr")
def says_jsrr(results_dir: Path) -> str:
    """Rule 1 said, with the two arms' means at 16, 32 and 64 loops."""
    runs = _read(results_dir)
    means = {k: f"stars {_em(runs, 'stars', k)}, lognormal {_em(runs, 'lognormal', k)}" for k in (16, 32, 64)}
    return (
        f"{_said(runs, _line(runs, 'stars', 'lognormal'))} Seed means at 32 loops: {means[32]}; at 16 loops, the "
        f"edge of the log-normal support: {means[16]}; at 64 loops: {means[64]}."
    )


@register_block(f"{STUDY}/says-fixed-depth")
def says_fixed_depth(results_dir: Path) -> str:
    """Rules 2 and 3 said, with the arms' means at 8 loops."""
    runs = _read(results_dir)
    return (
        f"{_said(runs, _line(runs, 'fixed4_jsrr', 'fixed4'))} Seed means at 8 loops: fixed4_jsrr "
        f"{_em(runs, 'fixed4_jsrr', 8)}, fixed4 {_em(runs, 'fixed4', 8)}. "
        f"{_said(runs, _line(runs, 'lognormal', 'fixed4'))} "
        f"Seed mean at 8 loops: lognormal {_em(runs, 'lognormal', 8)}."
    )


@register_block(f"{STUDY}/says-rho")
def says_rho(results_dir: Path) -> str:
    """Rule 5 said per read depth: the fine-tuned post-sandwich arms grouped by their verdict."""
    runs = _read(results_dir)
    arms = _fine_tuned(runs)
    found = decided(decisions(runs))
    sentences = []
    for k in RHO_LOOPS:
        lines = {arm: rho_line(arm, k, _values(runs, POST, arm, f"rho_{k}")) for arm in arms}
        parts = []
        for verdict in ("below 1", "not resolved", "above 1"):
            group = [arm for arm, line in lines.items() if verdict_of(line) == verdict]
            if len(group) > 2:
                rho = span([_mean(runs, POST, arm, f"rho_{k}") for arm in group], 3)
                parts.append(f"**{verdict}** for {len(group)} ({names(group)}; seed means {rho})")
            elif group:
                evidence = names(f"{arm} at {split_decision(lines[arm])[1]}" for arm in group)
                parts.append(f"**{verdict}** for {evidence}")
            else:
                parts.append(f"**{verdict}** for none")
        sentences.append(f"ρ at {k} loops, the {len(arms)} fine-tuned post-sandwich arms: {'; '.join(parts)}.")
        changed = [arm for arm in arms if after_holm(found, lines[arm])]
        if changed:
            sentences.append(f"After Holm over the page's {len(found)} decisions: {names(changed)} not resolved.")
    return " ".join(sentences)


@register_block(f"{STUDY}/says-stabilisers")
def says_stabilisers(results_dir: Path) -> str:
    """Rule 4 said for each stabiliser; the arms' means at 32, 64 and 128 loops, KJV loss at 32 loops, and the
    pretrains the architectural arms start from."""
    runs = _read(results_dir)
    lines = sorted(
        (_comparison(runs, *c) for c in COMPARISONS if c[0] == "stabiliser"),
        key=lambda line: -_mean(runs, POST, split_decision(line)[1].split(" − ")[0], "em_32"),
    )
    found = decided(decisions(runs))
    verdicts = "; ".join(
        f"{split_decision(line)[1]}: **{verdict_of(line)}**{after_holm(found, line)}" for line in lines
    )
    arms = sorted(_fine_tuned(runs), key=lambda a: -_mean(runs, POST, a, "em_32"))
    at_32 = ", ".join(f"{arm} {_em(runs, arm, 32)}" for arm in arms if arm not in ("fixed4", "fixed4_jsrr"))
    others = [a for a in arms if a != "contractive"]
    deep = span([100 * _mean(runs, POST, a, f"em_{k}") for a in others for k in (64, 128)], 1, unit=" %")
    penalised = span([_mean(runs, POST, a, "loss_32") for a in PENALISED], 3)
    start = span([100 * _mean(runs, POST, "pretrain (contractive)", f"em_{k}") for k in (32, 64, 128)], 1)
    plain = span([100 * _mean(runs, POST, "pretrain", f"em_{k}") for k in (32, 64, 128)], 1)
    return (
        f"**Stabilisers against STARS** (rule 4): {verdicts}. Seed means at 32 loops: {at_32}. At 64 and 128 "
        f"loops contractive holds {_em(runs, 'contractive', 64)} and {_em(runs, 'contractive', 128)}, every other "
        f"fine-tuned arm {deep}. KJV loss at 32 loops: contractive "
        f"{_mean(runs, POST, 'contractive', 'loss_32'):.3f} nats/byte, the penalised arms ({names(PENALISED)}) "
        f"{penalised}. The two architectural arms start from a pretrain of their own shape: at 32, 64 and 128 "
        f"loops the contractive pretrain holds {start} %, the plain one {plain} %."
    )


@register_block(f"{STUDY}/says-placement")
def says_placement(results_dir: Path) -> str:
    """Rule 6 said for each recipe, exact match then KJV loss; STARS' exact match at 32 loops in each placement."""
    runs = _read(results_dir)
    lines = decision_lines(runs)
    found = decided(decisions(runs))
    match = [line for line in lines if line.startswith("placement") and "exact match" in line]
    loss = [line for line in lines if line.startswith("placement") and "KJV loss" in line]

    def listed(group: list[str]) -> str:
        return "; ".join(
            f"for {q.removeprefix('placement, ')}, {evidence}: **{verdict}**{after_holm(found, line)}"
            for line in group
            for q, evidence, verdict in [split_decision(line)]
        )

    return (
        f"**Placement** (rule 6): {listed(match)}. {listed(loss)[:1].upper()}{listed(loss)[1:]}. STARS' seed "
        f"mean at 32 loops: pre-sandwich "
        f"{_em(runs, 'stars', 32, PRE)}, post-sandwich {_em(runs, 'stars', 32)}."
    )


@register_block(f"{STUDY}/says-state-norm")
def says_state_norm(results_dir: Path) -> str:
    """The state norm at 128 loops by placement (seed means): a description, no rule."""
    runs = _read(results_dir)
    by_placement = {
        placement: {arm: _mean(runs, placement, arm, "norm_128") for arm in _arms(runs[runs.placement == placement])}
        for placement in (POST, PRE)
    }
    post, pre = by_placement[POST], by_placement[PRE]
    lowest = min(post, key=post.get)
    return (
        f"State norm at 128 loops (seed means, a description): post-sandwich arms {span(post.values(), 2)} "
        f"({len(post)} arms, pretrains included; the lowest {lowest}'s), pre-sandwich arms "
        f"{span(pre.values(), 0)} ({len(pre)} arms)."
    )
