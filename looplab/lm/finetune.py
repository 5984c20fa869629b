"""A short next-token fine-tune of a retrofitted loop (``retrofit.py``)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from looplab.errors import LooplabError
from looplab.lm.retrofit import RetrofittedLoop


def next_token_loss(logits: Tensor, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Mean cross-entropy of predicting token i+1 from position i over valid targets."""
    targets = input_ids[:, 1:]
    if attention_mask is not None:
        targets = targets.masked_fill(~attention_mask[:, 1:].bool(), -100)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def _as_batch(batch) -> tuple[Tensor, Tensor | None]:
    if isinstance(batch, Tensor):
        return batch, None
    if isinstance(batch, dict):
        return batch["input_ids"], batch.get("attention_mask")
    ids, mask = batch
    return ids, mask


def fine_tune(
    loop_model: RetrofittedLoop,
    batches: Iterable,
    steps: int,
    lr: float = 1e-4,
    loops: int = 4,
    *,
    weight_decay: float = 0.0,
    clip: float = 1.0,
    trainable: Iterable[nn.Parameter] | None = None,
) -> list[float]:
    """Short next-token fine-tune with AdamW at ``loops`` loops; returns the loss of every step.

    ``batches`` yields input_ids [B, T], (input_ids, attention_mask) pairs or tokenizer
    dicts; it is cycled when shorter than ``steps``. All parameters are trained unless
    ``trainable`` names a subset (e.g. only the injection and the core). Gradients are
    clipped to norm ``clip``. The model is left in eval mode.
    """
    params = [p for p in (loop_model.parameters() if trainable is None else trainable) if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    cached = list(batches)
    if not cached:
        raise LooplabError("fine_tune needs at least one batch")
    device = next(loop_model.parameters()).device
    losses: list[float] = []
    loop_model.train()
    try:
        for step in range(steps):
            ids, mask = _as_batch(cached[step % len(cached)])
            ids = ids.to(device)
            mask = None if mask is None else mask.to(device)
            loss = next_token_loss(loop_model(ids, mask, loops), ids, mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:
        loop_model.eval()
    return losses
