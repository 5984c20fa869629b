"""Generation from a retrofitted Llama (looplab/generation/retrofit.py): the cached decoder against the retrofit's
own recomputation, with grouped keys and values, a prelude, a kept middle and a coda."""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from looplab.generation import GenerationExit, Sampling, generate, score  # noqa: E402
from looplab.generation.options import DecodeOptions
from looplab.lm.retrofit import RetrofittedLoop  # noqa: E402

VOCAB = 50
#: transformers' eager attention takes its softmax in float32 even in a float64 model; ours stays in float64
ATOL = 1e-6
PROMPTS = [[3, 5, 6, 2, 1], [3, 4], [3, 4, 4, 6, 1, 5, 2, 2]]


@pytest.fixture(scope="module", params=[False, True], ids=["dropped-middle", "kept-middle"])
def retrofit(request):
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    return RetrofittedLoop(model, 1, 2, 1, keep_middle=request.param, inject_init="mix").eval()


def test_cached_generation_equals_the_retrofits_recomputation(retrofit):
    cached = generate(retrofit, PROMPTS, 6, DecodeOptions(GenerationExit("fixed", 3), "per_loop"))
    uncached = generate(retrofit, PROMPTS, 6, DecodeOptions(GenerationExit("fixed", 3), "none"))
    assert cached.tokens == uncached.tokens
    flat = [lp for row in cached.logprobs for lp in row]
    assert flat == pytest.approx([lp for row in uncached.logprobs for lp in row], abs=ATOL)
    for prompt, new in zip(PROMPTS, cached.tokens):  # every greedy token is the retrofit's own argmax
        with torch.no_grad():
            logits = retrofit(torch.tensor([prompt + new[:-1]]), loops=3)[0]
        assert logits[len(prompt) - 1 :].argmax(-1).tolist() == new


def test_retrofit_scoring_matches_its_forward_pass_and_batches_equal_single_prompts(retrofit):
    sequence = [3, 5, 6, 2, 1, 7, 9]
    scored = score(retrofit, [sequence], DecodeOptions(GenerationExit("fixed", 2), "per_loop"))
    with torch.no_grad():
        logp = retrofit(torch.tensor([sequence]), loops=2)[0].log_softmax(-1)
    expected = [float(logp[i, sequence[i + 1]]) for i in range(len(sequence) - 1)]
    assert scored.logprobs[0] == pytest.approx(expected, abs=ATOL)
    rule = GenerationExit("convergence", 8, {"eps": 0.05})
    together = generate(retrofit, PROMPTS, 4, DecodeOptions(rule, "shared"))
    for row, prompt in enumerate(PROMPTS):
        alone = generate(retrofit, [prompt], 4, DecodeOptions(rule, "shared"))
        assert alone.tokens[0] == together.tokens[row] and alone.depths[0] == together.depths[row]


def test_the_retrofit_cache_holds_its_grouped_heads(retrofit):
    result = generate(
        retrofit, PROMPTS, 3, DecodeOptions(GenerationExit("fixed", 4), "per_loop", Sampling(temperature=1.0, seed=2))
    )
    layers = 1 + 4 * 2 + len(retrofit.middle) + 1  # prelude, core per loop, middle and coda
    slots = max(map(len, PROMPTS)) + 3
    assert result.cache_bytes == layers * 2 * len(PROMPTS) * 2 * slots * 8 * 8  # k and v, 2 kv heads of 8, float64
