"""Test-time exits (docs/methods.md §4): when to stop looping, for any trained model; their registry
and their own parameters.

Each exit maps the signals of one unroll (``looplab.eval.grid.LengthOutcome``) to a
depth per sample in 1..T:

    policy        the schedule's own rule (c, T(n), or argmax π for learned halting)
    fixed         a constant K                                          [eval.exits.fixed] depth
    confidence    argmax_K of the whole-answer log-probability (Fan et al.)
    convergence   the first K with ‖h_K − h_{K−1}‖ / ‖h_K‖ < ε (T if never)   [eval.exits.convergence] eps
    argmax_pi     argmax_K π^(T)(K | x) of the halting head, when the model has one

The contract of an entry: a function ``(outcome, params) -> depths``, where ``outcome``
is one length's outcome (N samples, T loops), ``params`` the exit's own parameters
(an instance of the ``Params`` dataclass it registers with, read from
``[eval.exits.NAME]``; fields made with :func:`looplab.params.param`), and
``depths`` an [N] int array in 1..T, or None when the signals it needs were not
recorded. Decorate it with ``@register_exit("name", Params)``; the evaluation then
reports its accuracy (ID and OOD) and mean depth under ``exits.name`` in
summary.json and writes its depths to eval/samples.parquet, in registration order.
A ``Params`` may define ``check(max_loops)``, called with the evaluated depth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from looplab.errors import LooplabError, choice_error
from looplab.model.halting import policy_depth
from looplab.params import POSITIVE, as_dict, at_least, fill, param
from looplab.plugins import register_entry

#: the fixed exit's K when its depth is 0 (automatic): min(DEFAULT_FIXED_DEPTH, the evaluated loops);
#: 20 is the stopping paper's training depth T_train
DEFAULT_FIXED_DEPTH = 20

ExitRule = Callable[[Any, Any], "np.ndarray | None"]
EXITS: dict[str, ExitRule] = {}
EXIT_PARAMS: dict[str, type] = {}


@dataclass
class NoParams:
    """The parameters of an exit that has none."""


def register_exit(name: str, params: type = NoParams) -> Callable[[ExitRule], ExitRule]:
    """Function decorator: report the exit under ``name``; its ``[eval.exits.NAME]`` table is read into
    ``params`` (a dataclass of :func:`looplab.params.param` fields)."""

    def register(rule: ExitRule) -> ExitRule:
        register_entry(EXITS, name, rule, "exit")
        EXIT_PARAMS[name] = params
        return rule

    return register


def exit_params(tables: dict[str, dict[str, Any]], max_loops: int | None = None) -> dict[str, Any]:
    """Every registered exit's checked parameters from the ``[eval.exits]`` tables (defaults where a table
    or key is missing); with ``max_loops``, each is also checked against the depth evaluated."""
    for name, table in tables.items():
        if name not in EXITS:
            raise choice_error("exit [eval.exits.NAME], NAME =", name, EXITS)
        if not isinstance(table, dict):
            raise LooplabError(f"config section [eval.exits.{name}] must be a table, got {table!r}")
    found = {name: fill(EXIT_PARAMS.get(name, NoParams), tables.get(name, {}), f"eval.exits.{name}") for name in EXITS}
    if max_loops is not None:
        for params in found.values():
            if hasattr(params, "check"):
                params.check(max_loops)
    return found


def fixed_depth(eval_config) -> int:
    """The K of a run's ``fixed`` exit at its own ``eval.max_loops`` (where generation and decoding read it)."""
    return exit_params(eval_config.exits)["fixed"].resolved(eval_config.max_loops)


def complete_exits(tables: dict[str, dict[str, Any]], max_loops: int) -> dict[str, dict[str, Any]]:
    """The table of every registered exit that has parameters, checked and completed with its defaults, in
    registration order."""
    return {name: as_dict(params) for name, params in exit_params(tables, max_loops).items() if fields(params)}


def exit_depths(outcome, params: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Depths [N] (1-based) chosen by every registered exit available for this outcome, each exit with its
    own parameters (``params``: exit name → parameters, :func:`looplab.exits.exit_params`; default: every
    exit's defaults)."""
    params = params if params is not None else exit_params({})
    found = {name: rule(outcome, params[name]) for name, rule in EXITS.items()}
    return {name: depths for name, depths in found.items() if depths is not None}


@register_exit("policy")
def policy_exit(outcome, params):
    return outcome.policy_depth


@dataclass
class FixedExit:
    depth: int = param(0, at_least(0), f"K; 0: min({DEFAULT_FIXED_DEPTH}, eval.max_loops)")

    def resolved(self, max_loops: int) -> int:
        """K, with 0 read as min(DEFAULT_FIXED_DEPTH, ``max_loops``)."""
        return self.depth or min(DEFAULT_FIXED_DEPTH, max_loops)

    def check(self, max_loops: int) -> None:
        if self.depth > max_loops:
            raise LooplabError(
                f"eval.exits.fixed.depth ({self.depth}) must be <= eval.max_loops ({max_loops}): it is read from "
                f"the unroll (0 = min({DEFAULT_FIXED_DEPTH}, max_loops))"
            )


@register_exit("fixed", FixedExit)
def fixed_exit(outcome, params):
    loops = outcome.correct.shape[1]
    return np.full(len(outcome.correct), min(params.resolved(loops), loops))


@register_exit("confidence")
def confidence_exit(outcome, params):
    return None if outcome.confidence is None else outcome.confidence.argmax(axis=1) + 1


@dataclass
class ConvergenceExit:
    eps: float = param(1e-3, POSITIVE, "ε: stop at the first K with ‖h_K − h_{K−1}‖ / ‖h_K‖ < ε")


@register_exit("convergence", ConvergenceExit)
def convergence_exit(outcome, params):
    if outcome.step_ratio is None:
        return None
    converged = outcome.step_ratio < params.eps  # NaN (diverged) compares False: never converged
    return np.where(converged.any(axis=1), converged.argmax(axis=1) + 1, outcome.correct.shape[1])


@register_exit("argmax_pi")
def argmax_pi_exit(outcome, params):
    if outcome.hazard_logits is None:
        return None
    return policy_depth(torch.from_numpy(outcome.hazard_logits)).numpy()
