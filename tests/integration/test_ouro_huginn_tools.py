"""Every command on an Ouro, a Huginn-0125, a Nanbeige4.2 and a Parcae model dir (tiny random checkpoints in the
published layout, tests/lm_dirs.py): ``eval --text`` (the loss by loops is the adapter's own), ``analyze
mechanistic``, ``analyze spectral`` (Parcae's injection radius beside the loop map's), ``analyze pca``,
``generate --json`` (the tokens of each prompt decoded alone), lm-eval's ``looplab`` model, ``looplab serve``,
a weights-only ``pytorch_model.bin`` and a tokenizer kept apart (``--tokenizer``). The STARS fine-tunes:
tests/integration/test_finetune_model_dir.py."""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from looplab.cli import main  # noqa: E402
from looplab.generation import generate  # noqa: E402
from looplab.generation.options import DecodeOptions
from looplab.lm.model_dir import open_model_dir  # noqa: E402
from looplab.text.model_dirs import text_windows  # noqa: E402
from looplab.token_exits import GenerationExit  # noqa: E402
from tests.lm_dirs import TEXT, save_own_family  # noqa: E402

FAMILIES = ("ouro", "huginn", "nanbeige", "parcae")
NATIVE = {"ouro": 3, "huginn": 4, "nanbeige": 2, "parcae": 4}
WINDOW, SAMPLES = 12, 3
PROMPTS = ["In the beginning God created", "And the earth", "And God said, Let there be light"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ouro_huginn")
    paths = {family: save_own_family(family, root / family) for family in FAMILIES}
    (root / "text.txt").write_text(TEXT * 4, encoding="utf-8")
    paths["text"] = root / "text.txt"
    return paths


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_text_reads_the_loss_by_loops_of_the_adapter(dirs, tmp_path, family):
    out, native = tmp_path / "eval", NATIVE[family]
    command = (
        f"eval {dirs[family]} --text {dirs['text']} --window {WINDOW} --samples {SAMPLES} --max-loops {2 * native} "
        "--dtype float32"
    )
    assert main((command + f" --out {out}").split()) == 0
    frame = pd.read_csv(out / "lm_loops.csv")
    assert frame.loops.tolist() == list(range(1, 2 * native + 1))
    model_dir = open_model_dir(dirs[family])
    windows = text_windows(model_dir.tokenizer, TEXT * 4, WINDOW, SAMPLES, "text")
    loop = model_dir.load()
    with torch.no_grad():
        logits = loop(windows, None, native)[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    assert float(frame.loss[frame.loops == native].iloc[0]) == pytest.approx(float(loss), abs=1e-5)
    assert json.loads((out / "lm_summary.json").read_text())["native_loops"] == native


@pytest.mark.parametrize("family", FAMILIES)
def test_analyze_mechanistic_spectral_and_pca_run(dirs, tmp_path, family, capsys):
    text = f"--text {dirs['text']} --window 8 --samples 2 --loops {NATIVE[family] + 1} --dtype float32"
    mechanistic = tmp_path / "mechanistic"
    assert main(f"analyze mechanistic {dirs[family]} {text} --no-plots --out {mechanistic}".split()) == 0
    summary = json.loads((mechanistic / "summary.json").read_text())
    assert summary["loops"] == NATIVE[family] + 1
    fixed = pd.read_csv(mechanistic / "fixed_points.csv")
    assert len(fixed) > 0 and fixed.select_dtypes("number").notna().any().any()
    spectral = tmp_path / "spectral"
    text = f"--text {dirs['text']} --window 4 --samples 2 --loops 2 --iters 2 --exact-at 1 --dtype float32"
    assert main(f"analyze spectral {dirs[family]} {text} --out {spectral}".split()) == 0
    rho = pd.read_csv(spectral / "spectral.csv")
    assert rho.rho_power.notna().all() and (rho.rho_power > 0).all()
    radius = json.loads((spectral / "spectral.json").read_text()).get("injection_radius")
    if family == "parcae":  # its injection's own recurrence, beside the loop map's: max(decay) < 1
        decay = open_model_dir(dirs[family]).load().injection_decay()
        assert radius == pytest.approx(float(decay.detach().max())) and 0 < radius < 1
        assert "the injection's own recurrence (its diagonal decay)" in capsys.readouterr().out
    else:
        assert radius is None
    pca = tmp_path / "pca"
    assert main(f"analyze pca {dirs[family]} --text {dirs['text']} --window 6 --loops 3 --out {pca}".split()) == 0
    assert (pca / "pca_2d.png").is_file()


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_json_gives_each_prompt_its_tokens_alone(dirs, capsys, family):
    prompts = [arg for prompt in PROMPTS for arg in ("--prompt", prompt)]
    capsys.readouterr()
    assert main(["generate", str(dirs[family]), *prompts, "--json", "--max-new-tokens", "4", "--dtype", "float32"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    loop = open_model_dir(dirs[family]).load()
    for row in rows:
        alone = generate(loop, [row["prompt_ids"]], 4, DecodeOptions(GenerationExit("fixed", NATIVE[family]), "none"))
        assert row["token_ids"] == alone.tokens[0] and row["loops"] == [NATIVE[family]] * 4


def test_the_gate_exit_from_the_command_line_takes_the_configs_threshold(dirs, capsys):
    capsys.readouterr()
    base = ["generate", str(dirs["ouro"]), "--prompt", PROMPTS[0], "--json", "--max-new-tokens", "6", "--exit", "gate"]
    assert main(base) == 0  # the published early_exit_threshold, 1.0: every token runs every loop
    assert json.loads(capsys.readouterr().out)["loops"] == [NATIVE["ouro"]] * 6
    assert main([*base, "--exit-param", "threshold=0.5"]) == 0
    early = json.loads(capsys.readouterr().out)["loops"]
    assert min(early) < NATIVE["ouro"]


@pytest.mark.parametrize("family", FAMILIES)
def test_lm_evals_looplab_model_scores_the_text_as_the_adapter(dirs, family):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from looplab.harness.model import LooplabLM

    # float32, as the adapter it is held to; the tiny tokenizer has no BOS
    lm = LooplabLM(path=str(dirs[family]), dtype="float32", loops=NATIVE[family], prefix_token=0)
    request = Instance("loglikelihood", {}, ("In the beginning", " God created the heaven"), 0)
    ((logprob, _),) = lm.loglikelihood([request])
    model_dir = open_model_dir(dirs[family])
    context = model_dir.tokenizer("In the beginning")["input_ids"]
    continuation = model_dir.tokenizer(" God created the heaven", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logp = model_dir.load()(ids, None, NATIVE[family]).double().log_softmax(-1)[0]
    expected = sum(float(logp[len(context) - 1 + i, token]) for i, token in enumerate(continuation))
    assert logprob == pytest.approx(expected, rel=1e-5)  # the cached decode against the whole forward, float32


@pytest.mark.parametrize(
    "family, extra",
    [
        ("ouro", {"exit": "gate", "threshold": 0.5}),
        ("huginn", {"loops": 6}),
        ("nanbeige", {"exit": "kl", "eps": 0.01}),
        ("parcae", {"exit": "argmax-stability", "steps": 2}),
    ],
)
def test_looplab_serve_answers_as_generate(dirs, family, extra):
    pytest.importorskip("fastapi")
    from looplab.generation.text_lm import open_text_lm
    from tests.integration.test_serve import client, serving

    lm = open_text_lm(dirs[family])
    with serving(lm) as (url, _):
        out = client(url).completions.create(
            model=dirs[family].name, prompt=PROMPTS[0], max_tokens=5, temperature=0, extra_body=extra
        )
    params = {key: value for key, value in extra.items() if key not in ("exit", "loops")}
    rule = lm.exit_rule(extra.get("exit", "fixed"), extra.get("loops", NATIVE[family]), **params)
    expected = generate(lm.model, [lm.encode(PROMPTS[0])], 5, DecodeOptions(rule))
    (choice,) = out.choices
    assert choice.looplab["token_ids"] == expected.tokens[0] and choice.looplab["loops"] == expected.depths[0]


def test_a_state_dict_file_and_a_tokenizer_kept_apart_generate_as_the_safetensors_dir(dirs, tmp_path, capsys):
    """``pytorch_model.bin`` (read by the weights-only loader) and ``--tokenizer DIR``: Parcae's layout."""
    from safetensors.torch import load_file

    apart = tmp_path / "apart"
    apart.mkdir()
    (apart / "config.json").write_text((dirs["nanbeige"] / "config.json").read_text())
    torch.save(load_file(dirs["nanbeige"] / "model.safetensors"), apart / "pytorch_model.bin")
    outputs = []
    for path, extra in ((dirs["nanbeige"], []), (apart, ["--tokenizer", str(dirs["nanbeige"])])):
        capsys.readouterr()
        assert main(["generate", str(path), "--prompt", PROMPTS[0], "--json", "--max-new-tokens", "4", *extra]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outputs[0] == outputs[1]


def test_a_parcae_dir_as_published_needs_its_tokenizer_named(dirs, tmp_path, capsys):
    """Parcae's checkpoints hold config.json (no model_type) and pytorch_model.bin, the tokenizer elsewhere."""
    import shutil

    published = tmp_path / "parcae"
    published.mkdir()
    for name in ("config.json", "pytorch_model.bin"):
        shutil.copy(dirs["parcae"] / name, published / name)
    assert main(["generate", str(published), "--prompt", PROMPTS[0], "--max-new-tokens", "2"]) == 2
    assert "give the folder holding it (--tokenizer DIR;" in capsys.readouterr().err
    outputs, losses, logprobs = [], [], []
    for path, tokenizer in ((dirs["parcae"], None), (published, str(dirs["parcae"]))):
        extra = [] if tokenizer is None else ["--tokenizer", tokenizer]
        capsys.readouterr()
        assert main(["generate", str(path), "--prompt", PROMPTS[0], "--json", "--max-new-tokens", "4", *extra]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["token_ids"])
        out = tmp_path / f"eval-{len(losses)}"
        command = f"eval {path} --text {dirs['text']} --window {WINDOW} --samples {SAMPLES} --max-loops 2 --out {out}"
        assert main([*command.split(), *extra]) == 0
        losses.append(pd.read_csv(out / "lm_loops.csv").loss.tolist())
        logprobs.append(_lm_eval_logprob(path, tokenizer))
    assert outputs[0] == outputs[1] and losses[0] == losses[1] and logprobs[0] == logprobs[1]


def _lm_eval_logprob(path, tokenizer) -> float | None:
    """lm-eval's looplab model (``tokenizer=DIR`` where given): one continuation's log-probability."""
    if importlib.util.find_spec("lm_eval") is None:
        return None
    from lm_eval.api.instance import Instance

    from looplab.harness.model import LooplabLM

    lm = LooplabLM(path=str(path), tokenizer=tokenizer, prefix_token=0)
    ((logprob, _),) = lm.loglikelihood([Instance("loglikelihood", {}, ("In the beginning", " God created"), 0)])
    return logprob
