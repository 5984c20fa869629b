"""The commands on many runs: ``sweep``, ``report``, ``reproduce`` and ``results``.

The studies (:mod:`looplab.studies`) are imported by ``report``, ``reproduce`` and ``results`` only,
so that every other command starts without the report chain.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from looplab.cli.parser import PAPER_NAMES
from looplab.config import PRESETS, resolve_preset
from looplab.errors import LooplabError


def sweep_command(args) -> None:
    """``looplab sweep FILE --out DIR``: train and evaluate every point of a sweep file."""
    run_sweep_file(args, resolve_preset(args.sweep_file))


def run_sweep_file(args, sweep_file: Path) -> None:
    """Train and evaluate every point of ``sweep_file`` into ``args.out``, as ``args`` ask (workers, backend)."""
    from looplab.sweep import load_sweep, run_sweep

    if args.address and args.backend != "ray":
        raise LooplabError(f"--address names a Ray cluster; it needs --backend ray (got --backend {args.backend})")
    began = time.perf_counter()
    spec = load_sweep(sweep_file)
    frame = run_sweep(
        spec, args.out, args.workers, args.backend, args.address, not args.no_progress, sweep_file.read_text()
    )
    results = Path(args.out) / "results.parquet"
    if frame.attrs.get("ran", 1) == 0:
        print(f"sweep: already done, all {len(frame)} runs finished earlier; results in {results}")
    else:
        print(
            f"sweep: {frame.attrs.get('ran', len(frame))} runs finished in {time.perf_counter() - began:.0f} s "
            f"({len(frame)} in all); results in {results}"
        )
    print(f"next: looplab report {args.out}   (add --paper {'|'.join(PAPER_NAMES)} for the paper's numbers)")


def report_command(args) -> None:
    """``looplab report DIR``: the tables, plots and report.html of a sweep dir."""
    write_sweep_report(args.sweep_dir, args.paper)


def write_sweep_report(sweep_dir: str, paper: str | None) -> None:
    """Write ``sweep_dir``'s report (beside ``paper``'s numbers when given) and print its table."""
    from looplab.report import write_report
    from looplab.studies import load_studies

    load_studies()

    out = write_report(Path(sweep_dir), paper)
    print((out / "table.md").read_text())
    print(f"wrote {out}: table.md, table.tex, table.csv, plots and report.html")


def reproduce_command(args) -> None:
    """``looplab reproduce STUDY --out DIR``: a bundled study's sweep (and its extra part), then its report."""
    from looplab.studies import STUDY_EXTRAS

    extra = STUDY_EXTRAS.get(args.study)
    if extra is not None:  # validated, and the pretrained model found, before anything runs
        from looplab.studies.stars.study import load_study
        from looplab.text.pretrained import require_smollm2

        study = load_study(PRESETS / extra)
        require_smollm2()
    run_sweep_file(args, PRESETS / "sweeps" / f"{args.study}.toml")
    if extra is not None:
        from looplab.studies.stars.study import run_study

        began = time.perf_counter()
        run_study(study, args.out, progress=not args.no_progress)
        print(f"retrofit: finished in {time.perf_counter() - began:.0f} s; results in {Path(args.out) / 'retrofit'}")
    write_sweep_report(args.out, args.study.split("-")[0])


def results_command(args) -> int:
    """``looplab results``: the committed pages from their CSVs; returns the exit code."""
    from looplab.report.pages import regenerate
    from looplab.studies import load_studies

    load_studies()
    if args.collect:
        from looplab.report.pages import collect

        frame = collect(args.study, [Path(d) for d in args.collect], Path(args.dir))
        print(f"results: {len(frame)} rows -> {Path(args.dir) / args.study}")
    changed = regenerate(args.dir, check=args.check)
    if args.check:
        from looplab.report.pages import FROZEN, check_protocols
        from looplab.report.preregistration import check_study

        missing = check_protocols(Path(args.dir))
        for line in missing:
            print(f"results: {line}", file=sys.stderr)
        checks = [check_study(Path(args.dir), study, protocol) for study, protocol in sorted(FROZEN.items())]
        print("results: pre-registration, study by study (docs/methods.md):")
        for check in checks:
            print(f"  {check.line}")
        failed = [check.study for check in checks if check.holds is False]
        if failed:
            print(f"results: pre-registration fails for {', '.join(failed)}", file=sys.stderr)
        if changed:
            print(f"results: out of date: {', '.join(map(str, changed))} (run: looplab results)", file=sys.stderr)
        if changed or missing or failed:
            return 1
    print(f"results: {len(changed)} page(s) {'to rewrite' if args.check else 'rewritten'} in {args.dir}")
    return 0
