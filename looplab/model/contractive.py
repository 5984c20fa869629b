"""Contractive input injection (Parcae): the state decays by a diagonal matrix whose spectral radius is below 1.

The loop is read as a discretised linear system plus the core's residual update:

    x_t = Ā h_{t−1} + B̄ e                      what the core's first layer sees
    h_t = core(x_t) = x_t + R(x_t)               (the core's residual sublayers)
    Ā = exp(Δ A),  A = −diag(exp(a)),  B̄ = Δ B,  Δ = diag(exp(δ))

with a, δ ∈ R^d and B ∈ R^{d×d} learned. Every diagonal entry of Ā is
exp(−exp(δ_i + a_i)) ∈ (0, 1), so ρ(Ā) = ‖Ā‖₂ < 1 whatever the weights: the
state's own path through the injection is a contraction by construction, where
``add`` (Ā = I, ρ = 1) is marginal and ``concat`` (Ā = W_I's state block) is
unconstrained. (In floating point an entry rounds to 1 only when exp(δ_i + a_i)
falls below the format's epsilon: 2⁻²³ in float32, 2⁻⁵² in float64.) At the start a = δ = 0 and
B = I: Ā = e⁻¹ I and B̄ = I.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ContractiveInjection(nn.Module):
    """x = Ā h + B̄ e (see the module docstring); parameters ``log_rate`` a [d], ``log_step`` δ [d], ``input`` B."""

    def __init__(self, d_model: int):
        super().__init__()
        self.log_rate = nn.Parameter(torch.zeros(d_model))
        self.log_step = nn.Parameter(torch.zeros(d_model))
        self.input = nn.Linear(d_model, d_model, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """a = δ = 0 and B = I (the model's weight initialisation runs before this)."""
        with torch.no_grad():
            self.log_rate.zero_()
            self.log_step.zero_()
            self.input.weight.copy_(torch.eye(self.input.weight.shape[0], dtype=self.input.weight.dtype))

    def decay(self) -> Tensor:
        """Ā's diagonal [d]: exp(−exp(δ + a)), each in (0, 1)."""
        return torch.exp(-torch.exp(self.log_step + self.log_rate))

    def forward(self, h: Tensor, e: Tensor) -> Tensor:
        """h, e [..., d] → Ā h + B̄ e [..., d]."""
        return self.decay() * h + torch.exp(self.log_step) * self.input(e)
