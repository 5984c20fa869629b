"""Per-token exits for generation: the family lives in :mod:`looplab.token_exits` (below
:mod:`looplab.experiment`, so a config's ``[generate.exits]`` tables are checked with the rest of it);
this module is where the decoder and earlier plugins import it from."""

from looplab.token_exits import (
    EXITS,
    MAX_LOOPS,
    GenerationExit,
    TokenExit,
    check_token_exits,
    exit_param_names,
    register_token_exit,
    token_exit_params,
)

__all__ = [
    "EXITS",
    "MAX_LOOPS",
    "GenerationExit",
    "TokenExit",
    "check_token_exits",
    "exit_param_names",
    "register_token_exit",
    "token_exit_params",
]
