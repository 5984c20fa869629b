"""Tiny model directories for the model-dir tests: a random model of each family written by
``save_pretrained``, beside a small BPE tokenizer trained here on a few lines (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.unit.test_native_looped import HRM, INKLING, VOCAB, _randomise

#: the text the tokenizer is trained on and the tests read (about 300 tokens under it)
TEXT = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
    "And God said, Let there be light: and there was light. And God saw the light, that it was good: and "
    "God divided the light from the darkness. And God called the light Day, and the darkness he called "
    "Night. And the evening and the morning were the first day.\n"
)
LLAMA = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def tiny_tokenizer():
    """A BPE tokenizer of at most VOCAB tokens trained on :data:`TEXT`, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(TEXT.splitlines(), trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")


def tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A random model of ``family``: hrm_text, inkling2_loop (the text model) or llama (a retrofit source)."""
    from transformers import (
        HrmTextConfig,
        HrmTextForCausalLM,
        Inkling2LoopForCausalLM,
        Inkling2LoopTextConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.manual_seed(seed)
    if family == "hrm_text":
        return _randomise(HrmTextForCausalLM(HrmTextConfig(**HRM)), 0.1)
    if family == "inkling2_loop":
        return _randomise(Inkling2LoopForCausalLM(Inkling2LoopTextConfig(**INKLING)), 0.2)
    return _randomise(LlamaForCausalLM(LlamaConfig(**LLAMA)), 0.1)


def save_model_dir(family: str, path: Path, tokenizer: bool = True) -> Path:
    """Write a tiny model of ``family`` (and the tokenizer) into ``path`` with save_pretrained."""
    tiny_model(family).save_pretrained(path)
    if tokenizer:
        tiny_tokenizer().save_pretrained(path)
    return path


#: the published configs (test data: shared/reference_configs, as published), by family
PUBLISHED = Path(__file__).parent / "data" / "reference_configs"
#: tiny sizes for the families looplab builds, over their published config files
OURO_TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, max_position_embeddings=128, total_ut_steps=3)  # fmt: skip
HUGINN_TINY = dict(vocab_size=VOCAB, n_embd=32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=48,
                   block_size=128, n_layers_in_prelude=1, n_layers_in_recurrent_block=2, n_layers_in_coda=1,
                   mean_recurrence=4)  # fmt: skip
#: head_dim 16 while hidden / heads is 8, as the published model's 128 against 64
NANBEIGE_TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                     num_loops=2)  # fmt: skip
#: Parcae-140M's (2, 2, 2) blocks at width 32 (the value-embedding gate reads 32 channels)
PARCAE_TINY = dict(n_embd=32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64, vocab_size=VOCAB,
                   padded_vocab_size=64, block_size=128, recurrent_embedding_dimension=32,
                   recurrent_intermediation_embedding_dimension=48, mean_recurrence=4)  # fmt: skip
#: family → (published config file, tiny sizes) of the families looplab builds
OWN_FAMILIES = {
    "ouro": ("ouro-1.4b_config.json", OURO_TINY),
    "huginn": ("huginn-0125_raven_config_minimal.json", HUGINN_TINY),
    "nanbeige": ("nanbeige4.2-3b_config.json", NANBEIGE_TINY),
    "parcae": ("parcae-140m_config.json", PARCAE_TINY),
}


def published_config(family: str, **sizes) -> dict:
    """The published config.json of ``family`` (ouro: Ouro-1.4B's; huginn: Huginn-0125's; nanbeige:
    Nanbeige4.2-3B's) with ``sizes`` over it."""
    raw = json.loads((PUBLISHED / OWN_FAMILIES[family][0]).read_text())
    if family == "ouro" and "num_hidden_layers" in sizes:
        raw["layer_types"] = ["full_attention"] * sizes["num_hidden_layers"]
    return {**raw, **sizes}


def save_own_family(family: str, path: Path, seed: int = 0, tokenizer: bool = True, **sizes) -> Path:
    """A tiny random Ouro, Huginn, Nanbeige or Parcae model dir in the published layout: the published config.json
    with tiny sizes (:data:`OWN_FAMILIES`, then ``sizes``), the weights under the published names
    (model.safetensors, Huginn's tied head not stored; Parcae's, as its reference saves them, pytorch_model.bin
    by ``torch.save``), and the tokenizer (Parcae's lives apart: ``tokenizer=False`` and ``--tokenizer``)."""
    from safetensors.torch import save_file

    from looplab.lm.families import LOOPED_FAMILIES

    raw = published_config(family, **{**OWN_FAMILIES[family][1], **sizes})
    record = LOOPED_FAMILIES[raw.get("model_type", family)]
    torch.manual_seed(seed)
    model = record.model(record.config_reader(raw, "test"))
    with torch.no_grad():
        for parameter in model.parameters():  # norms off 1 and the gate's bias off 0, so their order shows
            parameter.add_(0.2 * torch.randn_like(parameter))
    path.mkdir(parents=True, exist_ok=True)
    if family == "parcae":
        torch.save(model.state_dict(), path / "pytorch_model.bin")
    else:
        skip = {"lm_head.weight"} if family == "huginn" else set()
        weights = {k: v.contiguous() for k, v in model.state_dict().items() if k not in skip}
        save_file(weights, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    if tokenizer:
        tiny_tokenizer().save_pretrained(path)
    return path
