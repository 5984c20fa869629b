"""Training-depth schedules (docs/methods.md §3) and the answer-region losses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from looplab.config import ScheduleConfig
from looplab.errors import LooplabError
from looplab.schedules import SCHEDULES, ScheduleContext, make_schedule
from looplab.schedules.objectives import depth_supervised_loss, per_row_loss, scored_row_loss
from looplab.tasks import IGNORE, make_task

COPY = make_task("copy")  # T(n) = n
ADD = make_task("binary_addition")  # T(n) = n + 1


def sched(name, task=COPY, depth=6, window=2, t_max=10):
    return make_schedule(ScheduleConfig(name=name, depth=depth, window=window, t_max=t_max), ScheduleContext(task, 16))


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


LENGTHS = torch.tensor([1, 2, 5, 9, 10, 12, 3, 20])


def test_registry_holds_the_spec_schedules():
    assert {"fixed", "matched", "window", "fixed_window", "multi_depth"} <= set(SCHEDULES)


def test_make_schedule_unknown_name():
    with pytest.raises(LooplabError) as err:
        make_schedule(ScheduleConfig(name="wobble"), ScheduleContext(COPY, 16))
    message = str(err.value)
    assert "wobble" in message
    for name in ("fixed", "matched", "window", "fixed_window", "multi_depth"):
        assert name in message


# ----------------------------------------------------------------------------- fixed / matched


def test_fixed():
    s = sched("fixed", depth=7, t_max=10)
    d = s.train_depths(LENGTHS, gen())
    assert d.shape == LENGTHS.shape and d.dtype == torch.long
    assert (d == 7).all()
    assert (s.policy_depth(LENGTHS) == 7).all()


@pytest.mark.parametrize("task, offset", [(COPY, 0), (ADD, 1)])
def test_matched(task, offset):
    s = sched("matched", task=task)
    d = s.train_depths(LENGTHS, gen())
    assert d.shape == LENGTHS.shape and d.dtype == torch.long
    assert torch.equal(d, LENGTHS + offset)
    assert torch.equal(s.policy_depth(LENGTHS), LENGTHS + offset)


# ----------------------------------------------------------------------------- window


@pytest.mark.parametrize("task, offset", [(COPY, 0), (ADD, 1)])
def test_window_values_and_policy(task, offset):
    w, t_max = 2, 10
    s = sched("window", task=task, window=w, t_max=t_max)
    lengths = LENGTHS.repeat(300)
    d = s.train_depths(lengths, gen())
    assert d.shape == lengths.shape and d.dtype == torch.long
    steps = lengths + offset
    assert ((d >= (steps - w).clamp(1, t_max)) & (d <= (steps + w).clamp(1, t_max))).all()
    assert ((d >= 1) & (d <= t_max)).all()
    # rows far from the clip bounds see every offset -w..w
    free = (steps - w >= 1) & (steps + w <= t_max)
    assert free.any()
    assert set((d - steps)[free].tolist()) == set(range(-w, w + 1))
    # a row whose whole window lies above t_max is clipped to t_max
    above = steps - w > t_max
    assert above.any() and (d[above] == t_max).all()
    # rows near 1 are clipped to 1, and depth 1 does occur
    assert (d[lengths == 1] >= 1).all() and (d[lengths == 1] == 1).any()
    assert torch.equal(s.policy_depth(lengths), steps)


def test_window_zero_is_matched_clipped():
    s = sched("window", window=0, t_max=10)
    assert torch.equal(s.train_depths(LENGTHS, gen()), LENGTHS.clamp(1, 10))


def test_window_offsets_are_roughly_uniform():
    s = sched("window", window=3, t_max=100)
    lengths = torch.full((7000,), 20)
    counts = torch.bincount(s.train_depths(lengths, gen()) - 17, minlength=7)
    assert counts.shape == (7,)
    assert (counts > 800).all() and (counts < 1200).all()


# ----------------------------------------------------------------------------- fixed_window


def test_fixed_window():
    c, w, t_max = 6, 2, 7
    s = sched("fixed_window", depth=c, window=w, t_max=t_max)
    lengths = LENGTHS.repeat(200)
    d = s.train_depths(lengths, gen())
    assert d.shape == lengths.shape and d.dtype == torch.long
    assert ((d >= c - w) & (d <= min(c + w, t_max))).all()
    assert set(d.tolist()) == {4, 5, 6, 7}  # 8 is clipped to t_max = 7
    assert (d == 7).sum() > (d == 5).sum()  # the clip piles mass onto t_max
    assert (s.policy_depth(lengths) == c).all()
    # lower clip at 1
    low = sched("fixed_window", depth=1, window=3, t_max=10).train_depths(lengths, gen())
    assert set(low.tolist()) == {1, 2, 3, 4}


# ----------------------------------------------------------------------------- multi_depth


@pytest.mark.parametrize("task, offset", [(COPY, 0), (ADD, 1)])
def test_multi_depth(task, offset):
    w, t_max = 2, 10
    s = sched("multi_depth", task=task, window=w, t_max=t_max)
    d = s.train_depths(LENGTHS, gen())
    assert d.dim() == 2 and d.shape[0] == len(LENGTHS) and d.dtype == torch.long
    for n, row in zip(LENGTHS.tolist(), d):
        steps = n + offset
        expected = [k for k in range(steps - w, steps + w + 1) if 1 <= k <= t_max]
        if not expected:
            expected = [t_max]  # a window wholly above t_max falls back to t_max
        used = row[row > 0].tolist()
        assert sorted(used) == expected, (n, row)
        assert len(used) == len(set(used))
        assert (row[row <= 0] <= 0).all()
    assert torch.equal(s.policy_depth(LENGTHS), LENGTHS + offset)


def test_multi_depth_concrete_rows():
    s = sched("multi_depth", window=1, t_max=4)
    d = s.train_depths(torch.tensor([1, 3, 4, 9]), gen())
    used = [sorted(r[r > 0].tolist()) for r in d]
    assert used == [[1, 2], [2, 3, 4], [3, 4], [4]]


# ----------------------------------------------------------------------------- policy table and determinism


@pytest.mark.parametrize(
    "name, expected",
    [
        ("fixed", lambda n: torch.full_like(n, 6)),
        ("matched", lambda n: n + 1),
        ("window", lambda n: n + 1),
        ("fixed_window", lambda n: torch.full_like(n, 6)),
        ("multi_depth", lambda n: n + 1),
    ],
)
def test_policy_depth_table(name, expected):
    s = sched(name, task=ADD, depth=6, window=2, t_max=10)
    policy = s.policy_depth(LENGTHS)
    assert policy.shape == LENGTHS.shape
    assert torch.equal(policy, expected(LENGTHS))


@pytest.mark.parametrize("name", ["fixed", "matched", "window", "fixed_window", "multi_depth"])
def test_deterministic_given_generator(name):
    s = sched(name, window=3, t_max=12)
    lengths = LENGTHS.repeat(20)
    a = s.train_depths(lengths, gen(5))
    b = s.train_depths(lengths, gen(5))
    assert torch.equal(a, b)
    if name in ("window", "fixed_window"):
        assert not torch.equal(a, s.train_depths(lengths, gen(6)))


# ----------------------------------------------------------------------------- objectives


def test_per_row_loss_by_hand():
    # one row, L = 3, V = 2; positions 1 and 2 are the answer
    logits = torch.tensor([[[5.0, -5.0], [0.0, 0.0], [2.0, 0.0]]])
    labels = torch.tensor([[IGNORE, 1, 1]])
    # CE at pos 1: -log(1/2); at pos 2: -log(e^0 / (e^2 + e^0)) = log(1 + e^2)
    expected = (math.log(2.0) + math.log(1.0 + math.e**2)) / 2
    got = per_row_loss(logits, labels)
    assert got.shape == (1,)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_per_row_loss_weighs_rows_equally_and_handles_empty_rows():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 5)
    labels = torch.tensor([[IGNORE, 1, 2, 3], [IGNORE, IGNORE, IGNORE, 4], [IGNORE] * 4])
    got = per_row_loss(logits, labels)
    row0 = F.cross_entropy(logits[0, 1:], labels[0, 1:])
    row1 = F.cross_entropy(logits[1, 3:], labels[1, 3:])
    assert torch.allclose(got, torch.stack([row0, row1, torch.tensor(0.0)]), atol=1e-6)
    # extra leading dims
    stacked = per_row_loss(logits[:, None].expand(-1, 2, -1, -1), labels[:, None].expand(-1, 2, -1))
    assert stacked.shape == (3, 2)
    assert torch.allclose(stacked[:, 0], got) and torch.allclose(stacked[:, 1], got)


def test_scored_row_loss_from_the_answer_positions_equals_per_row_loss():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 5)
    labels = torch.tensor([[IGNORE, 1, 2, 3], [IGNORE, IGNORE, IGNORE, 4], [IGNORE] * 4])
    at = logits[labels != IGNORE]  # [N, V], as a readout at the answer positions returns them
    assert torch.allclose(scored_row_loss(at, labels), per_row_loss(logits, labels), atol=1e-6)


def test_depth_supervised_loss_single_depth():
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 4)
    labels = torch.tensor([[IGNORE, 1, 2], [3, IGNORE, IGNORE]])
    got = depth_supervised_loss(logits, labels, torch.tensor([2, 5]))
    assert got.item() == pytest.approx(per_row_loss(logits, labels).mean().item(), rel=1e-6)


def test_depth_supervised_loss_ignores_unused_slots():
    torch.manual_seed(2)
    labels = torch.tensor([[IGNORE, 1, 2], [3, IGNORE, 0]])
    logits = torch.randn(2, 3, 3, 4)
    depths = torch.tensor([[2, 0, 3], [-1, 4, 0]])
    # garbage (but finite) logits in the unused slots must not matter
    poisoned = logits.clone()
    poisoned[0, 1] = 1e4 * torch.randn(3, 4)
    poisoned[1, 0] = -1e4
    poisoned[1, 2] = 1e4 * torch.randn(3, 4)
    row0 = (per_row_loss(logits[0, 0:1], labels[0:1]) + per_row_loss(logits[0, 2:3], labels[0:1])) / 2
    row1 = per_row_loss(logits[1, 1:2], labels[1:2])
    expected = ((row0 + row1) / 2).item()
    assert depth_supervised_loss(logits, labels, depths).item() == pytest.approx(expected, rel=1e-6)
    assert depth_supervised_loss(poisoned, labels, depths).item() == pytest.approx(expected, rel=1e-6)


def test_depth_supervised_loss_gradient_skips_unused_slots():
    torch.manual_seed(3)
    labels = torch.tensor([[IGNORE, 1, 2]])
    logits = torch.randn(1, 2, 3, 4, requires_grad=True)
    depth_supervised_loss(logits, labels, torch.tensor([[3, 0]])).backward()
    assert logits.grad[0, 1].abs().max() == 0
    assert logits.grad[0, 0].abs().max() > 0
