"""``python -m looplab.harness ARGS``: lm-eval's own command line (``lm_eval ARGS``) with the ``looplab`` model
registered, for a checkout used without installing; a LooplabError is one line on stderr and exit 2."""

from __future__ import annotations

import sys

from looplab.errors import LooplabError
from looplab.harness import register


def main() -> int:
    from lm_eval.__main__ import cli_evaluate

    register()
    try:
        cli_evaluate()
    except LooplabError as error:
        print(f"looplab: error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
