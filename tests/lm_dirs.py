"""Tiny model directories for the model-dir tests: a random model of each family written by
``save_pretrained``, beside a small BPE tokenizer trained here on a few lines (nothing downloaded)."""

from __future__ import annotations

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
