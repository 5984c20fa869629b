"""OLMo-2 as a retrofit source (the mechanistic paper's third retrofit): its norms sit after attention and
the MLP and its q / k norms span every head, and both hold through ``looplab retrofit``, the adapter and the
cached decoder. Tiny random model written by save_pretrained beside a tokenizer trained here."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from looplab.cli import main  # noqa: E402
from looplab.generation import generate  # noqa: E402
from looplab.generation.options import DecodeOptions
from looplab.lm.model_dir import open_model_dir  # noqa: E402
from looplab.token_exits import GenerationExit  # noqa: E402
from tests.lm_dirs import LLAMA, tiny_tokenizer  # noqa: E402
from tests.unit.test_native_looped import _randomise  # noqa: E402

PROMPTS = [[3, 5, 7, 9, 11], [6, 8], [10, 12, 14, 1]]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from transformers import Olmo2Config, Olmo2ForCausalLM

    root = tmp_path_factory.mktemp("olmo2")
    torch.manual_seed(0)
    model = _randomise(Olmo2ForCausalLM(Olmo2Config(**LLAMA)), 0.1)
    model.save_pretrained(root / "olmo2")
    tiny_tokenizer().save_pretrained(root / "olmo2")
    command = f"retrofit {root / 'olmo2'} --prelude 1 --core 2 --coda 1 --injection mix --out {root / 'retrofit'}"
    assert main(command.split()) == 0
    return root


def test_one_loop_of_every_layer_is_the_source(dirs):
    from transformers import Olmo2ForCausalLM

    source = Olmo2ForCausalLM.from_pretrained(dirs / "olmo2", attn_implementation="eager").eval()
    loop = open_model_dir(dirs / "retrofit").load()
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        assert (loop(ids, None, 1) - source(ids).logits).abs().max() < 1e-5


@pytest.mark.parametrize("loops", [1, 3])
def test_the_cached_decoder_equals_each_prompt_recomputed_alone(dirs, loops):
    loop = open_model_dir(dirs / "retrofit").load(torch.float64)
    batched = generate(loop, PROMPTS, 5, DecodeOptions(GenerationExit("fixed", loops), "per_loop"))
    alone = [generate(loop, [p], 5, DecodeOptions(GenerationExit("fixed", loops), "none")).tokens[0] for p in PROMPTS]
    assert batched.tokens == alone
