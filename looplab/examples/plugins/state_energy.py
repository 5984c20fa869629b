"""A regulariser plugin: the mean square of each row's probe state, under ``[stability.state_energy]``.

Off until a config sets its ``weight``; ``warmup`` and ``prob`` come with every
regulariser, and ``scale`` is its own key.
"""

from dataclasses import dataclass

from looplab.params import POSITIVE, param
from looplab.regularisers import Regulariser, register_regulariser


@register_regulariser
class StateEnergy(Regulariser):
    name = "state_energy"

    @dataclass
    class Params(Regulariser.Params):
        scale: float = param(1.0, POSITIVE, "the penalty is mean(h²) / scale²")

    def penalty(self, model, probe, generator):
        mask = probe.valid.unsqueeze(-1).to(probe.h.dtype)
        energy = (probe.h.pow(2) * mask).sum(dim=(1, 2)) / (mask.sum(dim=(1, 2)) * probe.h.shape[-1])
        return energy / self.params.scale**2
