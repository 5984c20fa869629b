"""Losses on the answer region."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from looplab.tasks import IGNORE


def per_row_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy averaged over each row's answer positions.

    Args:
        logits: [..., L, V]; labels: [..., L] with IGNORE outside the answer.

    Returns:
        [...] loss per row; every row weighs the same whatever its answer length.
    """
    token_loss = F.cross_entropy(
        logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE, reduction="none"
    ).view(labels.shape)
    return answer_mean(token_loss, labels != IGNORE)


def scored_row_loss(logits_at: Tensor, labels: Tensor) -> Tensor:
    """:func:`per_row_loss` from logits computed at the answer positions only.

    A pretrained model's output head is its costliest matmul, so its readout can be
    asked for the answer positions alone (``readout(h, ctx, at=labels != IGNORE)``).

    Args:
        logits_at: [N, V] at the positions where ``labels`` [B, L] is not IGNORE, in row-major order.

    Returns:
        [B] loss per row (0 for a row without answer positions).
    """
    answer = labels != IGNORE
    token_loss = torch.zeros(labels.shape, dtype=torch.float32, device=labels.device)
    token_loss[answer] = F.cross_entropy(logits_at.float(), labels[answer], reduction="none")
    return answer_mean(token_loss, answer)


def answer_mean(token_loss: Tensor, answer: Tensor) -> Tensor:
    """[...] the mean of ``token_loss`` [..., L] over each row's ``answer`` [..., L] positions (0 where none)."""
    answer = answer.to(token_loss.dtype)
    return (token_loss * answer).sum(-1) / answer.sum(-1).clamp_min(1)


def depth_supervised_loss(logits: Tensor, labels: Tensor, depths: Tensor) -> Tensor:
    """Mean loss over rows of the loss at each row's supervised depth(s).

    Args:
        logits: [B, L, V] (one depth per row) or [B, J, L, V] (several).
        labels: [B, L].
        depths: [B] or [B, J]; slots with depth <= 0 are ignored.
    """
    if logits.dim() == 3:
        return per_row_loss(logits, labels).mean()
    losses = per_row_loss(logits, labels[:, None, :].expand(-1, logits.shape[1], -1))
    used = depths > 0
    # where (not a product) so that whatever sits in an unused slot cannot leak in as NaN
    total = torch.where(used, losses, torch.zeros_like(losses)).sum(1)
    return (total / used.sum(1).clamp_min(1)).mean()
