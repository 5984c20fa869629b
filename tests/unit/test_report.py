"""The sweep report on a synthetic sweep: seed statistics, paper tables, figures, self-contained HTML."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import statistics

import numpy as np
import pandas as pd
import pytest

from looplab.errors import LooplabError
from looplab.report import paper as paper_module
from looplab.report import write_report
from looplab.report.aggregate import BOOTSTRAP_SEED, RESAMPLES, bootstrap_ci, seed_stats
from looplab.report.build import sweep_statistics
from looplab.report.paper import compare
from looplab.studies import load_studies

load_studies()  # the papers, page blocks and collectors these tests read are registered by the studies

TASKS = ("binary_addition", "dyck1")
VARIANTS = ("fixed", "rl_halting")
SEEDS = (0, 1, 2)
LENGTHS = (4, 8, 12, 16)
TRAIN_MAX = 8
LOOPS = 6
# the group checked by hand: (binary_addition, fixed)
HAND_ORACLE_OOD = [0.30, 0.42, 0.36]
HAND_FRONT90 = [8, 12, 16]

STOPPING_MAIN = """task,schedule,oracle_ood_pct,front90,std_pp,gap_pp
binary_addition,fixed_K20,34.2,25,7.4,16.4
binary_addition,rl_halting,45.0,30,2.7,5.8
copy,rl_halting,43.2,25,2.7,1.9
"""


# Student's t quantile t(0.975, 2), from a printed table (not from the code under test)
T_975_DF2 = 4.302652729911275


STOPPING_PROTOCOL = (
    "task,train_min,train_max,ood_min,ood_max,train_depth,test_depth,steps,batch_size,lr,seeds,width,"
    "core_layers,injection\nbinary_addition,1,19,20,60,20,30,100000,64,1e-4,32,not stated,3,add\n"
)


def loop_bootstrap(values, resamples=RESAMPLES, seed=BOOTSTRAP_SEED, statistic=np.mean):
    """The percentile bootstrap written out one resample at a time."""
    rng = np.random.default_rng(seed)
    values = np.asarray(values, dtype=float)
    draws = [statistic(values[rng.integers(0, len(values), size=len(values))]) for _ in range(resamples)]
    return tuple(np.quantile(draws, [0.025, 0.975]))


def _grid(shift: float) -> pd.DataFrame:
    rows = []
    for n in LENGTHS:
        for k in range(1, LOOPS + 1):
            rows.append(
                {
                    "length": n,
                    "loops": k,
                    "accuracy": float(np.clip(1.1 - 0.05 * n + 0.04 * k - shift, 0, 1)),
                    "flip_rate": 0.3 / k if k < LOOPS else math.nan,
                    "split": "id" if n <= TRAIN_MAX else "ood",
                }
            )
    return pd.DataFrame(rows)


def _run_row(task: int, variant: int, seed: int, grid: pd.DataFrame) -> dict:
    hand = task == 0 and variant == 0
    oracle_ood = HAND_ORACLE_OOD[seed] if hand else 0.2 + 0.1 * variant + 0.03 * seed + 0.05 * task
    row = {
        "run_id": f"r{task}{variant}{seed}",
        "run_dir": f"runs/r{task}{variant}{seed}",
        "variant": VARIANTS[variant],
        "wall_s": 1.5,
        "task.name": TASKS[task],
        "task.train_max": TRAIN_MAX,
        "schedule.name": VARIANTS[variant],
        "schedule.depth": 20,
        "schedule.t_max": 20,
        "schedule.entropy_weight": 0.001,
        "run.seed": seed,
        "task.eval_lengths": json.dumps(list(LENGTHS)),
        "oracle_id": 0.99,
        "oracle_ood": oracle_ood,
        "policy_ood": oracle_ood - 0.1,
        "gap": 0.1,
        "front90": HAND_FRONT90[seed] if hand else 8 + 4 * variant,
        "flip_rate": 0.05 * (seed + 1),
        "training_cost.block_evals": 20.0 - variant,
        "flip_curve": json.dumps([0.3, 0.15, 0.1]),
        "scaling_at.4": 0.8,
        "scaling_at.8": 0.6,
        "scaling_peak": 0.9,
        "scaling_peak_loops": 5,
    }
    for n, oracle in grid.groupby("length")["accuracy"].max().items():
        row[f"per_length.{n}.oracle"] = oracle
        row[f"per_length.{n}.split"] = "id" if n <= TRAIN_MAX else "ood"
    return row


def make_sweep(root) -> pd.DataFrame:
    """2 tasks × 2 variants × 3 seeds; dyck1 runs have no policy_depths.parquet (an older evaluation)."""
    rows = []
    for t in range(len(TASKS)):
        for v in range(len(VARIANTS)):
            for seed in SEEDS:
                grid = _grid(0.1 * v + 0.02 * seed)
                row = _run_row(t, v, seed, grid)
                eval_dir = root / row["run_dir"] / "eval"
                eval_dir.mkdir(parents=True)
                grid.to_parquet(eval_dir / "grid.parquet", index=False)
                if TASKS[t] == "binary_addition":
                    depths = pd.DataFrame(
                        {
                            "length": np.repeat(LENGTHS, 2),
                            "depth": [3, 4] * len(LENGTHS),
                            "count": [10 + v, 22 - seed] * len(LENGTHS),
                        }
                    )
                    depths.to_parquet(eval_dir / "policy_depths.parquet", index=False)
                rows.append(row)
    results = pd.DataFrame(rows)
    results.to_parquet(root / "results.parquet", index=False)
    return results


def synthetic_report(tmp_path_factory):
    """The stopping report of :func:`make_sweep` against small paper tables: (sweep dir, report dir, results)."""
    root = tmp_path_factory.mktemp("sweep")
    paper_dir = tmp_path_factory.mktemp("paper_tables")
    (paper_dir / "stopping_main.csv").write_text(STOPPING_MAIN)
    (paper_dir / "stopping_protocol.csv").write_text(STOPPING_PROTOCOL)
    results = make_sweep(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paper_module, "PAPER_TABLES_DIR", paper_dir)
        report = write_report(root, paper="stopping")
    return root, report, results


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return synthetic_report(tmp_path_factory)


# ----------------------------------------------------------------------------- (a) statistics


def test_bootstrap_ci_equals_a_loop_with_the_same_seed():
    values = [0.2, 0.5, 0.9, 0.4]
    assert bootstrap_ci(values) == pytest.approx(loop_bootstrap(values), abs=1e-12)


def test_bootstrap_ci_collapses_for_identical_seeds():
    assert bootstrap_ci([0.375] * 5) == pytest.approx((0.375, 0.375))


def test_seed_stats_single_seed_and_missing_values():
    one = seed_stats([0.7])
    assert one["n"] == 1 and one["mean"] == 0.7 and math.isnan(one["std"])
    assert all(math.isnan(one[k]) for k in ("ci_lo", "ci_hi", "std_lo", "std_hi"))  # one seed: no interval
    some = seed_stats([0.1, float("nan"), 0.3])
    assert some["n"] == 2 and some["mean"] == pytest.approx(0.2)
    assert some["std"] == pytest.approx(statistics.stdev([0.1, 0.3]))
    assert seed_stats([])["n"] == 0 and math.isnan(seed_stats([])["mean"])


def test_table_csv_matches_hand_computed_seed_statistics(sweep):
    _, report, _ = sweep
    table = pd.read_csv(report / "table.csv")
    assert len(table) == len(TASKS) * len(VARIANTS)
    row = table[(table["task.name"] == "binary_addition") & (table["variant"] == "fixed")].iloc[0]
    assert row["runs"] == 3 and row["oracle_ood_pct.n"] == 3
    assert row["oracle_ood_pct.mean"] == pytest.approx(100 * statistics.mean(HAND_ORACLE_OOD))
    assert row["oracle_ood_pct.std"] == pytest.approx(100 * statistics.stdev(HAND_ORACLE_OOD))  # the paper's Std (pp)
    half = T_975_DF2 * 6.0 / math.sqrt(3)  # t-interval of the mean: 36 ± t·s/√n, in percent
    assert (row["oracle_ood_pct.ci_lo"], row["oracle_ood_pct.ci_hi"]) == pytest.approx((36 - half, 36 + half))
    std_lo, std_hi = loop_bootstrap(HAND_ORACLE_OOD, statistic=lambda v: v.std(ddof=1))
    assert (row["oracle_ood_pct.std_lo"], row["oracle_ood_pct.std_hi"]) == pytest.approx((100 * std_lo, 100 * std_hi))
    assert row["front90.mean"] == pytest.approx(statistics.mean(HAND_FRONT90))
    assert row["front90.std"] == pytest.approx(statistics.stdev(HAND_FRONT90))
    assert row["gap_pp.mean"] == pytest.approx(10.0)
    assert row["relative_drop_4_to_8_pct.mean"] == pytest.approx(25.0)  # (0.8 − 0.6) / 0.8
    md = (report / "table.md").read_text()
    assert "36.0 ± 6.0 [21.1, 50.9]" in md  # Oracle OOD cell of (binary_addition, fixed)
    assert "| 3 (few) |" in md  # fewer than 5 seeds are flagged


def test_diverged_runs_count_as_seeds_without_metrics():
    results = pd.DataFrame(
        {
            "run_id": list("abc"),
            "run_dir": list("abc"),
            "task.name": "copy",
            "variant": "fixed",
            "status": ["done", "diverged", "done"],
            "oracle_ood": [0.5, None, 0.7],
        }
    )
    ours = sweep_statistics(results)
    assert ours.groups[["runs", "diverged"]].values.tolist() == [[3, 1]]
    stats = ours.long.set_index("metric").loc["oracle_ood"]
    assert stats["n"] == 2 and stats["mean"] == pytest.approx(60.0)


# ----------------------------------------------------------------------------- (b) figures and HTML


def test_html_is_self_contained_and_embeds_every_png(sweep):
    _, report, _ = sweep
    page = (report / "report.html").read_text()
    pngs = sorted(report.glob("**/*.png"))
    assert len(pngs) == 9  # 5 figures per task, less dyck1's policy-depth histogram (no input)
    assert not (report / "dyck1-depths.png").exists()
    embedded = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(embedded) == len(pngs)
    assert base64.b64decode(embedded[0]).startswith(b"\x89PNG\r\n\x1a\n")
    references = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]+)""", page, flags=re.IGNORECASE)
    assert references and all(ref.startswith("data:") for ref in references)
    outside = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page).lower()
    assert "http" not in outside and "<script" not in outside and "<link" not in outside


# ----------------------------------------------------------------------------- (c) paper tables


def test_stopping_paper_numbers_side_by_side(sweep):
    _, report, _ = sweep
    for text in ((report / "table.md").read_text(), (report / "report.html").read_text().replace("&nbsp;", " ")):
        for column in (
            "Front@90 / train max",
            "36.0 [21.1, 50.9] / 34.2 → inside",  # ours [t-interval] / paper → where the paper lies
            "Each cell: ours / the paper",
            "fixed K = 20",
            "RL-Halting, T_max = 20, λ_ent = 0.001",
            "Protocol, binary_addition — ours: train n ∈ [?, 8], evaluated to n = 16 (2.0× the longest",
            "paper: train n ∈ [1, 19], OOD n ∈ [20, 60] (3.2×), T_train 20, 100000 steps, 32 seeds",
            "Conclusion, binary_addition, against fixed (reproduced when Gap(fixed) − Gap(other)",
        ):
            assert column in text, column
    protocols = (report / "table.md").read_text().split("## Protocol: ours vs paper")[1]
    assert "| binary_addition | longest evaluated length | 16 | 60 | no |" in protocols
    assert "| binary_addition | training steps | ? | 100000 | – |" in protocols  # not recorded: not compared
    assert "absolute accuracies are not comparable" in protocols
    header = "| Paper row | Oracle OOD (%) | Front@90 / train max | Std (pp) | Gap (pp) |"
    assert header in (report / "table.md").read_text()  # one compact cell per metric
    latex = (report / "table.tex").read_text()
    assert r"\begin{tabular}{lllllllll}" in latex  # the same nine columns in the paper's table
    assert latex.count(r"\begin{adjustbox}{max width=\linewidth}") == latex.count(r"\begin{tabular}") > 1
    side = pd.read_csv(report / "paper_stopping_main.csv")
    assert set(side["variant"]) == {"fixed", "rl_halting"} and set(side["task.name"]) == {"binary_addition"}
    fixed = side[side["variant"] == "fixed"].iloc[0]
    assert fixed["paper.schedule"] == "fixed_K20"
    assert (fixed["paper.oracle_ood_pct"], fixed["paper.std_pp"]) == (34.2, 7.4)
    assert fixed["ours.oracle_ood_pct"] == pytest.approx(100 * statistics.mean(HAND_ORACLE_OOD))
    assert fixed["ours.std_pp"] == pytest.approx(100 * statistics.stdev(HAND_ORACLE_OOD))
    # 34.2 lies inside our t-interval 36 ± 14.9; the paper's std 7.4 lies above our std's bootstrap interval
    assert fixed["place.oracle_ood_pct"] == "inside"
    assert fixed["place.std_pp"] == ("above" if fixed["ours.std_pp.std_hi"] < 7.4 else "inside")
    assert fixed["paper.front90_rel"] == pytest.approx(25 / 19, abs=0.005)
    assert fixed["ours.front90_rel"] == pytest.approx(statistics.mean(HAND_FRONT90) / TRAIN_MAX)
    # the other stopping CSVs are absent from this paper directory: a note, not a crash
    assert "stopping_cost.csv not found" in (report / "table.md").read_text()


def test_missing_paper_tables_leave_a_note(sweep, tmp_path):
    _, _, results = sweep
    tables, notes = compare("stopping", sweep_statistics(results), tmp_path / "absent")
    assert tables == [] and any("not found" in note for note in notes)


def test_mechanistic_groups_by_placement_and_injection(tmp_path):
    (tmp_path / "mechanistic_norm_ablation.csv").write_text(
        "norm,input_injection,cos_first_layer_to_own_fixed_point,min_cos_first_layer_to_other_layers_fixed_point,"
        "verdict\npre_norm,yes,1.000,<0.65,healthy\nsandwich_residual (huginn),no,0.920,0.880,unstable\n"
    )
    results = pd.DataFrame(
        {
            "run_id": list("abcd"),
            "run_dir": list("abcd"),
            "task.name": "kjv",
            "variant": ["ablation-pre-injection"] * 2 + ["ablation-post_sandwich-none"] * 2,
            "model.placement": ["pre", "pre", "post_sandwich", "post_sandwich"],
            "model.injection": ["concat", "concat", "none", "none"],
            "analysis.fixed_point_self_cos": [1.0, 0.98, 0.9, 0.94],
            "analysis.fixed_point_cross_cos_min": [0.6, 0.5, 0.88, 0.86],
        }
    )
    (table,), notes = compare("mechanistic", sweep_statistics(results), tmp_path)
    numbers = table.numbers.set_index("model.placement")
    assert numbers.loc["pre", "paper.norm"] == "pre_norm"
    assert numbers.loc["pre", "paper.min_cos_first_layer_to_other_layers_fixed_point"] == "<0.65"
    assert numbers.loc["pre", "ours.min_cos_first_layer_to_other_layers_fixed_point"] == pytest.approx(0.55)
    assert numbers.loc["post_sandwich", "paper.verdict"] == "unstable"
    assert numbers.loc["post_sandwich", "ours.cos_first_layer_to_own_fixed_point"] == pytest.approx(0.92)


def test_stars_facts_beside_our_scaling(tmp_path):
    (tmp_path / "stars_facts.csv").write_text(
        "fact,value\ngsm8k_relative_drop_4_to_8_stars_pct,8.26\njsrr_lambda,0.1\n"
    )
    results = pd.DataFrame(
        {
            "run_id": ["a", "b"],
            "run_dir": ["a", "b"],
            "task.name": "decimal_addition",
            "variant": "stars-recipe",
            "relative_drop_4_to_8": [0.1, 0.2],
            "scaling_peak": [0.9, 1.0],
        }
    )
    scaling, facts = compare("stars", sweep_statistics(results), tmp_path)[0]
    assert "Peak accuracy (%)" in scaling.display.columns
    row = facts.numbers.set_index("fact").loc["gsm8k_relative_drop_4_to_8_stars_pct"]
    assert row["paper"] == 8.26 and row["ours.mean"] == pytest.approx(15.0)


# ----------------------------------------------------------------------------- (d) bad input


def test_missing_results_names_the_fix(tmp_path):
    with pytest.raises(LooplabError, match=r"no results\.parquet in .*; run `looplab sweep` first"):
        write_report(tmp_path)


def test_unknown_paper_names_the_choices(tmp_path):
    with pytest.raises(LooplabError) as error:
        write_report(tmp_path, paper="nature")
    message = str(error.value)
    assert "'nature'" in message and all(p in message for p in ("stopping", "stars", "mechanistic"))
    assert "\n" not in message


def test_results_without_the_sweep_columns(tmp_path):
    pd.DataFrame({"run_id": ["a"], "oracle_ood": [0.5]}).to_parquet(tmp_path / "results.parquet")
    with pytest.raises(LooplabError, match="lacks column"):
        write_report(tmp_path)


def test_variants_of_one_schedule_get_distinct_colours_and_the_schedule_keeps_its_own():
    from looplab.plotting import SCHEDULE_COLORS
    from looplab.report.plots import _colors

    colors = _colors(["rl_halting-ent0", "fixed", "rl_halting", "rl_halting-ent0.1", "window"])
    assert len(set(colors.values())) == 5
    assert colors["rl_halting"] == SCHEDULE_COLORS["rl_halting"] and colors["fixed"] == SCHEDULE_COLORS["fixed"]
    assert _colors(["rl_halting-ent0"]) == {"rl_halting-ent0": SCHEDULE_COLORS["rl_halting"]}  # alone: its schedule's


def test_stars_lm_cells_use_the_student_t_interval():
    from scipy import stats

    from looplab.studies.stars.lm import _stats

    cell = _stats([1.0, 2.0, 3.0, None, math.nan])  # an undefined value is left out, not counted as 0
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)  # 4.30 · std / √3, not the normal 1.96
    assert cell["n"] == 3 and (cell["ci_lo"], cell["ci_hi"]) == pytest.approx((2 - half, 2 + half))
    assert _stats([])["n"] == 0 and math.isnan(_stats([])["mean"])


def test_a_cell_says_undefined_and_how_many_seeds_define_it():
    from looplab.report.tables import UNDEFINED, cell

    nothing = {"n": 0, "mean": math.nan, "std": math.nan, "ci_lo": math.nan, "ci_hi": math.nan}
    assert cell(nothing, 1, runs=4) == UNDEFINED == "n/a (0 seeds)"
    some = {"n": 3, "mean": 50.0, "std": 1.0, "ci_lo": 47.5, "ci_hi": 52.5}
    assert cell(some, 1, runs=4) == "50.0 ± 1.0 [47.5, 52.5] (n = 3 of 4)"
    assert cell(some, 1, runs=3) == "50.0 ± 1.0 [47.5, 52.5]"


def test_the_report_states_its_provenance(sweep, tmp_path):
    root, report, _ = sweep
    md = (report / "table.md").read_text()
    line = next(line for line in md.splitlines() if line.startswith("- Provenance: looplab"))
    assert "no sweep.toml in the sweep dir" in line and "UTC" in line
    assert "Provenance: looplab" in (report / "report.html").read_text()
    (tmp_path / "sweep.toml").write_text("[sweep]\nconfigs = []\n")
    from looplab.report.build import provenance

    digest = hashlib.sha256(b"[sweep]\nconfigs = []\n").hexdigest()[:16]
    assert f"sweep.toml sha256 {digest}" in provenance(tmp_path)


@pytest.mark.parametrize(
    "metric, values, expected",
    [
        ("oracle_id", [1.0, 0.9, 1.0], (None, 1.0)),  # the t-interval would pass 100 %
        ("policy_ood", [0.0, 0.05, 0.0], (0.0, None)),
        ("gap", [0.99, 0.9, 0.99], (None, 1.0)),
        ("front90", [30.0, 10.0, 30.0], (None, None)),  # a length: no bound
    ],
)
def test_a_mean_interval_is_clipped_to_the_metric_range(metric, values, expected):
    from looplab.report.aggregate import aggregate

    row = aggregate(pd.DataFrame({"variant": "a", metric: values}), ["variant"], [metric]).iloc[0]
    raw_lo, raw_hi = seed_stats(values)["ci_lo"], seed_stats(values)["ci_hi"]
    low, high = expected
    assert row["ci_lo"] == pytest.approx(raw_lo if low is None else low)
    assert row["ci_hi"] == pytest.approx(raw_hi if high is None else high)
    assert (low is None or raw_lo < low) and (high is None or raw_hi > high)


def test_a_report_for_another_paper_goes_beside_it_not_over_it(sweep):
    root, report, _ = sweep
    assert report == root / "report-stopping"
    before = (report / "table.md").read_text()
    plain = write_report(root)
    assert plain == root / "report" and (plain / "table.md").is_file()
    assert "paper: stopping" not in (plain / "table.md").read_text()
    assert (report / "table.md").read_text() == before


def test_a_zero_spread_is_said_not_shown_as_an_interval():
    from looplab.report.tables import cell

    same = {"n": 5, "mean": 8.0, "std": 0.0, "ci_lo": 8.0, "ci_hi": 8.0}
    assert cell(same, 2) == "8.00 (all 5 seeds equal)"
    spread = {**same, "std": 0.5, "ci_lo": 7.4, "ci_hi": 8.6}
    assert cell(spread, 2) == "8.00 ± 0.50 [7.40, 8.60]"


@pytest.mark.parametrize(
    "text, html_text",
    [
        ("36.0 [21.1, 50.9] / 34.2 → inside", "36.0&nbsp;[21.1,&nbsp;50.9] / 34.2 →&nbsp;inside"),
        ("RL-Halting, T_max = 20, λ_ent = 0.001", "RL-Halting, T_max&nbsp;=&nbsp;20, λ_ent&nbsp;=&nbsp;0.001"),
        ("3 (few)", "3&nbsp;(few)"),
        ("−1.6 [−20.8, +6.6]", "−1.6&nbsp;[−20.8,&nbsp;+6.6]"),
        ("a < b", "a&nbsp;&lt;&nbsp;b"),
    ],
)
def test_html_cells_wrap_only_between_their_parts(text, html_text):
    from looplab.report.render import html_cell

    assert html_cell(text) == html_text


def test_the_paper_row_is_found_from_the_runs_schedule_not_the_variants_name(tmp_path):
    """A sweep of a config named after nothing in the paper (a demo) still meets its paper row."""
    (tmp_path / "stopping_main.csv").write_text(STOPPING_MAIN)
    results = make_sweep(tmp_path / "sweep")
    results["variant"] = results["variant"].map({"fixed": "demo", "rl_halting": "my_halting+train.steps=9"})
    tables, _ = compare("stopping", sweep_statistics(results), tmp_path)
    main = next(t for t in tables if t.name == "paper_stopping_main").numbers
    assert dict(zip(main["variant"], main["paper.schedule"])) == {
        "demo": "fixed_K20",
        "my_halting+train.steps=9": "rl_halting",
    }
    ablated = results.assign(**{"schedule.entropy_weight": 0.0})
    tables, _ = compare("stopping", sweep_statistics(ablated), tmp_path)
    main = next(t for t in tables if t.name == "paper_stopping_main").numbers
    assert list(main["paper.schedule"]) == ["fixed_K20"]  # RL-Halting without its entropy bonus is an ablation


@pytest.mark.parametrize(
    "metric, values, low, high",
    [
        ("analysis.fixed_point_self_cos", [0.2, 0.99, 1.0], -1.0, 1.0),  # a cosine
        ("analysis.token_dynamics.frozen_fraction", [0.0, 0.0, 0.5], 0.0, 1.0),  # a fraction
        ("analysis.state_norm_last", [0.1, 0.1, 9.0], 0.0, math.inf),  # a norm
        ("gap", [-0.9, 0.9, 0.95], -1.0, 1.0),  # a difference of two accuracies
    ],
)
def test_a_report_clips_each_interval_to_what_its_metric_can_take(metric, values, low, high):
    from looplab.report.aggregate import aggregate

    results = pd.DataFrame({"task.name": "copy", "variant": "v", metric: values})
    row = aggregate(results, ["task.name", "variant"], [metric]).iloc[0]
    raw_low = row["mean"] - T_975_DF2 * row["std"] / math.sqrt(3)
    assert raw_low < low or row["mean"] + T_975_DF2 * row["std"] / math.sqrt(3) > high  # the raw one leaves it
    assert low <= row["ci_lo"] <= row["ci_hi"] <= high
