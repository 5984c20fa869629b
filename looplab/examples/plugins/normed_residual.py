"""A norm-placement plugin: the residual stream itself is normalised before the sublayer, N₁(x) + f(N₁(x)).

Written once in x, f and the norms; the loop's Jacobian (JSRR, spectral radius)
follows from the same function (``looplab.model.placements``).
"""

from looplab.model.placements import register_placement


@register_placement("normed_residual", norm_in=True, norm_out=False)
def normed_residual(x, f, norm_in, norm_out):
    y = norm_in(x)
    return y + f(y)
