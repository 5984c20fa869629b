"""Causal models need the start token: without it, positions with equal prefixes hold equal states."""

from __future__ import annotations

import pytest
import torch

from looplab.config import load_config
from looplab.model import LoopedTransformer
from looplab.tasks import START, make_task


@pytest.mark.parametrize("positional", ["rope", "nope"])
def test_start_token_separates_equal_causal_prefixes(positional):
    config = load_config(
        None,
        [
            "model.causal=true",
            f"model.positional={positional}",
            "model.d_model=32",
            "model.n_heads=2",
            "model.core_layers=2",
        ],
    )
    task = make_task("binary_addition")
    torch.manual_seed(0)
    model = LoopedTransformer(config.model, task.vocab_size).eval()
    pair, end = task.token_id["11"], task.token_id["<end>"]
    body = torch.tensor([[pair, pair, task.token_id["01"], end]])  # a = b = 11.. : positions 0 and 1 alike
    with_start = torch.cat([torch.tensor([[START]]), body], 1)
    with torch.no_grad():
        *_, (h_bare, _) = model.unroll(body, torch.ones_like(body, dtype=torch.bool), 5)
        *_, (h_start, _) = model.unroll(with_start, torch.ones_like(with_start, dtype=torch.bool), 5)
    # Without a start token the first two positions see the same keys and values: identical states.
    assert torch.allclose(h_bare[0, 0], h_bare[0, 1], atol=1e-5)
    # With it, the same two inputs (now positions 1 and 2) are told apart.
    assert (h_start[0, 1] - h_start[0, 2]).norm() > 1e-2 * h_start[0, 1].norm()


def test_sampled_batches_start_with_the_start_token():
    batch = make_task("binary_addition").sample(5, 8, torch.Generator().manual_seed(0))
    assert (batch.tokens[:, 0] == START).all()
