"""Run every benchmark in turn and print all their ratios in one table (``make bench``).

Each benchmark runs as its own process (its output is shown as it goes) and
ends with one or more ``RATIO <label>: <value> (goal ...) -> goal MET`` lines;
the table at the end collects them. Exit status 0 whether or not goals are met:
a benchmark reports, it does not gate.

    python bench/all.py [--only step jsrr ...]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from timing import machine_line, print_table

BENCHMARKS = (
    "step",
    "attention",
    "observe",
    "analysis",
    "generate",
    "jsrr",
    "throughput",
    "compaction",
    "eval_grid",
    "halting",
    "halting_inference",
    "stabilisers",
    "cli_start",
    "model_dirs",
    "published_shapes",
    "speculative",
    "depthwise",
    "row_selection",
    "wavefront",
    "serve",
    "serve_published",
)
_RATIO = re.compile(r"^RATIO (?P<label>.+?): (?P<value>\S+) \((?P<goal>[^)]*)\)(?: -> goal (?P<verdict>.+))?$")


def run(name: str) -> list[list[str]]:
    """Run ``bench/<name>.py``, echo its output, and return its ratio rows."""
    script = Path(__file__).with_name(f"{name}.py")
    print(f"==== {name}", flush=True)
    process = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    print(process.stdout, end="")
    if process.returncode != 0:
        print(process.stderr, end="", file=sys.stderr)
        return [[name, "(failed)", "–", "–", f"exit {process.returncode}"]]
    rows = []
    for line in process.stdout.splitlines():
        found = _RATIO.match(line.strip())
        if found:
            rows.append([name, found["label"], found["value"], found["goal"], found["verdict"] or "–"])
    return rows or [[name, "(no RATIO line)", "–", "–", "–"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, help="run these benchmarks only")
    args = parser.parse_args()
    print(machine_line(), flush=True)
    rows = [row for name in (args.only or BENCHMARKS) for row in run(name)]
    print("==== every ratio")
    print(machine_line())
    print_table(["benchmark", "ratio", "value", "goal", "verdict"], rows)


if __name__ == "__main__":
    main()
