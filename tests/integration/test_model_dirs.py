"""Model directories through the command line: ``looplab retrofit``, and ``eval`` / ``analyze`` on a tiny
random model of each family (HRM-Text, Inkling-2 loop, a retrofit of a Llama) written by save_pretrained
beside a tokenizer trained here (nothing downloaded). The loss ``eval`` writes at the native loop count
is transformers' own next-token loss on the same windows."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from looplab.cli import main  # noqa: E402
from looplab.lm.families import LOOPED_FAMILIES  # noqa: E402
from looplab.lm.model_dir import open_model_dir  # noqa: E402
from looplab.text.model_dirs import text_windows  # noqa: E402
from tests.lm_dirs import TEXT, save_model_dir  # noqa: E402

ATOL = 1e-5
FAMILIES = ("hrm_text", "inkling2_loop", "retrofit")
NATIVE = {"hrm_text": 3, "inkling2_loop": 3, "retrofit": 1}
WINDOW, SAMPLES = 16, 6


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """family → model dir (the retrofit written by ``looplab retrofit`` from a 4-layer Llama), and the text."""
    root = tmp_path_factory.mktemp("model_dirs")
    paths = {family: save_model_dir(family, root / family) for family in ("hrm_text", "inkling2_loop", "llama")}
    command = f"retrofit {paths['llama']} --prelude 1 --core 2 --coda 1 --injection mix --out {root / 'retrofit'}"
    assert main(command.split()) == 0
    paths["retrofit"] = root / "retrofit"
    (root / "text.txt").write_text(TEXT * 2, encoding="utf-8")
    paths["text"] = root / "text.txt"
    return paths


def _source(path, **config):
    """The transformers model a dir holds (a retrofit's: its source), float32, eager attention."""
    import transformers

    model_type = json.loads((path / "config.json").read_text())["model_type"]
    family = LOOPED_FAMILIES.get(model_type)
    name = family.model_types[model_type] if family is not None else "LlamaForCausalLM"
    cls = getattr(transformers, name)
    return cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager", **config).eval()


def test_every_native_family_has_a_loader():
    """transformers builds a family, or looplab does from its own config reader and model class."""
    import transformers

    for model_type, family in LOOPED_FAMILIES.items():
        name = family.model_types[model_type]
        assert (name is not None and hasattr(transformers, name)) or (family.model and family.config_reader)


def test_the_retrofit_dir_holds_safetensors_and_its_split(dirs):
    names = {p.name for p in dirs["retrofit"].iterdir()}
    assert {"config.json", "model.safetensors", "injection.safetensors", "retrofit.json", "tokenizer.json"} <= names
    assert not [name for name in names if name.endswith((".bin", ".pt", ".pth", ".pkl"))]
    split = json.loads((dirs["retrofit"] / "retrofit.json").read_text())
    assert (split["prelude"], split["core"], split["coda"], split["injection"], split["source_layers"]) == (
        1, 2, 1, "mix", 4,
    )  # fmt: skip


@pytest.mark.parametrize("injection", ["mix", "state"])
def test_the_retrofit_at_one_loop_of_every_layer_is_the_source(dirs, tmp_path, injection):
    out = tmp_path / injection
    assert (
        main(f"retrofit {dirs['llama']} --prelude 0 --core 4 --coda 0 --injection {injection} --out {out}".split()) == 0
    )
    looped = open_model_dir(out).load()
    source = _source(dirs["llama"])
    ids = torch.randint(0, 61, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    with torch.no_grad():
        reference = source(input_ids=ids, attention_mask=mask).logits
        logits = looped(ids, mask, loops=1)
    valid = mask.bool()
    assert (logits[valid] - reference[valid]).abs().max() <= ATOL
    with torch.no_grad():  # and more loops are a different model
        assert (looped(ids, mask, loops=2)[valid] - reference[valid]).abs().max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_text_writes_the_loss_by_loops_with_transformers_loss_at_the_native_count(dirs, tmp_path, family):
    out = tmp_path / "eval"
    max_loops = 2 * NATIVE[family]
    command = f"eval {dirs[family]} --text {dirs['text']} --window {WINDOW} --samples {SAMPLES} --dtype float32 "
    assert main((command + f"--max-loops {max_loops} --out {out}").split()) == 0
    frame = pd.read_csv(out / "lm_loops.csv")
    assert list(frame.columns) == ["loops", "loss", "tokens"]
    assert frame.loops.tolist() == list(range(1, max_loops + 1))
    assert (frame.tokens == SAMPLES * (WINDOW - 1)).all()
    assert (out / "lm_loops.png").is_file() and (out / "lm_summary.json").is_file()
    model_dir = open_model_dir(dirs[family])
    windows = text_windows(model_dir.tokenizer, TEXT * 2, WINDOW, SAMPLES, "text")
    with torch.no_grad():
        reference = float(_source(dirs[family] if family != "retrofit" else dirs["llama"])(
            input_ids=windows, labels=windows
        ).loss)  # fmt: skip
    native = float(frame.loss[frame.loops == NATIVE[family]].iloc[0])
    assert abs(native - reference) <= ATOL
    summary = json.loads((out / "lm_summary.json").read_text())
    assert summary["native_loops"] == NATIVE[family] and summary["loss_at_native_loops"] == pytest.approx(native)


@pytest.mark.parametrize("family", ["hrm_text", "inkling2_loop"])
def test_eval_text_at_another_loop_count_is_transformers_with_that_count(dirs, tmp_path, family):
    key = {"hrm_text": "H_cycles", "inkling2_loop": "loop_num_passes"}[family]
    out = tmp_path / "eval"
    command = f"eval {dirs[family]} --text {dirs['text']} --window {WINDOW} --samples 2 --max-loops 5 --out {out}"
    assert main([*command.split(), "--dtype", "float32"]) == 0
    windows = text_windows(open_model_dir(dirs[family]).tokenizer, TEXT * 2, WINDOW, 2, "text")
    with torch.no_grad():
        reference = float(_source(dirs[family], **{key: 5})(input_ids=windows, labels=windows, use_cache=False).loss)
    assert abs(float(pd.read_csv(out / "lm_loops.csv").loss.iloc[-1]) - reference) <= ATOL


def test_bfloat16_loads_one_copy_and_reads_nearly_the_same_loss(dirs, tmp_path):
    runs = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        command = f"eval {dirs['hrm_text']} --text {dirs['text']} --window {WINDOW} --samples 2 --dtype {dtype}"
        assert main((command + f" --max-loops 3 --out {out}").split()) == 0
        runs[dtype] = pd.read_csv(out / "lm_loops.csv").loss
    assert (runs["float32"] - runs["bfloat16"]).abs().max() < 0.05
    model = open_model_dir(dirs["hrm_text"]).load(torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("family", FAMILIES)
def test_analyze_mechanistic_and_spectral_write_their_files(dirs, tmp_path, family):
    text = f"--text {dirs['text']} --window 8 --samples 2 --loops {2 * NATIVE[family]}"
    mechanistic = tmp_path / "mechanistic"  # plots: in the next test (they cost seconds on a loaded CPU)
    assert main(f"analyze mechanistic {dirs[family]} {text} --no-plots --out {mechanistic}".split()) == 0
    for name in ("summary.json", "convergence.csv", "fixed_points.csv", "colsum.csv", "attention.csv", "massive.csv"):
        assert (mechanistic / name).is_file(), name
    summary = json.loads((mechanistic / "summary.json").read_text())
    assert summary["model_type"] and summary["loops"] == 2 * NATIVE[family] and summary["samples"] == 2
    assert len(summary["colsum"]["mlp_ablation"]) == len(open_model_dir(dirs[family]).load().core)
    holds = summary["lipschitz"]["holds_fraction"]
    # the bound applies to plain query/key maps with RoPE (the retrofit's Llama, HRM-Text), not to Inkling-2's
    assert holds is None if family == "inkling2_loop" else holds == 1.0
    spectral, loops = tmp_path / "spectral", max(2, NATIVE[family])  # a forward-mode JVP per power iteration
    text = f"--text {dirs['text']} --window 4 --samples 2 --loops {loops} --iters 2 --exact-at 1"
    assert main(f"analyze spectral {dirs[family]} {text} --out {spectral}".split()) == 0
    rho = pd.read_csv(spectral / "spectral.csv")
    assert len(rho) == 2 * loops and rho.rho_power.notna().all()
    assert (spectral / "spectral.png").is_file() and json.loads((spectral / "spectral.json").read_text())["rho_exact"]


def test_analysis_defaults_write_under_the_model_dir_with_plots(dirs, tmp_path):
    """Without --out, the analysis goes to DIR/analysis/mechanistic, at 4x the native loop count."""
    import shutil

    model = shutil.copytree(dirs["retrofit"], tmp_path / "retrofit")
    assert main(f"analyze {model} --text {dirs['text']} --window 8 --samples 1 --no-mlp-ablation".split()) == 0
    folder = model / "analysis" / "mechanistic"
    assert json.loads((folder / "summary.json").read_text())["loops"] == 4
    for plot in ("convergence.png", "cosine_matrix.png", "attention_difference.png", "colsum_depth.png"):
        assert (folder / plot).is_file(), plot


@pytest.mark.parametrize("family", FAMILIES)
def test_analyze_pca_traces_one_windows_loop_states(dirs, tmp_path, family, capsys):
    """The PCA of one window's states h_1..h_K: both plots, and three explained-variance ratios in (0, 1]
    that sum to at most 1."""
    out = tmp_path / "pca"
    args = f"analyze pca {dirs[family]} --text {dirs['text']} --window 6 --loops 3 --sample 1 --out {out}"
    assert main(args.split()) == 0
    assert (out / "pca_2d.png").is_file() and (out / "pca_3d.png").is_file()
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("explained variance"))
    ratios = [float(part.strip().rstrip("%")) / 100 for part in line.split(":")[1].split(",")]
    assert len(ratios) == 3 and all(0 < r <= 1 for r in ratios) and sum(ratios) <= 1 + 1e-6


@pytest.mark.parametrize(
    "flags, device, expected",
    [
        ("fpu sse avx512f amx_bf16 amx_tile", "cpu", "bfloat16"),
        ("fpu sse avx512f avx512_bf16", "cpu", "bfloat16"),
        ("fpu sse avx2 avx512f", "cpu", "float32"),  # bfloat16 emulated: float32 decodes faster
        ("fpu sse avx512f amx_bf16", "cuda", "float32"),
    ],
)
def test_a_model_dirs_default_dtype_is_bfloat16_only_where_the_cpu_has_it(monkeypatch, flags, device, expected):
    from looplab.lm import dtypes

    real = Path.read_text
    monkeypatch.setattr(
        Path,
        "read_text",
        lambda self, *a, **k: f"flags : {flags}\n" if str(self) == "/proc/cpuinfo" else real(self, *a, **k),
    )
    assert dtypes.default_dtype(device) == expected
    assert dtypes.default_dtype(device, "int8") == "float32"  # int8's quality is measured against float32


def test_a_command_without_dtype_loads_the_cpus_default(dirs, tmp_path, monkeypatch, capsys):
    """``eval`` without ``--dtype`` reads the weights in :func:`default_dtype`'s choice, and says so."""
    from looplab.lm import dtypes

    for native, name in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(dtypes, "native_bfloat16", lambda native=native: native)
        out = tmp_path / name
        command = f"eval {dirs['hrm_text']} --text {dirs['text']} --window {WINDOW} --samples 1 --max-loops 1"
        assert main([*command.split(), "--out", str(out)]) == 0
        assert json.loads((out / "lm_summary.json").read_text())["dtype"] == name
