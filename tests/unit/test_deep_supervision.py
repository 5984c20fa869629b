"""Deep supervision (looplab/schedules/segments.py) and the segment-halting schedules act_bce and q_halt."""

import pytest
import torch

from looplab.config import ModelConfig, ScheduleConfig
from looplab.errors import LooplabError
from looplab.eval.grid import unroll_outcomes
from looplab.eval.halting_inference import halting_off, halting_on
from looplab.model import LoopedTransformer
from looplab.schedules import ScheduleContext, make_schedule
from looplab.schedules.objectives import per_row_loss
from looplab.schedules.segment_halting import first_halt
from looplab.schedules.segments import supervise_segments
from looplab.tasks import make_task

TASK = make_task("sudoku4")


def _model(seed: int = 0) -> LoopedTransformer:
    torch.manual_seed(seed)
    return LoopedTransformer(ModelConfig(d_model=16, n_heads=2, core_layers=1, positional="rope"), TASK.vocab_size)


def _batch(rows: int = 6):
    generator = torch.Generator().manual_seed(4)
    return TASK.sample_lengths(torch.randint(1, 7, (rows,), generator=generator), generator)


def _reference_loss(model, batch, k: int, cap: torch.Tensor, grad_loops: int = 0) -> torch.Tensor:
    """The definition, one row at a time: detach at each segment start (and g loops before its end),
    read and supervise at every segment end; a row's loss is the mean over its segments."""
    losses = []
    for i in range(len(batch.tokens)):
        tokens, valid, labels = batch.tokens[i : i + 1], batch.valid[i : i + 1], batch.labels[i : i + 1]
        h, e, ctx = model.start(tokens, valid)
        ends = sorted({*range(k, int(cap[i]) + 1, k), int(cap[i])})
        start, row = 0, []
        for end in ends:
            for t in range(start + 1, end + 1):
                if (t - 1 == start and start > 0) or (grad_loops and end - (t - 1) == grad_loops):
                    h = h.detach()
                h = model.step(h, e, ctx)
            row.append(per_row_loss(model.readout(h, ctx), labels))
            start = end
        losses.append(torch.stack(row).mean())
    return torch.stack(losses).mean()


def _never(end):
    return torch.zeros_like(end.task_loss), torch.zeros_like(end.last)


@pytest.mark.parametrize("k, grad_loops", [(1, 0), (2, 0), (3, 0), (3, 1), (4, 2)])
def test_segmented_loss_and_gradient_are_the_definitions(k, grad_loops):
    model, batch = _model(), _batch()
    cap = torch.tensor([1, 7, 4, 6, 2, 5])
    run = supervise_segments(model, batch, None, k, cap, _never, grad_loops)
    got = torch.autograd.grad(run.loss, list(model.parameters()), allow_unused=True)
    expected_loss = _reference_loss(model, batch, k, cap, grad_loops)
    expected = torch.autograd.grad(expected_loss, list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(run.loss, expected_loss)
    for a, b in zip(got, expected):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert run.depth.tolist() == cap.tolist()
    assert run.segments.tolist() == [len({*range(k, c + 1, k), c}) for c in cap.tolist()]


def test_no_gradient_crosses_a_segment_boundary():
    model, batch = _model(), _batch(2)
    k = 2
    cap = torch.tensor([4, 4])

    # Only the second segment's loss counts: its gradient must equal that of a unroll whose state
    # was detached after loop 2 (and differ from the full backprop through all 4 loops).
    def second_only(end):
        return torch.zeros_like(end.task_loss) - (end.task_loss if end.loop == 2 else 0.0), end.last

    run = supervise_segments(model, batch, None, k, cap, second_only)
    grad = torch.autograd.grad(run.loss, model.embedding.weight)[0]
    h, e, ctx = model.start(batch.tokens, batch.valid)
    for t in range(4):
        h = model.step(h.detach() if t == 2 else h, e, ctx)
    detached = torch.autograd.grad(per_row_loss(model.readout(h, ctx), batch.labels).mean() / 2, model.embedding.weight)
    torch.testing.assert_close(grad, detached[0])


def _segment_schedule(name: str, k: int = 2, t_max: int = 6, bias: float | None = None, **params):
    schedule = make_schedule(
        ScheduleConfig(name=name, t_max=t_max, **params), ScheduleContext(TASK, 16, segment_loops=k)
    )
    if bias is not None:
        torch.nn.init.constant_(schedule.module.linear.bias, 0.0)
        schedule.module.linear.bias.data[0] = bias
    return schedule


@pytest.mark.parametrize("name", ["act_bce", "q_halt"])
@pytest.mark.parametrize("bias, depth", [(5.0, 2), (-5.0, 6)])
def test_a_head_that_says_halt_stops_every_row_after_one_segment(name, bias, depth):
    schedule = _segment_schedule(name, bias=bias, halt_exploration_prob=0.0)
    out = schedule.training_loss(_model(), _batch(), torch.Generator().manual_seed(0))
    assert out.stats["row_loops_mean"] == depth and out.stats["segments_mean"] == depth / 2
    assert out.stats["halted_early"] == (1.0 if depth == 2 else 0.0)
    out.loss.backward()
    assert schedule.module.linear.weight.grad.abs().sum() > 0  # the halting loss trains the head


def test_exploration_keeps_rows_from_halting_before_their_drawn_segment():
    schedule = _segment_schedule("act_bce", k=1, t_max=8, bias=5.0, halt_exploration_prob=1.0)
    out = schedule.training_loss(_model(), _batch(64), torch.Generator().manual_seed(0))
    # every row explores: it halts at a segment drawn from 2..8, so at 5 loops on average
    assert 4.0 < out.stats["row_loops_mean"] < 6.0


def test_act_bce_head_learns_the_answers_correctness():
    """BCE against 1[answer right]: a head fed a state that predicts the answer learns to say halt for it."""
    schedule = _segment_schedule("act_bce", k=2, t_max=2)
    model = _model()
    batch = _batch(8)
    optimizer = torch.optim.Adam(schedule.module.parameters(), lr=0.1)
    for step in range(30):
        out = schedule.training_loss(model, batch, torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    # an untrained model gets every board wrong: the head must learn "not correct" (logit < 0)
    h = model.unroll(batch.tokens, batch.valid, 2)
    *_, (state, _) = h
    assert (schedule.hazard_logit(state, batch.valid) < -5).all()


def test_q_halt_continue_target_bootstraps_from_the_next_segment():
    schedule = _segment_schedule("q_halt", k=1, t_max=3, bias=-5.0, halt_exploration_prob=0.0)
    schedule.module.linear.bias.data[1] = 1.0  # Q_halt = −5, Q_continue = 1 everywhere: no row halts
    model, batch = _model(), _batch(4)
    ends = []
    original = schedule.halting_loss

    def spy(model_, end, q):
        loss = original(model_, end, q)
        ends.append((end.loop, loss.detach()))
        return loss

    schedule.halting_loss = spy
    schedule.training_loss(model, batch, torch.Generator().manual_seed(0))
    # every board is wrong (target of Q_halt 0); Q_continue's target is σ(max Q) of the next segment,
    # σ(Q_halt) when that segment is the last; the last segment has no continue option
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    halt_only = bce(torch.tensor(-5.0), torch.tensor(0.0))
    continue_towards = {1: torch.sigmoid(torch.tensor(1.0)), 2: torch.sigmoid(torch.tensor(-5.0))}
    assert [loop for loop, _ in ends] == [1, 2, 3]
    for loop, target in continue_towards.items():
        torch.testing.assert_close(ends[loop - 1][1], (halt_only + bce(torch.tensor(1.0), target)).expand(4))
    torch.testing.assert_close(ends[2][1], halt_only.expand(4))


@pytest.mark.parametrize(
    "logits, every, cap, expected",
    [
        ([[-1, 1, -1, -1]], 1, 4, [2]),
        ([[1, -1, -1, -1]], 2, 4, [4]),  # loop 1 says halt but is no decision; 4 is the cap
        ([[1, -1, 1, -1]], 2, 4, [4]),
        ([[-1, -1, 1, -1]], 3, 4, [3]),
        ([[-1, 1, 1, 1, 1, 1]], 2, 4, [2]),
        ([[-1, -1, -1, -1, 1, 1]], 2, 4, [4]),  # the cap is below a later halt
        ([[-1, -1]], 3, 2, [2]),  # no decision loop before the cap
    ],
)
def test_first_halt(logits, every, cap, expected):
    assert first_halt(torch.tensor(logits, dtype=torch.float), every, cap).tolist() == expected


@pytest.mark.parametrize("name", ["act_bce", "q_halt", "rl_halting"])
def test_halting_on_reads_each_row_where_it_halts(name):
    """Rows leave the batch when they halt; each row's answer is the one an unroll to T_max shows at its depth."""
    model = _model(3).eval()
    if name == "rl_halting":
        schedule = make_schedule(ScheduleConfig(name=name, t_max=6), ScheduleContext(TASK, 16))
    else:
        schedule = _segment_schedule(name)
    torch.manual_seed(5)
    torch.nn.init.normal_(schedule.module.linear.weight, std=3.0)
    torch.nn.init.zeros_(schedule.module.linear.bias)
    batch = _batch(32)
    # centre the head on the rows' scores at the first decision, so rows halt at different loops
    middle = unroll_outcomes(model, batch, 6, schedule)["hazard_logits"][:, schedule.halt_every - 1]
    schedule.module.linear.bias.data[0] -= float(middle.median())
    correct, depth = halting_on(model, schedule, batch, 6)
    signals = unroll_outcomes(model, batch, 6, schedule)
    online = first_halt(signals["hazard_logits"], schedule.halt_every, 6)
    assert depth.tolist() == online.tolist()
    assert len(set(depth.tolist())) > 1  # the test exercises rows leaving at different loops
    assert correct.tolist() == signals["correct"][torch.arange(32), depth - 1].tolist()
    if name != "rl_halting":  # the segment schedules' Policy depth is this online rule
        assert schedule.test_depths(batch.lengths, signals["hazard_logits"]).tolist() == depth.tolist()
    assert halting_off(model, batch, 6).tolist() == signals["correct"][:, 5].tolist()


def test_a_segment_schedule_without_segments_is_refused():
    with pytest.raises(LooplabError, match="segment_loops > 0"):
        make_schedule(ScheduleConfig(name="act_bce", t_max=6), ScheduleContext(TASK, 16))
    with pytest.raises(LooplabError, match="dividing"):
        make_schedule(ScheduleConfig(name="q_halt", t_max=7), ScheduleContext(TASK, 16, segment_loops=2))


@pytest.mark.parametrize("name", ["act_bce", "q_halt"])
def test_halting_can_be_kept_out_of_training(name):
    schedule = _segment_schedule(name, bias=5.0, halt_exploration_prob=0.0, halt_in_training=False)
    out = schedule.training_loss(_model(), _batch(), torch.Generator().manual_seed(0))
    assert out.stats["row_loops_mean"] == 6 and out.stats["halted_early"] == 0.0
    h = torch.zeros(1, 17, 16)
    assert schedule.hazard_logit(h, torch.ones(1, 17, dtype=torch.bool)) > 0  # it still halts at test time


@pytest.mark.parametrize("name", ["act_bce", "q_halt"])
def test_a_detached_head_trains_itself_and_leaves_the_model_to_the_answer_loss(name):
    def model_gradients(**params):
        schedule = _segment_schedule(name, halt_exploration_prob=0.0, **params)
        torch.manual_seed(2)
        torch.nn.init.normal_(schedule.module.linear.weight, std=0.5)
        model = _model()
        out = schedule.training_loss(model, _batch(), torch.Generator().manual_seed(0))
        out.loss.backward()
        head_learns = schedule.module.linear.weight.grad.abs().sum() > 0
        assert head_learns == (params.get("halt_loss_weight", 0.5) > 0)
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    detached = model_gradients(head_gradient=False)
    no_halting_loss = model_gradients(head_gradient=False, halt_loss_weight=0.0)
    attached = model_gradients()
    assert all(torch.allclose(a, b) for a, b in zip(detached, no_halting_loss))
    assert not all(torch.allclose(a, b) for a, b in zip(attached, no_halting_loss))


def test_a_non_finite_answer_is_wrong():
    from looplab.schedules.segments import whole_answer_correct

    labels = torch.tensor([[-100, 1, 0], [-100, 1, 0]])
    logits = torch.tensor([[[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]], [[0.0, 0.0], [float("nan"), 1.0], [1.0, 0.0]]])
    assert whole_answer_correct(logits, labels).tolist() == [True, False]
