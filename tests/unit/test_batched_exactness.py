"""A batch of mixed-length prompts decodes each prompt as it decodes alone, on every looped family and at
every loop count from 1 to its native count + 2 (above it, the loops the model never ran by itself): the
cached step decoder against each prompt recomputed whole, in float32 as the command line runs it. Prompts
are right-padded into the cache's slots, each row with its own positions; a padding slot must never be
read, whichever loop writes it."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from looplab.generation import GenerationExit, generate  # noqa: E402
from looplab.generation.options import DecodeOptions
from looplab.lm.native import NativeLoop  # noqa: E402
from tests.lm_dirs import save_own_family, tiny_model  # noqa: E402
from tests.unit.model_helpers import tiny_llama_retrofit  # noqa: E402

PROMPTS = [[5, 9, 2, 7, 11, 3, 8, 1, 4], [6, 2, 13], [10, 12, 14, 1, 9, 9]]
NEW = 6
FAMILIES = ("hrm_text", "inkling2_loop", "retrofit", "ouro", "huginn")


@pytest.fixture(scope="module")
def loops_of(tmp_path_factory):
    """family → (its adapter in float32, its native loop count)."""
    from looplab.lm.families import native_loop
    from looplab.lm.model_dir import open_model_dir

    root = tmp_path_factory.mktemp("batched")
    out = {}
    for family in FAMILIES:
        if family in ("ouro", "huginn"):
            model_dir = open_model_dir(save_own_family(family, root / family))
            out[family] = (model_dir.load(), model_dir.native_loops)
        elif family == "retrofit":
            out[family] = (tiny_llama_retrofit().float(), 1)
        else:
            loop: NativeLoop = native_loop(tiny_model(family).eval())
            out[family] = (loop, loop.native_loops)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_a_mixed_length_batch_decodes_each_prompt_as_alone_at_every_loop_count(loops_of, family):
    loop, native = loops_of[family]
    for loops in range(1, native + 3):
        rule = GenerationExit("fixed", loops)
        batched = generate(loop, PROMPTS, NEW, DecodeOptions(rule, "per_loop"))
        for row, prompt in enumerate(PROMPTS):
            alone = generate(loop, [prompt], NEW, DecodeOptions(rule, "none"))
            assert batched.tokens[row] == alone.tokens[0], (family, loops, row)
            # float32 rounding grows through the loops of a random model (Huginn's most: ~1e-4 at 6); reading a
            # padding slot would move a log-probability by far more
            assert batched.logprobs[row] == pytest.approx(alone.logprobs[0], abs=2e-3), (family, loops, row)


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_through_the_forward_reads_each_prompt_as_alone_above_the_native_loops(loops_of, side):
    """The full forward (what eval, analyze and lm-eval's batches run) with left- or right-padded prompts and
    their attention mask, at the native loop count and two above it: each prompt's last logits as alone."""
    import torch

    loop, native = loops_of["hrm_text"]
    width = max(map(len, PROMPTS))
    tokens = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    valid = torch.zeros(len(PROMPTS), width, dtype=torch.bool)
    for row, prompt in enumerate(PROMPTS):
        place = slice(width - len(prompt), width) if side == "left" else slice(0, len(prompt))
        tokens[row, place], valid[row, place] = torch.tensor(prompt), True
    for loops in (native, native + 2):
        batched = loop(tokens, valid, loops)
        for row, prompt in enumerate(PROMPTS):
            alone = loop(torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.bool), loops)
            last = width - 1 if side == "left" else len(prompt) - 1
            assert (batched[row, last] - alone[0, -1]).abs().max() < 1e-5, (loops, row)
