"""The retrofit half of the stars-lm study: its settings file and recipes (no model is loaded here)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from looplab.cli import PRESETS
from looplab.errors import LooplabError
from looplab.studies import STUDY_EXTRAS
from looplab.studies.stars.recipes import RetrofitRecipe, encode_problems
from looplab.studies.stars.study import RetrofitStudy, load_study
from looplab.tasks import IGNORE


def test_the_preset_loads_and_runs_both_recipes_on_the_paper_settings():
    study = load_study(PRESETS / STUDY_EXTRAS["stars-lm"])
    assert set(study.recipes) == {"fixed", "stars"} and study.depth == 4 and study.max_loops >= 8
    stars = RetrofitRecipe("stars")
    assert (stars.mu, stars.sigma, stars.lo, stars.hi, stars.jsrr_weight) == (1.7, 0.4, 1, 16, 0.1)
    depths = [
        int(stars.schedule().train_depths(torch.tensor([1]), torch.Generator().manual_seed(s))[0]) for s in range(200)
    ]
    assert min(depths) >= 1 and max(depths) <= 16 and 4 <= sum(depths) / len(depths) <= 8  # median e^1.7 ≈ 5.5
    assert RetrofitRecipe("fixed").schedule().train_depths(torch.tensor([1, 1]), None).tolist() == [4, 4]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[retrofit]\ncolour = 1\n", "unknown retrofit key 'colour'"),
        ("[retrofit]\nrecipes = ['sft']\n", "valid choices: as_is, fixed, stars"),
        ("[retrofit]\nsteps = 0\n", "retrofit.steps must be >= 1"),
        ("[retrofit]\nlr = -1.0\n", "retrofit.lr must be > 0"),
        ("[retrofit]\nmax_loops = 6\n", "max_loops >= 2 x depth"),
        ("[retrofit\n", "not valid TOML"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "retrofit.toml"
    path.write_text(text)
    with pytest.raises(LooplabError, match=message):
        load_study(path)


class CharTokenizer:
    """One token per character (ids = code points), enough to check the label alignment."""

    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_encoded_problems_supervise_exactly_the_answer_tokens():
    batch = encode_problems(CharTokenizer(), [("a=1;b=a+1;b?", "2\n"), ("c=5;c?", "5\n")])
    assert batch["input_ids"].shape == (2, 14)
    assert batch["attention_mask"].sum(1).tolist() == [14, 8]
    for row, (question, answer) in enumerate([("a=1;b=a+1;b?", "2\n"), ("c=5;c?", "5\n")]):
        labels = batch["labels"][row]
        scored = (labels != IGNORE).nonzero().squeeze(1).tolist()
        assert scored == [len(question) - 1, len(question)]  # '?' predicts the digit, the digit the newline
        assert [chr(int(labels[i])) for i in scored] == list(answer)
    assert RetrofitStudy().train_max == 4


class ByteTokenizer:
    """Bytes as token ids 1..128 (0 pads), with the batch interface the KJV passages use."""

    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False, truncation=False, max_length=None, padding=False):
        if isinstance(text, str):
            return {"input_ids": [1 + (b % 127) for b in text.encode()]}
        rows = [[1 + (b % 127) for b in t.encode()][:max_length] for t in text]
        width = max(map(len, rows))
        return {
            "input_ids": [r + [0] * (width - len(r)) for r in rows],
            "attention_mask": [[1] * len(r) + [0] * (width - len(r)) for r in rows],
        }


def tiny_llama_config():
    """A four-layer Llama small enough to fine-tune in a test, with eager attention (the retrofit reads it)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=130,
        max_position_embeddings=128,
    )
    config._attn_implementation = "eager"
    return config


@pytest.mark.parametrize("recipe", ["fixed", "stars"])
def test_both_recipes_fine_tune_a_tiny_llama_and_measure_it_by_loops(recipe):
    pytest.importorskip("transformers")
    from transformers import LlamaForCausalLM

    from looplab.lm.retrofit import RetrofittedLoop
    from looplab.studies.stars.recipes import fine_tune_recipe, retrofit_by_loops, text_batch

    config = tiny_llama_config()
    torch.manual_seed(0)
    loop = RetrofittedLoop(LlamaForCausalLM(config), 1, 2, 1, inject_init="mix")
    before = [p.detach().clone() for p in loop.parameters()]
    log = fine_tune_recipe(loop, ByteTokenizer(), RetrofitRecipe(recipe), 3, [1, 2], 2, 1e-3, 0, text_rows=2)
    assert log.step.tolist() == [1, 2, 3] and log.loss.map(math.isfinite).all()
    if recipe == "fixed":
        assert (log.loops == 4).all() and log.jsrr.isna().all()
    else:
        assert log.loops.between(1, 16).all() and (log.jsrr > 0).all()
    assert any(not torch.equal(a, b) for a, b in zip(before, loop.parameters()))
    kjv = text_batch(ByteTokenizer(), "val", 2, 24, torch.Generator().manual_seed(0))
    frame, grid = retrofit_by_loops(loop, ByteTokenizer(), kjv, [1, 2, 3], 2, 4, 8, 0, spectral_iters=2)
    assert frame.loops.tolist() == list(range(1, 9))
    for column in ("loss", "reasoning_id", "reasoning_ood", "state_norm", "spectral_radius"):
        assert frame[column].map(math.isfinite).all(), column
    assert sorted(grid.length.unique()) == [1, 2, 3] and set(grid.split) == {"id", "ood"}


def test_a_learning_curve_probe_reads_the_model_without_changing_the_fine_tune():
    pytest.importorskip("transformers")
    from transformers import LlamaForCausalLM

    from looplab.lm.retrofit import RetrofittedLoop
    from looplab.studies.stars.recipes import fine_tune_recipe

    config = tiny_llama_config()
    runs = []
    for probe_every in (0, 2):
        torch.manual_seed(0)
        loop = RetrofittedLoop(LlamaForCausalLM(config), 1, 2, 1, inject_init="mix")
        seen = []

        def probe(step, loop=loop, seen=seen):
            seen.append((step, loop.training, float(next(loop.parameters()).detach().sum())))

        log = fine_tune_recipe(
            loop, ByteTokenizer(), RetrofitRecipe("stars"), 5, [1, 2], 2, 1e-3, 0, probe=probe, probe_every=probe_every
        )
        runs.append((log, [p.detach().clone() for p in loop.parameters()], seen))
    (plain, plain_weights, none), (probed, probed_weights, seen) = runs
    assert none == [] and [step for step, _, _ in seen] == [0, 2, 4]
    assert not any(training for _, training, _ in seen)  # read in eval mode
    assert seen[0][2] != seen[1][2]  # after two steps the weights have moved
    pd.testing.assert_frame_equal(plain, probed)  # the same steps, depths and losses
    assert all(torch.equal(a, b) for a, b in zip(plain_weights, probed_weights))


def test_study_settings_check_the_learning_curve_keys(tmp_path):
    path = tmp_path / "retrofit.toml"
    path.write_text("[retrofit]\ncurve_every = -1\n")
    with pytest.raises(LooplabError, match="curve_every must be >= 0"):
        load_study(path)
    path.write_text("[retrofit]\ncurve_every = 25\ncurve_samples = 0\n")
    with pytest.raises(LooplabError, match="curve_samples must be >= 1"):
        load_study(path)
    for preset in sorted((Path(__file__).parents[2] / "looplab" / "configs" / "stars-lm").glob("retrofit*.toml")):
        assert load_study(preset).steps >= 1, preset
