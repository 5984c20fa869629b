"""Stabilisers head to head on addition (docs/results/stars-stabilisers/PROTOCOL.md): per-seed rows and the page.

Decision rules, stated in the protocol before any run (accuracy at 256 loops, past the training
support [1, 100], is the primary metric; a diverged run counts as 0):

    JSRR with random loops   stars − lognormal           "adds" above 0, "hurts" below, else "not resolved"
    JSRR alone               fixed4-jsrr − fixed4        the same words
    stabilisers              frobenius, state_l2, prelude_coda, contractive − stars
                                                         "better" / "worse" / "not resolved"

each a Welch 95 % t-interval of the difference in means.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from looplab.report.aggregate import seed_cell
from looplab.report.effect import comparison_line
from looplab.report.pages import markdown_table, register_block, register_collector, register_frozen
from looplab.report.runs import read_results, run_status, seconds_per_step
from looplab.studies.prose import names, said, span, split_decision, verdict_of
from looplab.studies.stars.verdicts import after_holm, decided, direction_p, holm_block

STUDY = "stars-stabilisers"
PRIMARY, METRIC = "acc_256", "accuracy at 256 loops"
READ_LOOPS = (4, 8, 16, 32, 64, 128, 256)
RHO_LOOPS = (8, 128)
#: the arms trained at a fixed 4 loops; every other arm samples log-normal loops (configs/stabilisers/)
FIXED_DEPTH = ("fixed4", "fixed4-jsrr")
ARM_ORDER = ("fixed4", "fixed4-jsrr", "lognormal", "stars", "frobenius", "state_l2", "prelude_coda", "contractive")
#: (question, arm, against it, word above 0, word below 0)
COMPARISONS = (
    ("JSRR with random loops", "stars", "lognormal", "adds", "hurts"),
    ("JSRR alone", "fixed4-jsrr", "fixed4", "adds", "hurts"),
    *(
        ("stabiliser", arm, "stars", "better", "worse")
        for arm in ("frobenius", "state_l2", "prelude_coda", "contractive")
    ),
)
RUNS_FILE, SCALING_FILE = "runs.csv", "scaling.csv"
register_frozen(STUDY, f"{STUDY}/PROTOCOL.md")


@register_collector(STUDY)
def collect(sweep_dirs: list[Path], out: Path) -> pd.DataFrame:
    """``out/runs.csv`` (one row per run: accuracy at the read depths, the minimum over loops 4–256, the
    state norm at 256 loops, seconds per training step, ρ at loops 8 and 128 where measured) and
    ``out/scaling.csv`` (accuracy and state norm at every loop of every run)."""
    rows, curves = [], []
    for sweep_dir in sweep_dirs:
        results = read_results(Path(sweep_dir))
        for _, run in results.iterrows():
            run_dir = Path(sweep_dir) / "runs" / run["run_id"]
            row = {"arm": str(run["variant"]), "seed": int(run["run.seed"]), "run_id": run["run_id"]}
            row.update(_run_row(run_dir))
            rows.append(row)
            curve = run_dir / "eval" / SCALING_FILE
            if curve.is_file():
                frame = pd.read_csv(curve)[["loops", "accuracy", "state_norm"]]
                curves.append(frame.assign(arm=row["arm"], seed=row["seed"]))
    runs = pd.DataFrame(rows)
    runs = runs.sort_values(["arm", "seed"], key=lambda c: c.map(_rank) if c.name == "arm" else c).reset_index(
        drop=True
    )
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / RUNS_FILE, index=False)
    if curves:
        scaling = pd.concat(curves, ignore_index=True)[["arm", "seed", "loops", "accuracy", "state_norm"]]
        scaling.round(6).to_csv(out / SCALING_FILE, index=False)
    return runs


def _run_row(run_dir: Path) -> dict:
    """One run's columns of runs.csv; a diverged run (no scaling curve) reads 0 at every depth."""
    status = run_status(run_dir)
    row: dict = {"status": status}
    curve_path = run_dir / "eval" / SCALING_FILE
    if curve_path.is_file():
        curve = pd.read_csv(curve_path).set_index("loops")
        row.update({f"acc_{k}": float(curve.accuracy.get(k, np.nan)) for k in READ_LOOPS})
        row["acc_min_4_256"] = float(curve.accuracy.loc[4:256].min())
        row["state_norm_256"] = float(curve.state_norm.get(256, np.nan))
        row["nonfinite_256"] = float(curve.nonfinite_fraction.get(256, np.nan))
    elif status == "diverged":
        row.update({f"acc_{k}": 0.0 for k in READ_LOOPS} | {"acc_min_4_256": 0.0})
    row["step_s"] = seconds_per_step(run_dir)
    spectral = run_dir / "analysis" / "spectral.csv"
    if spectral.is_file():
        rho = pd.read_csv(spectral).groupby("loop")["rho_power"].mean()
        row.update({f"rho_{k}": float(rho.get(k, np.nan)) for k in RHO_LOOPS})
    return row


def _rank(arm: str) -> tuple[int, str]:
    return (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER), arm)


def _arms(runs: pd.DataFrame) -> list[str]:
    return sorted(set(runs.arm), key=_rank)


def decision_lines(runs: pd.DataFrame) -> list[str]:
    """The protocol's decisions on accuracy at 256 loops, each with its Welch interval and seed counts."""
    return [line for line, _ in decisions(runs)]


def decisions(runs: pd.DataFrame) -> list[tuple[str, float]]:
    """The protocol's decisions as (line, p): p < α exactly when the line names a direction
    (:mod:`looplab.studies.stars.verdicts`)."""
    found = []
    for question, arm, other, above, below in COMPARISONS:
        a, b = _primary(runs, arm), _primary(runs, other)
        found.append((comparison_line(question, arm, other, a, b, METRIC, above, below), direction_p(a, b)))
    return found


def _primary(runs: pd.DataFrame, arm: str) -> np.ndarray:
    return runs.loc[runs.arm == arm, PRIMARY].dropna().to_numpy(dtype=float)


@register_block(f"{STUDY}/decisions")
def decisions_block(results_dir: Path) -> str:
    """The protocol's decisions, one line each."""
    return "\n".join(f"- {line}" for line in decision_lines(pd.read_csv(results_dir / STUDY / RUNS_FILE)))


@register_block(f"{STUDY}/accuracy")
def accuracy_block(results_dir: Path) -> str:
    """Per arm: accuracy at each read depth and its minimum over loops 4–256 (mean ± std [t-interval], %)."""
    runs = pd.read_csv(results_dir / STUDY / RUNS_FILE)
    columns = [(f"{k} loops", f"acc_{k}") for k in READ_LOOPS] + [("min, 4–256", "acc_min_4_256")]
    body = []
    for arm in sorted(_arms(runs), key=lambda a: -runs.loc[runs.arm == a, PRIMARY].mean()):
        part = runs[runs.arm == arm]
        diverged = int((part.status == "diverged").sum())
        body.append([arm, f"{len(part)}" + (f" ({diverged} diverged)" if diverged else "")])
        body[-1] += [seed_cell(part[column]) for _, column in columns]
    return markdown_table(["arm (by accuracy at 256 loops)", "seeds", *(title for title, _ in columns)], body)


#: the unregularised arm every arm's seconds per step are read against
COST_REFERENCE = "lognormal"


@register_block(f"{STUDY}/cost")
def cost_block(results_dir: Path) -> str:
    """Per arm: seconds per training step against lognormal's, state norm at 256 loops, ρ at 8 and 128 loops
    and the seeds with ρ < 1 there (n/a with its count where ρ was not measured)."""
    runs = pd.read_csv(results_dir / STUDY / RUNS_FILE)
    base = runs.loc[runs.arm == COST_REFERENCE, "step_s"].mean()
    body = []
    for arm in _arms(runs):
        part = runs[runs.arm == arm]
        cells = [
            arm,
            f"{part.step_s.mean():.3f}",
            f"{part.step_s.mean() / base:.2f}x" if np.isfinite(base) else "n/a",
            seed_cell(part.get("state_norm_256", pd.Series(dtype=float)), 1, 2, (0.0, np.inf)),
        ]
        for k in RHO_LOOPS:
            rho = part.get(f"rho_{k}", pd.Series(dtype=float)).dropna()
            cells.append(seed_cell(rho, 1, 3, (0.0, np.inf)))
            cells.append(f"{int((rho < 1).sum())} of {len(rho)}" if len(rho) else "n/a (0 seeds)")
        body.append(cells)
    header = ["arm", "s / step", "vs lognormal", "state norm, 256 loops"]
    for k in RHO_LOOPS:
        header += [f"ρ at {k} loops", f"ρ < 1 at {k}"]
    return markdown_table(header, body)


@register_block(f"{STUDY}/holm")
def holm_table_block(results_dir: Path) -> str:
    """Every decision's p-value, unadjusted and after Holm over all of them, beside the rule's verdict."""
    return holm_block(decided(decisions(_read(results_dir))))


# ------------------------------------------------------------------------------ what the data say, generated
# The rules' lines said as sentences (looplab.studies.prose) and plain descriptions of the committed rows
# (seed means, ranges, counts); the interpretation beside each block on the page is hand-written.


def _read(results_dir: Path) -> pd.DataFrame:
    return pd.read_csv(results_dir / STUDY / RUNS_FILE)


def _mean(runs: pd.DataFrame, arm: str, column: str, scale: float = 100.0) -> float:
    return float(scale * runs.loc[runs.arm == arm, column].mean())


def _acc(runs: pd.DataFrame, arm: str, k: int) -> str:
    """Seed-mean accuracy of ``arm`` at ``k`` loops, in percent."""
    return f"{_mean(runs, arm, f'acc_{k}'):.1f} %"


def _said(runs: pd.DataFrame, arm: str, other: str) -> str:
    """The rule's line for ``arm`` − ``other`` said, with Holm's verdict where it differs."""
    found = decided(decisions(runs))
    line = next(d.line for d in found if split_decision(d.line)[1].startswith(f"{arm} − {other},"))
    return f"{said(line).removesuffix('.')}{after_holm(found, line)}."


def _below(runs: pd.DataFrame, arm: str, k: int) -> str:
    """ρ at ``k`` loops: seed mean and the seeds below 1."""
    rho = runs.loc[runs.arm == arm, f"rho_{k}"].dropna()
    return f"{arm} {rho.mean():.3f} ({int((rho < 1).sum())} of {len(rho)} seeds below 1)"


@register_block(f"{STUDY}/says-jsrr")
def says_jsrr(results_dir: Path) -> str:
    """Rule 1 said, with both arms' means at 256 loops."""
    runs = _read(results_dir)
    return (
        f"{_said(runs, 'stars', 'lognormal')} Seed means at 256 loops: stars {_acc(runs, 'stars', 256)}, "
        f"lognormal {_acc(runs, 'lognormal', 256)}."
    )


@register_block(f"{STUDY}/says-fixed-depth")
def says_fixed_depth(results_dir: Path) -> str:
    """Rule 2 said; fixed4's fall by depth, fixed4-jsrr's seed range, and lognormal at 256 loops beside them."""
    runs = _read(results_dir)
    jsrr = runs.loc[runs.arm == "fixed4-jsrr", PRIMARY]
    fall = ", ".join(f"{_acc(runs, 'fixed4', k)} at {k}" for k in (8, 16, 32, 256))
    return (
        f"{_said(runs, 'fixed4-jsrr', 'fixed4')} Seed means of fixed4: {fall} loops; fixed4-jsrr at 256 loops "
        f"{_acc(runs, 'fixed4-jsrr', 256)}, seeds {span(jsrr, 1, 100, ' %')}. Beside them (a comparison no rule "
        f"names): lognormal {_acc(runs, 'lognormal', 256)} at 256 loops."
    )


@register_block(f"{STUDY}/says-rho")
def says_rho(results_dir: Path) -> str:
    """ρ at 8 and 128 loops, seed means and seeds below 1: a description, no rule."""
    runs = _read(results_dir)
    lognormal = [a for a in _arms(runs) if a not in FIXED_DEPTH]
    at_128 = {a: _mean(runs, a, "rho_128", 1.0) for a in lognormal}
    below = [a for a in lognormal if at_128[a] < 1]
    rest = [_below(runs, a, 128) for a in lognormal if a not in below]
    return (
        f"ρ of the loop Jacobian (seed means, a description; no rule decides on it). At 8 loops: "
        f"{'; '.join(_below(runs, a, 8) for a in ('stars', 'lognormal', 'fixed4-jsrr', 'fixed4'))}. At 128 loops, "
        f"the {len(lognormal)} log-normal arms: {len(below)} with a seed mean below 1 ({names(below)}; "
        f"{span([at_128[a] for a in below], 3)})" + (f", and {names(rest)}" if rest else "") + "."
    )


@register_block(f"{STUDY}/says-stabilisers")
def says_stabilisers(results_dir: Path) -> str:
    """Rule 3 said for each stabiliser, by mean accuracy at 256 loops; the arms' means, contractive's seed range,
    prelude_coda's fall and its ρ at 128 loops."""
    runs = _read(results_dir)
    found = decided(decisions(runs))
    lines = sorted(
        (d.line for d in found if d.line.startswith("stabiliser")),
        key=lambda line: -_mean(runs, split_decision(line)[1].split(" − ")[0], PRIMARY),
    )
    verdicts = "; ".join(
        f"{split_decision(line)[1]}: **{verdict_of(line)}**{after_holm(found, line)}" for line in lines
    )
    ranked = sorted(_arms(runs), key=lambda a: -_mean(runs, a, PRIMARY))
    contractive = runs.loc[runs.arm == "contractive", PRIMARY]
    falls = ", ".join(f"{_acc(runs, 'prelude_coda', k)} at {k}" for k in (64, 128, 256))
    return (
        f"**Stabilisers against STARS** (rule 3): {verdicts}. Seed means at 256 loops: "
        f"{', '.join(f'{a} {_acc(runs, a, 256)}' for a in ranked)}; contractive's seeds "
        f"{span(contractive, 1, 100, ' %')}. "
        f"prelude_coda: {falls} loops; ρ at 128 loops {_below(runs, 'prelude_coda', 128).split(' ', 1)[1]}."
    )


@register_block(f"{STUDY}/says-state-norm")
def says_state_norm(results_dir: Path) -> str:
    """The state norm at 256 loops over arms (seed means): a description, no rule."""
    runs = _read(results_dir)
    norms = {a: _mean(runs, a, "state_norm_256", 1.0) for a in _arms(runs)}
    lowest = min(norms, key=norms.get)
    others = [v for a, v in norms.items() if a != lowest]
    return (
        f"State norm at 256 loops (seed means, a description): {span(norms.values(), 2)} over the {len(norms)} arms; "
        f"the lowest {lowest}'s ({norms[lowest]:.2f}), every other arm {span(others, 2)}."
    )
