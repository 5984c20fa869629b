"""A mechanistic analysis in a few readable lines (what ``looplab analyze`` prints)."""

from __future__ import annotations


def _number(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def format_mechanistic(summary: dict) -> str:
    """The headline numbers of an analysis summary.json, one finding per line."""
    first = (
        f"analysed {summary.get('checkpoint') or 'the initialisation'} ({summary.get('steps_trained', 0)} steps "
        f"trained): {summary['samples']} instances of length {summary['length']}, {summary['loops']} loops"
    )
    if summary.get("model"):  # a model dir, read on windows of a text
        first = (
            f"analysed {summary['model']} ({summary['model_type']}, native loops {summary['native_loops']}): "
            f"{summary['samples']} window{'' if summary['samples'] == 1 else 's'} of {summary['length']} tokens of "
            f"{summary['text']}, {summary['loops']} loops"
        )
    lines = [
        first,
        f"fixed points: first layer's cosine to its own final state {_number(summary['fixed_point_self_cos'])} "
        f"(median over samples {_number(summary['fixed_point_self_cos_median'])}); smallest cosine to the other "
        f"layers {_number(summary['fixed_point_cross_cos_min'])}",
        f"state norm per token {_number(summary['state_norm_first'], 1)} at loop 1 → "
        f"{_number(summary['state_norm_last'], 1)} at loop {summary['loops']}; layer update ratio "
        f"{_number(summary['update_ratio_mean'])}",
    ]
    dynamics = summary.get("token_dynamics")
    if dynamics:
        lines.append(
            f"tokens over the last {dynamics['window']} loops (direction of h_t, tolerance {dynamics['tol']:g}): "
            f"{100 * dynamics['fixed_point']:.1f}% at a fixed point, {100 * dynamics['orbit']:.1f}% on an orbit, "
            f"{100 * dynamics['slider']:.1f}% sliding"
        )
    colsum = summary.get("colsum", {})
    lines.append(
        f"attention: change between the last two loops {_number(summary.get('attention_diff_last'), 4)}; "
        f"ColSum concentration {_number(colsum.get('mean'))} (1 = a sink takes all attention); "
        f"largest activation / median {_number(summary.get('massive_ratio_max'), 1)}"
    )
    return "\n".join(lines)


def start_line(kind: str, source: str, checkpoint: str | None, count: int, size: int, loops: int) -> str:
    """What an analysis is about to do: ``analyze KIND: SOURCE at CHECKPOINT: N instance(s) of size n, loops 1..T``."""
    return (
        f"analyze {kind}: {source} at {checkpoint or 'initialisation'}: {count} instance(s) of size {size}, "
        f"loops 1..{loops}"
    )
