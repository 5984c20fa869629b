"""Generation exits (docs/methods.md §9): after each loop, whether a new token's next-token distribution is
final; their registry and their own parameters.

Each exit sees, for the rows still running, the new token's state after loop t
and the one before (h_t, h_{t−1}: [R, d]) and the next-token log-probabilities
(log p_t, log p_{t−1}: [R, V]; only computed when the exit reads them), and
returns [R] bool: stop here. Loop ``cap`` always stops.

    fixed        t = loops
    convergence  ‖h_t − h_{t−1}‖ / ‖h_t‖ < eps                      (t ≥ 2)   [generate.exits.convergence] eps
    kl           KL(p_t ‖ p_{t−1}) < eps: the distribution settled   (t ≥ 2)   [generate.exits.kl] eps, direction
                 (``direction = "reverse"``: KL(p_{t−1} ‖ p_t), Huginn's)
    confidence   max p_t ≥ threshold                                          [generate.exits.confidence] threshold
    halting      the run's own halting head says halt on the token's state (its logit > 0,
                 at the loops where its schedule decides: every segment's end for act_bce
                 and q_halt, every loop for rl_halting and pondernet)
    gate         C_t ≥ threshold: a learned exit gate's cumulative exit               [generate.exits.gate] threshold
                 probability (Ouro's: λ_t = σ(gate(h_t)), C_t = Σ_{j≤t} λ_j ∏_{i<j}(1 − λ_i); the
                 model's gated decoding view carries C_t in its state)
    latent-diff  ‖h_t − h_{t−1}‖ / ‖h_t‖ < eps (Huginn's, eps 0.03)      (t ≥ 2)   [generate.exits.latent-diff] eps
    cosine       1 − cos(h_t, h_{t−1}) < eps (Huginn's, eps 1e-3)        (t ≥ 2)   [generate.exits.cosine] eps
    entropy-diff |H(p_t) − H(p_{t−1})| < eps (Huginn's, eps 1e-3)         (t ≥ 2)   [generate.exits.entropy-diff] eps
    minp-kl      KL(q_{t−1} ‖ q_t) < eps, q: p with the probabilities     (t ≥ 2)   [generate.exits.minp-kl] eps
                 below 0.1 · max p set to 1/V, renormalised (Huginn's, eps 1e-5)
    argmax-stability  argmax p_t has stood unchanged for ``steps`` checks    [generate.exits.argmax-stability]
                 (Huginn's, 5): the one exit that carries state across a token's checks     steps

The contract of an entry: a function ``(rule, t, h, h_prev, logp, logp_prev) -> [R] bool``, where ``rule``
is the :class:`GenerationExit` being run (its ``params``, an instance of the ``Params`` dataclass the exit
registers with, read from ``[generate.exits.NAME]`` and ``looplab generate --exit-param KEY=VALUE``;
fields made with :func:`looplab.params.param`; and ``halts``, the run's halting head). Decorate it with
``@register_token_exit(name, reads_logits=..., first_loop=..., params=Params)`` in a plugin module. An
entry also says whether a token may stop before the cap (``adaptive``; only ``fixed`` never does),
whether it reads the run's halting head (``needs_head``) or a learned exit gate (``needs_gate``), and
whether its test reads the loop number t (``reads_loop``, the safe default: depth-wise batching, whose
rows are at different loops, then tests each loop's rows apart; an entry that ignores t is tested once
for all rows past its first loop).

**State across checks.** An exit whose decision at loop t reads more than loops t and t − 1 (Huginn's
``argmax-stability`` counts the loops its argmax has stood) registers ``carries``: ``(rows, device) ->``
the state it starts each token with, a tensor [R, ...]. Its test then takes that state of its rows as a
last argument and returns ``(stop, state)``; every decoder keeps each token's state from its first check
to its exit and gives each row its own (:meth:`GenerationExit.check`, :class:`Carried`). An exit without
``carries`` holds no state and returns its decisions alone.

This registry sits below :mod:`looplab.experiment`, so a config's ``[generate.exits]`` tables are checked
with the rest of it; :mod:`looplab.generation` decodes with the exits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, get_type_hints

import torch
from torch import Tensor

from looplab.errors import LooplabError, choice_error
from looplab.exits import NoParams
from looplab.params import POSITIVE, Domain, as_dict, at_least, check_domains, fill, one_of, param
from looplab.plugins import register_entry, run_entry

__all__ = [
    "Carried",
    "EXITS",
    "MAX_LOOPS",
    "TokenExit",
    "GenerationExit",
    "register_token_exit",
    "token_exit_params",
    "check_token_exits",
    "exit_param_names",
]

#: the deepest a generated token may run (a fixed depth or an adaptive exit's cap): a token costs up to
#: loops × core layers block evaluations, so 10⁷ loops would run for days; 16× the presets' deepest eval.max_loops
MAX_LOOPS = 4096


@dataclass(frozen=True)
class TokenExit:
    """A registered generation exit: whether it reads the logits, the first loop it may stop at, its test,
    whether a token may stop before the cap, whether the test reads the run's halting head, and the
    dataclass of its own parameters."""

    name: str
    reads_logits: bool
    first_loop: int
    stops: Callable[..., Tensor]
    adaptive: bool = True
    needs_head: bool = False
    params: type = NoParams
    reads_loop: bool = True
    needs_gate: bool = False
    carries: Callable[[int, Any], Tensor] | None = None

    @property
    def origin(self) -> str:
        return f"{self.stops.__module__}.{self.stops.__qualname__}"


EXITS: dict[str, TokenExit] = {}


def register_token_exit(
    name: str,
    reads_logits: bool,
    first_loop: int = 1,
    adaptive: bool = True,
    needs_head: bool = False,
    params: type = NoParams,
    reads_loop: bool = True,
    needs_gate: bool = False,
    carries: Callable[[int, Any], Tensor] | None = None,
):
    """Function decorator: make ``stops`` available as the generation exit ``name``; its
    ``[generate.exits.NAME]`` table is read into ``params`` (a dataclass of :func:`looplab.params.param` fields);
    ``carries``: the state it starts a token with, where it carries one across checks (module docstring)."""

    def register(stops):
        entry = TokenExit(
            name, reads_logits, first_loop, stops, adaptive, needs_head, params, reads_loop, needs_gate, carries
        )
        register_entry(EXITS, name, entry, "generation exit")
        return stops

    return register


def _entry(name: str) -> TokenExit:
    if name not in EXITS:
        raise choice_error("generation exit", name, EXITS)
    return EXITS[name]


def exit_param_names(name: str) -> tuple[str, ...]:
    """The parameters the generation exit ``name`` declares (a one-line error for an unknown exit)."""
    return tuple(get_type_hints(_entry(name).params))


def token_exit_params(name: str, tables: dict[str, dict[str, Any]] | None = None, **overrides: Any) -> Any:
    """The checked parameters of the generation exit ``name``: its ``[generate.exits.NAME]`` table from
    ``tables`` (a run's ``config.generate.exits``), then ``overrides`` (``--exit-param KEY=VALUE``), each key
    declared by the exit, typed and in its domain."""
    declared = _entry(name).params
    values = {**(tables or {}).get(name, {}), **overrides}
    where = f"generate.exits.{name}"
    keys = get_type_hints(declared)
    for key in values:
        if key not in keys:
            raise choice_error(f"key in [{where}]", key, keys or ["(none: it has no parameters)"])
    return fill(declared, values, where)


def check_token_exits(tables: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ``[generate.exits]`` tables checked (an unknown exit, an undeclared key, a value of the wrong type
    or outside its domain is a one-line error) and typed, holding the keys they set.

    Unlike ``[eval.exits]`` they are not completed with the defaults: the run never reads them (``looplab
    generate`` does, when it runs), so a run dir or sweep point written before they existed is unchanged.
    """
    for name, table in tables.items():
        if name not in EXITS:
            raise choice_error("generation exit [generate.exits.NAME], NAME =", name, EXITS)
        if not isinstance(table, dict):
            raise LooplabError(f"config section [generate.exits.{name}] must be a table, got {table!r}")
    checked = {name: as_dict(token_exit_params(name, tables)) for name in tables}
    return {name: {key: checked[name][key] for key in table} for name, table in tables.items()}


@dataclass(frozen=True)
class GenerationExit:
    """The exit a generation runs: its ``name`` (a key of :data:`EXITS`), the loop cap and its parameters.

    ``params``: the exit's ``Params`` instance, or a dict of its keys (the rest at their defaults; checked
    as ``[generate.exits.NAME]`` is), or None for every default. ``halts`` (the ``halting`` exit's):
    ``(h [R, d], t) -> [R] bool``, the run's halting head's decision on each token's state after loop t
    (:func:`looplab.generation.byte_text.head_halts`).
    """

    name: str = "fixed"
    loops: int = 4  # the fixed depth, or the cap of an adaptive exit
    params: Any = None
    halts: Callable[[Tensor, int], Tensor] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        entry = _entry(self.name)
        if isinstance(self.loops, bool) or not isinstance(self.loops, Integral) or not 1 <= self.loops <= MAX_LOOPS:
            raise LooplabError(
                f"loops (the fixed exit's depth, an adaptive exit's cap) must be in 1..{MAX_LOOPS}, got {self.loops}"
            )
        if self.params is None or isinstance(self.params, dict):
            object.__setattr__(self, "params", token_exit_params(self.name, {self.name: self.params or {}}))
        elif isinstance(self.params, entry.params):
            check_domains(self.params, f"generate.exits.{self.name}")
        else:
            raise LooplabError(
                f"the {self.name} exit's params must be a dict or {entry.params.__name__}, "
                f"got {type(self.params).__name__}"
            )

    def __hash__(self) -> int:  # a Params dataclass is mutable, so hash what it holds
        return hash((self.name, self.loops, repr(self.params)))

    @property
    def reads_logits(self) -> bool:
        return EXITS[self.name].reads_logits

    @property
    def adaptive(self) -> bool:
        """Whether a token may stop before the cap (every exit but ``fixed``)."""
        return EXITS[self.name].adaptive

    @property
    def needs_head(self) -> bool:
        """Whether the exit reads the run's halting head (``halts``)."""
        return EXITS[self.name].needs_head

    @property
    def needs_gate(self) -> bool:
        """Whether the exit reads a learned exit gate's decision off the token's state (a gated decoding view)."""
        return EXITS[self.name].needs_gate

    @property
    def carries(self) -> bool:
        """Whether the exit carries state across a token's checks."""
        return EXITS[self.name].carries is not None

    def start(self, rows: int, device) -> Tensor | None:
        """The state each of ``rows`` new tokens starts with ([R, ...]; None for an exit that carries none)."""
        carries = EXITS[self.name].carries
        return None if carries is None else carries(rows, device)

    def check(
        self, t: int, h: Tensor, h_prev: Tensor, logp: Tensor | None, logp_prev: Tensor | None, carried=None
    ) -> tuple[Tensor, Tensor | None]:
        """([R] bool: the rows whose token stops after loop t, the state they carry on); ``carried``: the rows'
        state (:meth:`start`, then what the last check returned; None for an exit that carries none)."""
        rows = h.shape[0]
        if t >= self.loops:
            return torch.ones(rows, dtype=torch.bool, device=h.device), carried
        entry = EXITS[self.name]
        if t < entry.first_loop:
            return torch.zeros(rows, dtype=torch.bool, device=h.device), carried
        return self._stops(entry, t, h, h_prev, logp, logp_prev, carried)

    def _stops(self, entry: TokenExit, t: int, h: Tensor, h_prev: Tensor, logp, logp_prev, carried):
        """The entry's test, its answer checked at the boundary: a bool tensor [R] for the R rows of ``h`` (and the
        state they carry on, [R, ...], from an exit that carries one)."""
        args = (self, t, h, h_prev, logp, logp_prev) + ((carried,) if entry.carries is not None else ())
        answer = run_entry("generation exit", self.name, entry, entry.stops, *args)
        if entry.carries is None:
            stop = answer
        elif isinstance(answer, tuple) and len(answer) == 2:
            before, (stop, carried) = carried, answer
            if (
                not isinstance(carried, Tensor)
                or carried.shape[1:] != before.shape[1:]
                or carried.dtype != before.dtype
            ):
                shape = f"{carried.dtype} {list(carried.shape)}" if isinstance(carried, Tensor) else repr(carried)[:40]
                raise LooplabError(
                    f"generation exit {self.name!r} ({entry.origin}) carries state but returned {shape} as it; its "
                    f"state stays {before.dtype} [R, {', '.join(map(str, before.shape[1:]))}] (what it starts with)"
                )
        else:
            raise LooplabError(
                f"generation exit {self.name!r} ({entry.origin}) carries state but returned {type(answer).__name__}; "
                "an exit that carries state returns (stop, state)"
            )
        rows = h.shape[0]
        if not isinstance(stop, Tensor) or stop.dtype != torch.bool or tuple(stop.shape) != (rows,):
            got = f"a {stop.dtype} tensor of shape {list(stop.shape)}" if isinstance(stop, Tensor) else repr(stop)
            raise LooplabError(
                f"generation exit {self.name!r} ({entry.origin}) returned {got[:80]}; an exit returns a bool "
                f"tensor of shape [{rows}], one decision per row"
                + (", and the state its rows carry on" if entry.carries is not None else "")
            )
        if entry.carries is not None and carried.shape[0] != rows:
            raise LooplabError(
                f"generation exit {self.name!r} ({entry.origin}) returned a state of {carried.shape[0]} rows for "
                f"{rows}; an exit that carries state returns one per row"
            )
        return stop, carried

    def check_rows(
        self, loops: Tensor, h: Tensor, h_prev: Tensor, logp: Tensor | None, logp_prev: Tensor | None, carried=None
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`check` for rows each after its own loop ``loops`` [R] (depth-wise batching); ``logp_prev`` is
        read only for rows past loop 1. One test per loop present when the exit reads t."""
        entry = EXITS[self.name]
        stop = loops >= self.loops
        tested = (loops >= entry.first_loop) & ~stop
        if not bool(tested.any()):
            return stop, carried
        if entry.reads_loop:
            groups = [(t, tested & (loops == t)) for t in loops[tested].unique().tolist()]
        else:  # one test past loop 1 (the t it is given is not read), loop 1 apart: it has no earlier logp
            groups = [(1, tested & (loops == 1)), (2, tested & (loops > 1))]
        carried = None if carried is None else carried.clone()
        for t, at in groups:
            rows = at.nonzero(as_tuple=True)[0]
            if not len(rows):
                continue
            earlier = None if logp_prev is None or t == 1 else logp_prev[rows]
            now = None if logp is None else logp[rows]
            mine = None if carried is None else carried[rows]
            stop[rows], mine = self._stops(entry, t, h[rows], h_prev[rows], now, earlier, mine)
            if carried is not None:
                carried[rows] = mine
        return stop, carried


class Carried:
    """The state each token in flight carries for its exit across its checks: for each exit that carries one
    (several in a batch whose rows hold exits of their own), a tensor [N, ...] over the N places a decoder
    keeps tokens in (its rows, or its rows × positions in flight)."""

    def __init__(self, places: int, device):
        self.places, self.device = places, device
        self.states: dict[GenerationExit, Tensor] = {}

    def of(self, rule: GenerationExit, at: Tensor) -> Tensor | None:
        """The state of the tokens at places ``at`` [R] under ``rule`` (None for an exit that carries none)."""
        if not rule.carries:
            return None
        if rule not in self.states:
            self.states[rule] = rule.start(self.places, self.device)
        return self.states[rule][at]

    def put(self, rule: GenerationExit, at: Tensor, state: Tensor | None) -> None:
        """Keep ``state`` [R, ...] as the state of the tokens at places ``at``."""
        if state is not None:
            self.states[rule][at] = state

    def restart(self, at: Tensor) -> None:
        """New tokens at places ``at``: each exit's state there back to its start."""
        for rule, states in self.states.items():
            states[at] = rule.start(len(at), self.device)


@register_token_exit("fixed", reads_logits=False, adaptive=False, reads_loop=False)
def _fixed(rule, t, h, h_prev, logp, logp_prev):
    return torch.zeros(h.shape[0], dtype=torch.bool, device=h.device)  # only the cap stops it


@dataclass
class ConvergenceParams:
    eps: float = param(1e-3, POSITIVE, "stop once ‖h_t − h_{t−1}‖ / ‖h_t‖ < eps")


@register_token_exit("convergence", reads_logits=False, first_loop=2, params=ConvergenceParams, reads_loop=False)
def _convergence(rule, t, h, h_prev, logp, logp_prev):
    return (h - h_prev).norm(dim=-1) < rule.params.eps * h.norm(dim=-1)


@dataclass
class KLParams:
    eps: float = param(1e-3, POSITIVE, "stop once the KL of the direction below < eps nats")
    direction: str = param(
        "forward", one_of("forward", "reverse"), "forward: KL(p_t ‖ p_{t−1}); reverse: KL(p_{t−1} ‖ p_t) (Huginn's kl)"
    )


@register_token_exit("kl", reads_logits=True, first_loop=2, params=KLParams, reads_loop=False)
def _kl(rule, t, h, h_prev, logp, logp_prev):
    p, q = (logp, logp_prev) if rule.params.direction == "forward" else (logp_prev, logp)
    return (p.exp() * (p - q)).sum(-1) < rule.params.eps  # KL(p ‖ q)


@dataclass
class ConfidenceParams:
    threshold: float = param(0.9, Domain(0.0, 1.0, low_open=True), "stop once max p_t >= threshold")


@register_token_exit("confidence", reads_logits=True, params=ConfidenceParams, reads_loop=False)
def _confidence(rule, t, h, h_prev, logp, logp_prev):
    return logp.max(dim=-1).values.exp() >= rule.params.threshold


@register_token_exit("halting", reads_logits=False, needs_head=True)
def _halting(rule, t, h, h_prev, logp, logp_prev):
    if rule.halts is None:
        raise LooplabError("the halting exit needs the run's halting head (a run trained with a halting schedule)")
    return rule.halts(h, t)


@dataclass
class GateParams:
    threshold: float = param(
        1.0,
        Domain(0.0, 1.0, low_open=True),
        "stop once the cumulative exit probability reaches threshold (Ouro's "
        "early_exit_threshold; a model dir's config gives the default)",
    )


@register_token_exit("gate", reads_logits=False, params=GateParams, reads_loop=False, needs_gate=True)
def _gate(rule, t, h, h_prev, logp, logp_prev):
    return h[:, -1] >= rule.params.threshold  # the gated view's last channel: C_t


@dataclass
class LatentDiffParams:
    eps: float = param(0.03, POSITIVE, "stop once ‖h_t − h_{t−1}‖ / ‖h_t‖ < eps (Huginn's latent-diff)")


@register_token_exit("latent-diff", reads_logits=False, first_loop=2, params=LatentDiffParams, reads_loop=False)
def _latent_diff(rule, t, h, h_prev, logp, logp_prev):
    return (h - h_prev).norm(dim=-1) < rule.params.eps * h.norm(dim=-1)


@dataclass
class CosineParams:
    eps: float = param(1e-3, POSITIVE, "stop once 1 − cos(h_t, h_{t−1}) < eps (Huginn's cosine)")


@register_token_exit("cosine", reads_logits=False, first_loop=2, params=CosineParams, reads_loop=False)
def _cosine(rule, t, h, h_prev, logp, logp_prev):
    return 1 - torch.nn.functional.cosine_similarity(h, h_prev, dim=-1, eps=0.0) < rule.params.eps


@dataclass
class EntropyDiffParams:
    eps: float = param(1e-3, POSITIVE, "stop once |H(p_t) − H(p_{t−1})| < eps nats (Huginn's entropy-diff)")


def _entropy(logp: Tensor) -> Tensor:
    return -(logp.exp() * logp).sum(-1)


@register_token_exit("entropy-diff", reads_logits=True, first_loop=2, params=EntropyDiffParams, reads_loop=False)
def _entropy_diff(rule, t, h, h_prev, logp, logp_prev):
    return (_entropy(logp) - _entropy(logp_prev)).abs() < rule.params.eps


@dataclass
class MinpKLParams:
    eps: float = param(1e-5, POSITIVE, "stop once the min-p filtered KL(q_{t−1} ‖ q_t) < eps (Huginn's minp-kl)")


def _minp(logp: Tensor) -> Tensor:
    """log q: the probabilities below 0.1 · max p set to 1/V, renormalised (Huginn's min-p filter)."""
    p = logp.exp()
    q = torch.where(p < 0.1 * p.max(dim=-1, keepdim=True).values, 1.0 / p.shape[-1], p)
    return (q / q.sum(dim=-1, keepdim=True)).log()


@register_token_exit("minp-kl", reads_logits=True, first_loop=2, params=MinpKLParams, reads_loop=False)
def _minp_kl(rule, t, h, h_prev, logp, logp_prev):
    now, before = _minp(logp), _minp(logp_prev)
    return (before.exp() * (before - now)).sum(-1) < rule.params.eps


@dataclass
class ArgmaxStabilityParams:
    steps: int = param(5, at_least(1), "stop once argmax p_t has stood unchanged for steps checks (Huginn's, 5)")


def _argmax_start(rows: int, device) -> Tensor:
    """[R, 2] long: no argmax seen yet (−1), stood for 0 checks."""
    return torch.tensor([-1, 0], device=device).repeat(rows, 1)


@register_token_exit(
    "argmax-stability", reads_logits=True, params=ArgmaxStabilityParams, reads_loop=False, carries=_argmax_start
)
def _argmax_stability(rule, t, h, h_prev, logp, logp_prev, carried):
    """Huginn's: count the checks in a row whose argmax equals the one before (the first check has none before)."""
    argmax = logp.argmax(-1)
    stood = torch.where(argmax == carried[:, 0], carried[:, 1] + 1, 0)
    return stood >= rule.params.steps, torch.stack([argmax, stood], dim=-1)
