"""CLI start time: ``looplab train --help`` as the CLI runs it, against the same command with the report chain
and every study imported first, as every command did before the studies moved beside the library.

Both are whole processes (the start is what a user waits for), timed interleaved; each ratio is the
eager start over the lazy one, so above 1 means the lazy CLI starts faster.

    python bench/cli_start.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from timing import machine_line, median, print_measure, print_table, print_verdict, time_interleaved

EAGER = "import looplab.studies as s; s.load_studies(); import scipy.stats; from looplab.cli import main; main({argv})"
LAZY = "from looplab.cli import main; main({argv})"
COMMANDS = (["train", "--help"], ["generate", "--help"], ["--help"])


def process(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed starts per path; the median is reported")
    args = parser.parse_args()
    print(machine_line())
    rows, ratios = [], []
    for argv in COMMANDS:
        paths = {
            "lazy": lambda a=argv: process(LAZY.format(argv=a)),
            "eager": lambda a=argv: process(EAGER.format(argv=a)),
        }
        seconds = time_interleaved(paths, args.repeats, warmup=1)
        lazy, eager = median(seconds["lazy"]), median(seconds["eager"])
        ratios.append(eager / lazy)
        rows.append(["looplab " + " ".join(argv), f"{lazy:.2f}", f"{eager:.2f}", f"{eager / lazy:.2f}x"])
    print_table(["command", "lazy start (s)", "with studies and report (s)", "ratio"], rows)
    print_measure("looplab --help start, studies eager / lazy", ratios[2])
    print_measure("looplab generate --help start, studies eager / lazy", ratios[1])
    print_verdict("looplab train --help start, studies eager / lazy", ratios[0], 1.2)


if __name__ == "__main__":
    main()
