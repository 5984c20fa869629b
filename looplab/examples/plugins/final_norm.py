"""An analysis metric plugin: ‖h‖ of every valid token after the last analysed loop."""

from looplab.analysis.registry import MetricResult, register_metric


@register_metric("final_norm")
def final_norm(inputs):
    norms = inputs.loop_states[-1].norm(dim=-1)[inputs.valid]
    return MetricResult(
        summary={"final_norm_mean": float(norms.mean())},
        tables={"final_norm.csv": (["token", "norm"], list(enumerate(norms.tolist())))},
    )
