"""TRM's two-state recurrence (model.recurrence = "trm"): the loop against a hand-written reference,
its tangent against forward-mode AD, the halting heads reading y, and its refusals."""

from __future__ import annotations

import pytest
import torch
from torch.func import jvp

from looplab.config import ModelConfig, load_config
from looplab.errors import LooplabError
from looplab.experiment import Experiment
from looplab.generation import generate
from looplab.model import LoopedTransformer
from looplab.model.halting import HazardHead
from looplab.stability.jacobian import loop_map, random_direction
from looplab.tasks import make_task
from tests.conftest import TINY

TASK = make_task("copy")
D = 8


def _model(seed: int = 0, **overrides) -> LoopedTransformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        d_model=D, n_heads=2, core_layers=2, init_std=0.4, init_scaling="sqrt_d", recurrence="trm", **overrides
    )
    return LoopedTransformer(cfg, TASK.vocab_size).double()


def _batch(seed: int = 0):
    return TASK.sample_lengths(torch.tensor([3, 1, 2]), torch.Generator().manual_seed(seed))


def _reference_loop(model: LoopedTransformer, y, z, e, ctx, n: int):
    """TRM's latent recursion written out: z ← net(x + y + z) n times, then y ← net(y + z)."""

    def net(x):
        for layer in model.core:
            x = layer(x, ctx)
        return model.core_out_norm(x) if model.core_out_norm is not None else x

    for _ in range(n):
        z = net(e + y + z)
    return net(y + z), z


@pytest.mark.parametrize("latent_steps", [1, 3])
@pytest.mark.parametrize("core_out_norm", [False, True])
def test_a_loop_is_n_latent_updates_then_one_answer_update(latent_steps, core_out_norm):
    model = _model(latent_steps=latent_steps, core_out_norm=core_out_norm)
    batch = _batch()
    h, e, ctx = model.start(batch.tokens, batch.valid)
    assert h.shape == (*batch.tokens.shape, 2 * D)
    assert torch.equal(h[..., :D], e) and not h[..., D:].any()  # y_0 = e (init_state embed), z_0 = 0
    y, z = h[..., :D], h[..., D:]
    for _ in range(3):
        h = model.step(h, e, ctx)
        y, z = _reference_loop(model, y, z, e, ctx, latent_steps)
        assert torch.allclose(h, torch.cat([y, z], dim=-1), atol=1e-12)
    coda_free = model.head(model.final_norm(y))
    assert torch.allclose(model(batch.tokens, batch.valid, 3), coda_free, atol=1e-12)  # the readout reads y


def test_per_row_depths_match_the_plain_unroll():
    model = _model(latent_steps=2)
    batch = _batch(1)
    depths = torch.tensor([3, 1, 2])
    logits = model.forward_at_depths(batch.tokens, batch.valid, depths)
    for row, depth in enumerate(depths.tolist()):
        alone = model(batch.tokens[row : row + 1], batch.valid[row : row + 1], depth)
        assert torch.allclose(logits[row], alone[0], atol=1e-10)


@pytest.mark.parametrize("placement", ["pre", "post", "post_sandwich"])
def test_tangent_equals_forward_mode_ad(placement):
    model = _model(latent_steps=2, placement=placement)
    batch = _batch()
    h, e, _ = model.start(batch.tokens, batch.valid)
    h = (h + 0.5 * torch.randn_like(h)).detach()
    phi = loop_map(model, e.detach(), batch.valid)
    v = random_direction(batch.valid, 2 * D, torch.Generator().manual_seed(1), dtype=torch.float64)
    expected_h, expected_jv = jvp(phi, (h,), (v,))
    out_h, apply = phi.linearise(h)
    assert torch.allclose(out_h, expected_h, atol=1e-12)
    assert torch.allclose(apply(v), expected_jv, atol=1e-12)


def test_a_halting_head_reads_the_answer_state_only():
    head = HazardHead(D).double()
    batch = _batch()
    y = torch.randn(*batch.tokens.shape, D, dtype=torch.float64)
    z = torch.randn_like(y)
    assert torch.equal(head(torch.cat([y, z], dim=-1), batch.valid), head(y, batch.valid))


def test_the_trm_recipe_trains_and_its_head_halts_on_y(tmp_path):
    path = tmp_path / "trm.toml"
    path.write_text(TINY.format(steps=2, checkpoint_every=2))
    overrides = [
        "model.recurrence=trm", "model.latent_steps=2", "schedule.name=act_bce", "schedule.t_max=4",
        "train.segment_loops=2", "train.backprop_loops=1",
    ]  # fmt: skip
    exp = Experiment.build(load_config(path, overrides))
    assert exp.schedule.module.linear.in_features == exp.config.model.d_model


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.injection=concat"], "needs model.injection = 'add'"),
        (["model.injection=contractive"], "needs model.injection = 'add'"),
        (["model.latent_steps=0"], "latent_steps"),
        (["model.recurrence=hrm"], "model.recurrence"),
    ],
)
def test_bad_two_state_configs_are_refused_in_one_line(tmp_path, overrides, message):
    path = tmp_path / "trm.toml"
    path.write_text(TINY.format(steps=2, checkpoint_every=2))
    with pytest.raises(LooplabError, match=message) as caught:
        Experiment.build(load_config(path, ["model.recurrence=trm", *overrides]))
    assert "\n" not in str(caught.value)


def test_generation_refuses_the_two_state_recurrence():
    model = _model(latent_steps=1, causal=True)
    with pytest.raises(LooplabError, match="valid choices: standard"):
        generate(model, [[1, 2]], 2)


def test_the_memory_estimate_counts_core_applications_and_the_loops_backward_keeps():
    """A TRM loop holds n + 1 core applications; with backprop_loops = g only g loops per segment stay."""
    from looplab.memory import training_bytes

    task = make_task("sudoku4")

    def activations(*overrides: str, depth: int = 12) -> int:
        base = training_bytes(load_config(None, ["task.name=sudoku4", "task.train_max=4", "task.eval_lengths=[4]"]),
                              task, 0)  # fmt: skip
        config = load_config(None, ["task.name=sudoku4", "task.train_max=4", "task.eval_lengths=[4]", *overrides])
        return training_bytes(config, task, depth) - base

    one_state = activations()
    assert activations("model.recurrence=trm", "model.latent_steps=2") == 3 * one_state
    assert activations("train.segment_loops=3", "train.backprop_loops=1") * 3 == one_state
    assert activations("train.backprop_loops=2") * 6 == one_state
