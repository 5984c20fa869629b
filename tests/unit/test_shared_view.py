"""Training in the shared KV cache's view (looplab/model/shared_view.py): its attention against a per-query
spelling-out, its fixed point against teacher-forced decoding through the ``shared`` cache (float64, every
placement and injection, mixed lengths), the view's loss in a training step and what it learns, and the
configurations it refuses in one line."""

from __future__ import annotations

import math

import pytest
import torch

from looplab.config import load_config
from looplab.errors import LooplabError
from looplab.experiment import Experiment, check_config
from looplab.generation import GenerationExit, score
from looplab.generation.options import DecodeOptions
from looplab.model.attention import attend_earlier
from looplab.model.shared_view import shared_view_at_depths, shared_view_logits, shared_view_pass
from looplab.train.trainer import make_optimizer, train_step
from tests.unit.model_helpers import make_batch, make_model
from tests.unit.test_speculative import STRUCTURES

SEQUENCES = [[3, 5, 6, 2, 1, 4], [3, 4, 1], [1, 6, 6, 2, 5, 5, 3, 2], [2, 1]]


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    tokens = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    return tokens, torch.arange(width)[None, :] < torch.tensor([len(row) for row in rows])[:, None]


def test_attend_earlier_is_each_query_reading_earlier_keys_and_its_own():
    model = make_model(causal=True)
    tokens, valid = make_batch()
    ctx = model.context(valid)
    g = torch.Generator().manual_seed(1)
    q, k, v, k_e, v_e = (torch.randn(5, 2, tokens.shape[1], 8, generator=g, dtype=torch.float64) for _ in range(5))
    got = attend_earlier(q, k, v, k_e, v_e, ctx)
    for row in range(5):
        for i in range(int(valid[row].sum())):
            keys = torch.cat([k_e[row, :, :i], k[row, :, i : i + 1]], dim=1)  # [H, i + 1, Dh]
            values = torch.cat([v_e[row, :, :i], v[row, :, i : i + 1]], dim=1)
            probs = (keys @ q[row, :, i, :, None]).squeeze(-1).div(math.sqrt(8)).softmax(-1)  # [H, i + 1]
            expected = (probs[..., None] * values).sum(1)
            assert torch.allclose(got[row, :, i], expected, atol=1e-12)


@pytest.mark.parametrize("structure", STRUCTURES, ids=lambda s: f"{s['placement']}-{s['injection']}")
def test_iterated_view_is_teacher_forced_decoding_through_the_shared_cache(structure):
    """Pass 2 repeated on its own last-loop keys reaches, after as many passes as positions, the cache's view;
    at one loop the view is the ordinary unroll."""
    model = make_model(causal=True, core_layers=2, prelude_layers=1, **structure).eval()
    tokens, valid = _padded(SEQUENCES)
    loops = 3
    with torch.no_grad():
        h0, e, ctx = model.start(tokens, valid)
        h, last = shared_view_pass(model, h0, e, ctx, loops)
        for _ in range(tokens.shape[1]):
            h, last = shared_view_pass(model, h0, e, ctx, loops, last)
        logprobs = model.readout(h, ctx).log_softmax(-1)
        cached = score(model, SEQUENCES, DecodeOptions(GenerationExit("fixed", loops), "shared"))
        ordinary, at_one = shared_view_logits(model, tokens, valid, 1)
    for row, sequence in enumerate(SEQUENCES):
        ours = [float(logprobs[row, i, token]) for i, token in enumerate(sequence[1:])]
        assert ours == pytest.approx(cached.logprobs[row], abs=1e-9)
    assert torch.allclose(ordinary[valid], at_one[valid], atol=1e-12)


def test_two_passes_differ_from_the_ordinary_unroll_and_rows_keep_their_own_depth():
    model = make_model(causal=True, core_layers=2, injection="add")
    tokens, valid = _padded(SEQUENCES)
    with torch.no_grad():
        ordinary, viewed = shared_view_logits(model, tokens, valid, 4)
    assert torch.allclose(ordinary, model(tokens, valid, 4), atol=1e-12)
    assert float((ordinary - viewed)[valid].abs().max()) > 1e-3
    depths = torch.tensor([4, 2, 4, 1])
    with torch.no_grad():
        mixed = shared_view_at_depths(model, tokens, valid, depths)
    for row, depth in enumerate(depths.tolist()):
        with torch.no_grad():
            alone = shared_view_logits(model, tokens[row : row + 1], valid[row : row + 1], depth)
        for got, expected in zip(mixed, alone, strict=True):
            assert torch.allclose(got[row], expected[0], atol=1e-12)


def _experiment(*overrides: str) -> Experiment:
    settings = ["train.batch_size=8", "run.threads=1", "schedule.name=fixed", "schedule.depth=2", *overrides]
    return Experiment.build(load_config("generation/kjv_trace", settings))


def test_a_training_step_weighs_both_views_and_the_view_learns():
    torch.manual_seed(0)
    exp = _experiment("train.shared_view_weight=0.5", "train.lr=3e-3", "train.warmup_steps=0")
    optimizer = make_optimizer(exp)
    first = train_step(exp, optimizer, 0)
    assert first["loss"] == pytest.approx(0.5 * first["loss_ordinary"] + 0.5 * first["loss_shared_view"], rel=1e-5)
    assert first["block_evals"] == 4  # two unrolls of two loops
    for step in range(1, 40):
        last = train_step(exp, optimizer, step)
    assert last["loss_shared_view"] < first["loss_shared_view"] - 0.5


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["model.causal=false", "task.name=chain_arithmetic"], "model.causal"),
        (["model.recurrence=trm", "model.injection=add"], "model.recurrence"),
        (["train.segment_loops=1"], "segment_loops"),
        (["schedule.name=multi_depth"], "fixed"),
        (["schedule.name=pondernet"], "fixed"),
        (["stability.jsrr.estimator=jvp", "stability.jsrr.weight=0.1"], "stability"),
        (["train.shared_view_weight=1.5"], "shared_view_weight"),
        (["model.init_state=noise", "model.injection=concat"], "model.init_state = 'noise'"),
    ],
)
def test_what_the_view_does_not_cover_is_refused_in_one_line(overrides, named):
    with pytest.raises(LooplabError) as error:
        check_config(load_config("generation/kjv_trace", ["train.shared_view_weight=0.5", *overrides]))
    message = str(error.value)
    assert "\n" not in message and named in message
