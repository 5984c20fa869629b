"""The CUDA path: the compacted forward, JSRR under bf16 autocast, exact resume, DDP over NCCL."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from looplab.config import ModelConfig
from looplab.model import LoopedTransformer
from looplab.model.protocol import LoopProbe
from looplab.stability.jacobian import jsrr_per_sample
from looplab.tasks import make_task
from tests.conftest import run_cli, torchrun

pytestmark = pytest.mark.gpu
TASK = make_task("binary_addition")


def _model_and_batch(seed: int = 0) -> tuple[LoopedTransformer, object]:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=64, n_heads=4, core_layers=2, placement="post_sandwich")
    model = LoopedTransformer(cfg, TASK.vocab_size)
    batch = TASK.sample_lengths(
        torch.randint(1, 12, (32,), generator=torch.Generator().manual_seed(seed)), torch.Generator().manual_seed(seed)
    )
    return model, batch


def test_forward_at_depths_on_cuda_matches_cpu():
    model, batch = _model_and_batch()
    depths = torch.randint(1, 9, (len(batch.tokens),), generator=torch.Generator().manual_seed(1))
    expected = model.forward_at_depths(batch.tokens, batch.valid, depths)
    gpu = model.to("cuda")
    found = gpu.forward_at_depths(batch.tokens.cuda(), batch.valid.cuda(), depths.cuda()).cpu()
    valid = batch.valid
    torch.testing.assert_close(found[valid], expected[valid], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("estimator", ["jvp", "vjp", "frobenius"])
def test_jsrr_under_bf16_autocast_is_finite_and_near_fp32(estimator):
    model, batch = _model_and_batch()
    model = model.cuda()
    tokens, valid = batch.tokens.cuda(), batch.valid.cuda()
    h, e, ctx = model.start(tokens, valid)
    for _ in range(4):
        h = model.step(h, e, ctx)
    probe = LoopProbe(h.detach(), e.detach(), valid)
    direction = torch.randn(h.shape, generator=torch.Generator().manual_seed(2)).cuda() * valid[..., None]
    if estimator != "frobenius":
        direction = direction / direction.flatten(1).norm(dim=1)[:, None, None]
    exact = jsrr_per_sample(model, probe, estimator, 0, direction=direction)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low = jsrr_per_sample(model, probe, estimator, 0, direction=direction)
    assert torch.isfinite(low).all()
    low.float().mean().backward()  # differentiable under autocast
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert float(low.float().mean()) == pytest.approx(float(exact.mean()), rel=0.1)


def _weights(run_dir, step):
    folder = run_dir / "checkpoints" / f"step_{step:07d}"
    return {f"{f.name}:{k}": t for f in sorted(folder.glob("*.safetensors")) for k, t in load_file(f).items()}


def test_resume_on_cuda_continues_exactly(tiny_config, tmp_path):
    args = ("train", str(tiny_config(steps=20, checkpoint_every=10)), "--no-progress", "--set", "run.device=cuda")
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert run_cli(*args, "--out", str(whole)).returncode == 0
    assert run_cli(*args, "--out", str(resumed)).returncode == 0
    shutil.rmtree(resumed / "checkpoints" / "step_0000020")
    result = run_cli(*args, "--out", str(resumed))
    assert result.returncode == 0, result.stderr
    expected, found = _weights(whole, 20), _weights(resumed, 20)
    for name in expected:  # CUDA kernels may reduce in a different order from run to run
        torch.testing.assert_close(found[name], expected[name], atol=1e-5, rtol=1e-5, msg=name)


def test_bf16_training_runs_and_learns_on_cuda(tiny_config, tmp_path):
    run_dir = tmp_path / "bf16"
    result = run_cli(
        "train",
        str(tiny_config(steps=60, checkpoint_every=60)),
        "--out",
        str(run_dir),
        "--no-progress",
        "--set",
        "run.device=cuda",
        "--set",
        "run.precision=bf16",
    )
    assert result.returncode == 0, result.stderr
    losses = [json.loads(line)["loss"] for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert all(map(math.isfinite, losses)) and losses[-1] < losses[0]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP over NCCL needs two GPUs, one per rank")
def test_ddp_over_nccl_trains_like_one_process(tiny_config, tmp_path):
    args = ("train", str(tiny_config(steps=20, checkpoint_every=10)), "--no-progress", "--set", "run.device=cuda")
    single, parallel = tmp_path / "single", tmp_path / "parallel"
    assert run_cli(*args, "--out", str(single)).returncode == 0
    result = torchrun(*args, "--out", str(parallel), timeout=300)
    assert result.returncode == 0, result.stderr
    expected, found = _weights(single, 20), _weights(parallel, 20)
    for name in expected:
        torch.testing.assert_close(found[name], expected[name], atol=1e-4, rtol=1e-3, msg=name)
