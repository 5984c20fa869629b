"""A generation-exit plugin: stop a new token once its likeliest next token leads the runner-up by a margin,
the margin its own parameter (``[generate.exits.top_margin] margin``, ``--exit-param margin=2``)."""

from dataclasses import dataclass

from looplab.params import POSITIVE, param
from looplab.token_exits import register_token_exit


@dataclass
class TopMargin:
    margin: float = param(2.0, POSITIVE, "log p(top) − log p(runner-up), in nats, to stop at")


@register_token_exit("top_margin", reads_logits=True, params=TopMargin)
def top_margin(rule, t, h, h_prev, logp, logp_prev):
    """[R] bool: the rows whose two likeliest next tokens are ``margin`` nats apart or more."""
    top = logp.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1] >= rule.params.margin
