"""int8 weights (``--weights int8``, :mod:`looplab.lm.int8`) on every model-dir family: the layer's arithmetic,
every linear layer but the head replaced, the quality line, generate / eval / lm-eval's model_args, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from looplab.cli import main  # noqa: E402
from looplab.errors import LooplabError  # noqa: E402
from looplab.generation import DecodeOptions, GenerationExit, generate  # noqa: E402
from looplab.generation.text_lm import open_text_lm  # noqa: E402
from looplab.lm.int8 import Int8Linear, output_heads  # noqa: E402
from tests.lm_dirs import TEXT, save_model_dir, save_own_family  # noqa: E402

FAMILIES = ("ouro", "huginn", "hrm_text", "inkling2_loop", "retrofit")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("int8")
    paths = {family: save_own_family(family, root / family) for family in ("ouro", "huginn")}
    paths.update({family: save_model_dir(family, root / family) for family in ("hrm_text", "inkling2_loop", "llama")})
    command = f"retrofit {paths['llama']} --prelude 1 --core 2 --coda 1 --injection mix --out {root / 'retrofit'}"
    assert main(command.split()) == 0
    paths["retrofit"] = root / "retrofit"
    return paths


def _kernels(layer: Int8Linear) -> list[Int8Linear]:
    """The layer as built (oneDNN's kernel where torch has it) and the same layer on ``_int_mm``."""
    fallback = Int8Linear.__new__(Int8Linear)
    fallback.__dict__ = {**layer.__dict__, "_buffers": dict(layer._buffers), "packed": None}
    return [layer, fallback]


def test_int8_linear_is_exact_on_numbers_it_can_hold():
    """Weights whose rows reach ±127 and inputs whose rows reach ±127, all integers: the int8 product is exact
    on either kernel."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (24, 40), generator=generator).float()
    weight[:, 0] = 127  # each row's scale is then exactly 1
    x = torch.randint(-127, 128, (3, 5, 40), generator=generator).float()
    x[..., 0] = -127
    linear = nn.Linear(40, 24)
    with torch.no_grad():
        linear.weight.copy_(weight)
    layer = Int8Linear(linear)
    assert layer.qweight.dtype == torch.int8
    for kernel in _kernels(layer):
        assert torch.equal(kernel(x), linear(x).detach())


def test_int8_linear_rows_do_not_depend_on_their_batch():
    """Each row is quantized on its own and accumulated in int32: a row alone equals it in any batch."""
    generator = torch.Generator().manual_seed(2)
    linear = nn.Linear(48, 40)
    x = torch.randn(6, 48, generator=generator) * torch.logspace(-2, 2, 6)[:, None]
    for kernel in _kernels(Int8Linear(linear)):
        together = kernel(x)
        assert all(torch.equal(kernel(x[i : i + 1]), together[i : i + 1]) for i in range(6))


def test_int8_linear_error_stays_within_its_rounding():
    """Real-valued weights and inputs: each output is off by at most the rounding of both factors."""
    generator = torch.Generator().manual_seed(1)
    linear = nn.Linear(64, 32, bias=False)
    x = torch.randn(7, 64, generator=generator)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(32, 64, generator=generator))
        exact = linear(x)
        got = Int8Linear(linear)(x)
    w_step = linear.weight.abs().amax(1) / 127  # [N]
    x_step = x.abs().amax(1, keepdim=True) / 127  # [M, 1]
    bound = 0.5 * (x.abs().sum(1, keepdim=True) * w_step + x_step * linear.weight.abs().sum(1)) + 0.25 * x_step * (
        w_step * 64
    )
    assert ((got - exact).abs() <= bound + 1e-5).all()
    assert not torch.equal(got, exact)  # it is a different computation


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_model_dir_replaces_every_linear_but_the_head_and_reports_its_cost(dirs, family):
    floating = open_text_lm(dirs[family])
    lm = open_text_lm(dirs[family], weights="int8")
    heads = {id(head) for head in output_heads(lm.model)}
    linears = [name for name, module in lm.model.named_modules() if isinstance(module, nn.Linear)]
    assert all(id(lm.model.get_submodule(name)) in heads for name in linears), linears
    replaced = sum(isinstance(module, Int8Linear) for module in lm.model.modules())
    assert replaced > 0 and f"int8 weights ({replaced} linear layers)" in lm.weights_note
    assert "greedy agreement" in lm.weights_note and f"at {lm.default_loops} loops" in lm.weights_note
    prompt = lm.encode(TEXT[:40])
    options = DecodeOptions(GenerationExit("fixed", lm.default_loops), "per_loop")
    ours, theirs = generate(lm.model, [prompt], 4, options), generate(floating.model, [prompt], 4, options)
    assert len(ours.tokens[0]) == 4 and all(0 <= token < lm.vocab_size for token in ours.tokens[0])
    # the first token's distribution is close to the float model's (a tiny model's logits are small numbers)
    assert abs(ours.logprobs[0][0] - theirs.logprobs[0][0]) < 0.5


def test_generate_and_eval_take_weights_int8(dirs, tmp_path, capsys):
    path = dirs["ouro"]
    code = main(["generate", str(path), "--prompt", TEXT[:30], "--json", "--max-new-tokens", "3", "--weights", "int8"])
    out = capsys.readouterr()
    assert code == 0 and "generate: int8 weights" in out.err
    assert len(json.loads(out.out.splitlines()[0])["token_ids"]) == 3
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 4)
    args = ["eval", str(path), "--text", str(text), "--window", "16", "--samples", "2", "--max-loops", "2"]
    assert main([*args, "--out", str(tmp_path / "int8"), "--weights", "int8"]) == 0
    summary = json.loads((tmp_path / "int8" / "lm_summary.json").read_text())
    assert summary["weights"] == "int8" and summary["int8_quality"]["layers"] > 0
    assert main([*args, "--out", str(tmp_path / "float")]) == 0
    reference = json.loads((tmp_path / "float" / "lm_summary.json").read_text())
    assert reference["weights"] == "float" and reference["int8_quality"] is None
    assert summary["loss_at_max_loops"] != reference["loss_at_max_loops"]
    assert abs(summary["loss_at_max_loops"] - reference["loss_at_max_loops"]) < 0.05


def test_lm_eval_model_arg_weights(dirs):
    from looplab.harness.model import LooplabLM

    model = LooplabLM(path=str(dirs["hrm_text"]), weights="int8", device="cpu", prefix_token=0)
    assert model.lm.weights_note is not None
    with pytest.raises(LooplabError, match=r"unknown model_arg weights 'int4'; valid choices: float, int8"):
        LooplabLM(path=str(dirs["hrm_text"]), weights="int4", device="cpu")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["generate", "{dir}", "--prompt", "a", "--weights", "int4"],
            "unknown --weights 'int4'; valid choices: float, int8",
        ),
        (["generate", "{run}", "--prompt", "a", "--weights", "int8"], "--weights applies to a model dir (config.json)"),
        (["serve", "{dir}", "--weights", "int8", "--device", "cuda"], "--weights int8 runs on the CPU (device cpu)"),
        (["serve", "{dir}", "--weights", "int8", "--replicas", "2"], "--weights int8 serves one process"),
        (["eval", "{dir}", "--text", "{dir}/config.json", "--weights", "fp8"], "unknown --weights 'fp8'"),
    ],
)
def test_bad_weights_are_one_line(dirs, tmp_path, capsys, args, message):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("")
    filled = [a.format(dir=dirs["ouro"], run=run) for a in args]
    assert main(filled) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
