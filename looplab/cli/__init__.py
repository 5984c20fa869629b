"""Command line: ``looplab train | eval | config show | analyze | sweep | report | reproduce | results | demo |
retrofit | serve``.

One module per family of commands (``runs``, ``analyze``, ``studies``, ``models``), the parser in ``parser``;
this module dispatches. User mistakes end in one line on stderr and exit code 2 (no traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from looplab.cli.analyze import analyze_command
from looplab.cli.models import export_command, retrofit_command
from looplab.cli.parser import ANALYSES, EXAMPLES, STUDIES, build_parser
from looplab.cli.runs import config_command, demo_command, eval_command, generate_command, pool_command, train_command
from looplab.cli.serve import serve_command
from looplab.cli.studies import report_command, reproduce_command, results_command, sweep_command
from looplab.config import PRESETS
from looplab.errors import LooplabError, one_line
from looplab.plotting import use_figure_preset
from looplab.train.stop import Stopped

__all__ = ["main", "parse", "describe_error", "build_parser", "EXAMPLES", "PRESETS", "STUDIES"]

#: command → its handler (``results`` returns the exit code; the others return None for 0)
COMMANDS = {
    "train": train_command,
    "eval": eval_command,
    "config": config_command,
    "analyze": analyze_command,
    "sweep": sweep_command,
    "report": report_command,
    "reproduce": reproduce_command,
    "results": results_command,
    "generate": generate_command,
    "demo": demo_command,
    "pool": pool_command,
    "retrofit": retrofit_command,
    "export": export_command,
    "serve": serve_command,
}


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; ``looplab analyze [OPTIONS] RUN_DIR`` is the mechanistic analysis."""
    argv = list(argv)
    if len(argv) >= 2 and argv[0] == "analyze" and argv[1] not in ANALYSES and argv[1] not in ("-h", "--help"):
        argv.insert(1, "mechanistic")
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:  # --help, or a usage error already printed as one line
        return stop.code if isinstance(stop.code, int) else 2
    try:
        for option in ("out", "run_dir", "sweep_dir", "config", "sweep_file", "source_dir", "text"):
            if isinstance(getattr(args, option, None), str) and not getattr(args, option).strip():
                raise LooplabError(f"{option.replace('_', ' ')} must not be empty")
        use_figure_preset(getattr(args, "figsize", None) or "screen")
        return COMMANDS[args.command](args) or 0
    except KeyboardInterrupt:
        print("looplab: interrupted", file=sys.stderr)
        return 130
    except Stopped as stop:  # asked to stop (preemption, Ctrl-C): not an error, and resumable
        if os.environ.get("RANK", "0") == "0":
            print(f"looplab: {stop}", file=sys.stderr)
        return stop.exit_code
    except Exception as err:  # the one error boundary: a line, not a traceback
        if os.environ.get("LOOPLAB_DEBUG") == "1":
            raise
        if os.environ.get("RANK", "0") == "0" or not isinstance(err, LooplabError):
            print(f"looplab: error: {describe_error(err)}", file=sys.stderr)  # a check fails alike on every rank
        return err.exit_code if isinstance(err, LooplabError) else 2
    finally:
        use_figure_preset("screen")  # a preset holds for one command, not for what the process does next


def _file_in_the_way(err: OSError) -> Path | None:
    """The regular file that stands where a folder of ``err.filename``'s path had to be (``--out`` under a
    file: the OS says "File exists" or "Not a directory"), or None."""
    if not isinstance(err, (FileExistsError, NotADirectoryError)) or not err.filename:
        return None
    path = Path(err.filename)
    return next((place for place in (path, *path.parents) if place.is_file()), None)


def describe_error(err: Exception) -> str:
    """One line naming the problem: the message of a looplab error, the file and reason of an OS error."""
    import torch

    if isinstance(err, LooplabError):
        return one_line(err, limit=None)  # looplab's own: whole, however long
    message = one_line(err) if str(err).strip() else ""
    if isinstance(err, OSError):
        blocked = _file_in_the_way(err)
        if blocked is not None:
            return f"cannot make {err.filename}: {blocked} is a file, not a folder; choose another path"
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror or message}{where}"
    if isinstance(err, (MemoryError, torch.cuda.OutOfMemoryError)):
        return f"out of memory ({message or type(err).__name__}); use a smaller model, batch or depth"
    if isinstance(err, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({message})"
    return f"{type(err).__name__}: {message} (LOOPLAB_DEBUG=1 shows the traceback)"
