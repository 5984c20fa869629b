"""A test-time exit plugin: the first loop whose whole answer has probability above a threshold (else the
last), the threshold its own parameter (``[eval.exits.first_confident] threshold``)."""

from dataclasses import dataclass

import numpy as np

from looplab.exits import register_exit
from looplab.params import OPEN_UNIT, param


@dataclass
class FirstConfident:
    threshold: float = param(0.9, OPEN_UNIT, "the whole answer's probability to stop at")


@register_exit("first_confident", FirstConfident)
def first_confident(outcome, params):
    if outcome.confidence is None:
        return None
    sure = outcome.confidence > np.log(params.threshold)
    return np.where(sure.any(axis=1), sure.argmax(axis=1) + 1, outcome.correct.shape[1])
