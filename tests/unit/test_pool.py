"""Pre-drawn training pools (looplab/tasks/pool.py) and task.pool."""

import pytest
import torch

from looplab.config import load_config
from looplab.errors import LooplabError
from looplab.experiment import Experiment, check_config
from looplab.seeding import derive_generator
from looplab.tasks import make_task
from looplab.tasks.pool import CHUNK, PooledTask, draw_pool, pool_header, save_pool


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pool") / "sudoku4.safetensors"
    save_pool(path, "sudoku4", 8, 7, draw_pool("sudoku4", 8, [3, 5], CHUNK + 10, 7))
    return path


def test_a_pool_is_the_same_whatever_the_number_of_workers():
    one = draw_pool("sudoku4", 8, [2, 4], CHUNK + 5, 3, workers=1)
    two = draw_pool("sudoku4", 8, [2, 4], CHUNK + 5, 3, workers=2)
    for n in (2, 4):
        assert all(torch.equal(a, b) for a, b in zip(one[n], two[n]))
        assert one[n][0].shape == (CHUNK + 5, 16)
    # each chunk of rows is the task's own draw from a generator derived from (seed, "pool", n, chunk)
    task = make_task("sudoku4")
    tokens, labels = task._sample_rows(4, 5, derive_generator(3, "pool", 4, 1))
    assert torch.equal(one[4][0][CHUNK:], tokens) and torch.equal(one[4][1][CHUNK:], labels)


def test_header_round_trips(pool_file):
    header = pool_header(pool_file)
    assert (header.task, header.alphabet, header.seed) == ("sudoku4", 8, 7)
    assert header.sizes == {3: CHUNK + 10, 5: CHUNK + 10}


def test_pooled_sampling_draws_pool_rows_for_pool_sizes_and_live_rows_for_the_rest(pool_file):
    task = make_task("sudoku4")
    pooled = PooledTask(task, pool_file)
    lengths = torch.tensor([3, 4, 5, 3, 5, 4])
    first = pooled.sample_lengths(lengths, torch.Generator().manual_seed(0))
    second = pooled.sample_lengths(lengths, torch.Generator().manual_seed(0))
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.labels, second.labels)
    for row, n in enumerate(lengths.tolist()):
        body = first.tokens[row, 1:]
        if n in (3, 5):
            assert (pooled.rows[n][0] == body).all(1).any(), f"row {row} is not from the pool"
        else:
            assert (first.tokens[row] == task.token_id["."]).sum() == n  # a live board with n blanks
    assert pooled.vocab == task.vocab and torch.equal(pooled.steps(lengths), task.steps(lengths))


def _config(*overrides):
    base = ["task.name=sudoku4", "task.train_min=1", "task.train_max=6", "task.eval_lengths=[2,8]"]
    return load_config(None, [*base, *overrides])


@pytest.mark.parametrize(
    "pool, message",
    [
        ("missing.safetensors", "is not a file"),
        ("garbage.safetensors", "is not a safetensors file"),
        ("other_task.safetensors", "holds maze (alphabet 8), not sudoku4"),
        ("wide.safetensors", "holds sizes [8] outside the training range 1..6"),
    ],
)
def test_a_pool_that_does_not_fit_the_run_is_refused(tmp_path, pool, message):
    (tmp_path / "garbage.safetensors").write_bytes(b"not a pool")
    save_pool(tmp_path / "other_task.safetensors", "maze", 8, 0, draw_pool("maze", 8, [3], 2, 0))
    save_pool(tmp_path / "wide.safetensors", "sudoku4", 8, 0, draw_pool("sudoku4", 8, [3, 8], 2, 0))
    with pytest.raises(LooplabError) as refused:
        check_config(_config(f"task.pool={tmp_path / pool}"))
    assert message in str(refused.value)


def _rewritten(path, source, tensors=None, **meta):
    """``source``'s pool with its tensors and metadata changed (a damaged file, as a user might hold)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(source), "pt") as handle:
        metadata = {**handle.metadata(), **meta}
    save_file(tensors if tensors is not None else load_file(str(source)), str(path), metadata=metadata)
    return path


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p, src: _rewritten(p, src, sizes="{not json"), "has a damaged header (Expecting property name"),
        (lambda p, src: _rewritten(p, src, alphabet="x"), "has a damaged header (invalid literal"),
        (lambda p, src: _rewritten(p, src, tensors={"tokens.3": torch.zeros(2, 2, dtype=torch.long)}), "lacks the"),
        (
            lambda p, src: _rewritten(
                p, src, tensors={f"{k}.{n}": torch.zeros(2, 3) for k in ("tokens", "labels") for n in (3, 5)}
            ),
            "is not stored as rows of int64 token ids",
        ),  # fmt: skip
        (
            lambda p, src: _rewritten(
                p,
                src,
                tensors={f"{k}.{n}": torch.zeros(2, 3, dtype=torch.long) for k in ("tokens", "labels") for n in (3, 5)},
            ),
            f"its header {CHUNK + 10} rows",
        ),  # fmt: skip
    ],
)
def test_a_damaged_pool_file_is_named_in_one_line(pool_file, tmp_path, damage, message):
    path = damage(tmp_path / "damaged.safetensors", pool_file)
    with pytest.raises(LooplabError) as refused:
        PooledTask(make_task("sudoku4"), path)
    assert str(path) in str(refused.value) and message in str(refused.value), refused.value


def test_training_reads_the_pool_and_evaluation_does_not(pool_file, tmp_path, monkeypatch):
    monkeypatch.chdir(pool_file.parent)
    config = _config(f"task.pool={pool_file.name}")
    assert config.task.pool == str(pool_file)  # made absolute when read, so a run dir finds it from anywhere
    exp = Experiment.build(config)
    assert isinstance(exp.training_task, PooledTask) and exp.task is not exp.training_task
    assert Experiment.build(_config()).training_task.name == "sudoku4"


def test_a_training_step_draws_its_batch_from_the_pool(pool_file):
    from looplab.train.trainer import make_optimizer, train_step

    exp = Experiment.build(_config("task.train_min=3", "task.train_max=5", f"task.pool={pool_file}"))
    seen = []
    original = exp.schedule.training_loss

    def spy(model, batch, generator, probe=False):
        seen.append(batch)
        return original(model, batch, generator, probe)

    exp.schedule.training_loss = spy
    train_step(exp, make_optimizer(exp), 1)
    batch = seen[0]
    pooled = [(n, body) for n, body in zip(batch.lengths.tolist(), batch.tokens[:, 1:]) if n in (3, 5)]
    assert pooled and all((exp.training_task.rows[n][0] == body[:16]).all(1).any() for n, body in pooled)
