"""Bad input to the commands on a model directory, table-driven: one line on stderr, exit code 2, no
traceback, and nothing written — neither the command's output nor any file under the test's folder.

Each case runs ``looplab.cli.main`` in this process on tiny directories made once (random models written
by save_pretrained beside a tokenizer trained here; nothing downloaded)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

pytest.importorskip("transformers")

from looplab.cli import main  # noqa: E402
from looplab.lm.model_dir import RetrofitSplit, open_model_dir  # noqa: E402
from looplab.lm.retrofit_dir import write_retrofit  # noqa: E402
from tests.lm_dirs import TEXT, published_config, save_model_dir, save_own_family, tiny_tokenizer  # noqa: E402


def _fake_model_dir(path: Path, config: dict, weights: str = "model.safetensors") -> None:
    """A directory with ``config`` as config.json, a placeholder weights file and the tiny tokenizer."""
    from safetensors.torch import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if weights.endswith(".safetensors"):
        save_file({"x": torch.zeros(1)}, str(path / weights))
    else:
        (path / weights).write_bytes(b"\x80\x04pickle")
    tiny_tokenizer().save_pretrained(path)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Model dirs of every bad kind, a good one of each kind, and texts, made once for all cases."""
    from transformers import HrmTextConfig

    root = tmp_path_factory.mktemp("bad_model_dirs")
    for family in ("hrm_text", "llama"):
        save_model_dir(family, root / family)
    write_retrofit(open_model_dir(root / "llama"), RetrofitSplit(1, 2, 1, "mix"), root / "retrofit")
    save_model_dir("hrm_text", root / "no_tokenizer", tokenizer=False)
    (root / "not_model").mkdir()
    (root / "not_model" / "notes.txt").write_text("a folder, not a model\n")
    _fake_model_dir(root / "gpt2", {"model_type": "gpt2"})
    hrm = json.loads((root / "hrm_text" / "config.json").read_text())
    _fake_model_dir(root / "pickled", hrm, weights="pytorch_model.bin")
    for name, (field, value) in HRM_BAD_FIELDS.items():
        _fake_model_dir(root / name, {**hrm, field: value})
    huge = HrmTextConfig(hidden_size=65536, intermediate_size=262144, num_hidden_layers=64, num_attention_heads=64)
    _fake_model_dir(root / "huge", huge.to_dict())
    (root / "bad_json").mkdir()
    (root / "bad_json" / "config.json").write_text("{ not json")
    shutil.copytree(root / "retrofit", root / "bad_split")
    (root / "bad_split" / "retrofit.json").write_text(json.dumps({"prelude": 1, "core": 2}))
    shutil.copytree(root / "retrofit", root / "no_injection")
    (root / "no_injection" / "injection.safetensors").unlink()
    shutil.copytree(root / "retrofit", root / "split_too_deep")
    (root / "split_too_deep" / "retrofit.json").write_text(
        json.dumps({"prelude": 1, "core": 40, "coda": 1, "injection": "mix"})
    )
    shutil.copytree(root / "retrofit", root / "split_dir")
    (root / "split_dir" / "retrofit.json").unlink()
    (root / "split_dir" / "retrofit.json").mkdir()
    shutil.copytree(root / "retrofit", root / "int_injection")
    width = open_model_dir(root / "llama").width
    save_file(
        {"weight": torch.zeros(width, 2 * width, dtype=torch.int32)}, root / "int_injection" / "injection.safetensors"
    )
    shutil.copytree(root / "hrm_text", root / "bad_tokenizer_json")
    (root / "bad_tokenizer_json" / "tokenizer_config.json").write_text("{ not json")
    _own_family_dirs(root)
    _broken_hrm_dirs(root)
    _shard_dirs(root)
    (root / "text.txt").write_text(TEXT * 2, encoding="utf-8")
    (root / "fake.gguf").write_bytes(b"GGUF but not really")
    (root / "latin1.txt").write_bytes("In the beginning Dieu créa".encode("latin-1"))
    (root / "short.txt").write_text("In the beginning\n", encoding="utf-8")
    (root / "a_file").write_text("not a directory\n")
    (root / "full").mkdir()
    (root / "full" / "kept.txt").write_text("an existing output\n")
    return root


#: dir name → (family, config field, a value outside its domain): each refused when the dir is opened
BAD_FIELDS = {
    "ouro_threshold_text": ("ouro", "early_exit_threshold", "0.5"),
    "ouro_threshold_null": ("ouro", "early_exit_threshold", None),
    "ouro_theta_text": ("ouro", "rope_theta", "10000"),
    "ouro_theta_null": ("ouro", "rope_theta", None),
    "ouro_theta_zero": ("ouro", "rope_theta", 0),
    "ouro_eps_negative": ("ouro", "rms_norm_eps", -1),
    "ouro_head_dim_zero": ("ouro", "head_dim", 0),
    "ouro_kv_heads_zero": ("ouro", "num_key_value_heads", 0),
    "ouro_loops_huge": ("ouro", "total_ut_steps", 100000),
    "ouro_loops_float": ("ouro", "total_ut_steps", 2.5),
    "ouro_layer_types": ("ouro", "layer_types", ["full_attention"] * 3),
    "ouro_act": ("ouro", "hidden_act", "gelu"),
    "huginn_base_text": ("huginn", "rope_base", "50000"),
    "huginn_eps_text": ("huginn", "norm_eps", "x"),
    "huginn_eps_negative": ("huginn", "norm_eps", -1),
    "huginn_noise": ("huginn", "test_time_noise", 0.5),
    "huginn_state_init": ("huginn", "state_init", "normal"),
    "huginn_recurrence_zero": ("huginn", "mean_recurrence", 0),
    "huginn_prelude_negative": ("huginn", "n_layers_in_prelude", -1),
    "nanbeige_ngrams": ("nanbeige", "emb_neighbor_num", 3),
    "nanbeige_hyper": ("nanbeige", "enable_hyper_connection", True),
    "nanbeige_depth_attention": ("nanbeige", "enable_depth_attention", True),
    "nanbeige_share_kv": ("nanbeige", "loop_share_kv", True),
    "nanbeige_loops_zero": ("nanbeige", "num_loops", 0),
    "nanbeige_loops_float": ("nanbeige", "num_loops", 1.5),
    "parcae_recurrence_zero": ("parcae", "mean_recurrence", 0),
    "parcae_recurrence_text": ("parcae", "mean_recurrence", "8"),
    "parcae_heads": ("parcae", "n_embd", 30),
    "parcae_other_class": ("parcae", "_class_name", "GPTConfig"),
}
#: dir name → (an HRM-Text config field transformers' families share, a value outside its domain)
HRM_BAD_FIELDS = {
    "hrm_theta_zero": ("rope_theta", 0),
    "hrm_theta_text": ("rope_theta", "10000"),
    "hrm_eps_negative": ("rms_norm_eps", -1),
    "hrm_kv_heads_zero": ("num_key_value_heads", 0),
}
#: what each such dir's one line says
BAD_FIELD_MESSAGES = {
    "ouro_threshold_text": "early_exit_threshold must be a number in (0, 1], got '0.5'",
    "ouro_threshold_null": "early_exit_threshold must be a number in (0, 1], got None",
    "ouro_theta_text": "rope_theta must be a finite number > 0, got '10000'",
    "ouro_theta_null": "rope_theta must be a finite number > 0, got None",
    "ouro_theta_zero": "rope_theta must be a finite number > 0, got 0",
    "ouro_eps_negative": "rms_norm_eps must be a finite number > 0, got -1",
    "ouro_head_dim_zero": "head_dim must be an integer ≥ 1 or null, got 0",
    "ouro_kv_heads_zero": "num_key_value_heads must be an integer ≥ 1 or null, got 0",
    "ouro_loops_huge": "total_ut_steps must be an integer in 1..4096, got 100000",
    "ouro_loops_float": "total_ut_steps must be an integer in 1..4096, got 2.5",
    "ouro_layer_types": "layer_types must list one type per layer (num_hidden_layers 24)",
    "ouro_act": "hidden_act must be one of 'silu', got 'gelu'",
    "huginn_base_text": "rope_base must be a finite number > 0, got '50000'",
    "huginn_eps_text": "norm_eps must be a finite number > 0, got 'x'",
    "huginn_eps_negative": "norm_eps must be a finite number > 0, got -1",
    "huginn_noise": "test_time_noise must be one of 0, 0.0, got 0.5",
    "huginn_state_init": "state_init must be one of 'like-init', got 'normal'",
    "huginn_recurrence_zero": "mean_recurrence must be an integer in 1..4096, got 0",
    "huginn_prelude_negative": "n_layers_in_prelude must be an integer ≥ 0, got -1",
    "nanbeige_ngrams": "emb_neighbor_num = 3 turns on n-gram embeddings, which the published Nanbeige4.2 does not use",
    "nanbeige_hyper": "enable_hyper_connection = True turns on hyper-connections",
    "nanbeige_depth_attention": "enable_depth_attention = True turns on depth attention",
    "nanbeige_share_kv": "loop_share_kv = True turns on keys and values shared across loops",
    "nanbeige_loops_zero": "num_loops must be an integer in 1..4096, got 0",
    "nanbeige_loops_float": "num_loops must be an integer in 1..4096, got 1.5",
    "parcae_recurrence_zero": "mean_recurrence must be an integer in 1..4096, got 0",
    "parcae_recurrence_text": "mean_recurrence must be an integer in 1..4096, got '8'",
    "parcae_heads": "n_embd (30) must be num_attention_heads (6) × an even head width",
    "parcae_other_class": "config.json names no model_type: it is not a transformers model config",
    "hrm_theta_zero": "config.json: rope_theta must be a finite number > 0, got 0",
    "hrm_theta_text": "config.json: rope_theta must be a finite number > 0, got '10000'",
    "hrm_eps_negative": "config.json: rms_norm_eps must be a finite number > 0, got -1",
    "hrm_kv_heads_zero": "config.json: num_key_value_heads must be an integer ≥ 1 or null, got 0",
}


def _own_family_dirs(root: Path) -> None:
    """Ouro and Huginn dirs, good and bad: a weight missing or mis-shaped, pickle only, no tokenizer, a
    remote-code-only model_type, a config field out of its domain."""
    from safetensors.torch import load_file, save_file

    for family in ("ouro", "huginn"):
        save_own_family(family, root / family)
    save_own_family("huginn", root / "huginn_no_tokenizer", tokenizer=False)
    save_own_family("parcae", root / "parcae_no_tokenizer", tokenizer=False)
    for name, content in (("ouro_not_tensors", {"step": 3}), ("ouro_foreign_pickle", {"w": Path("x")})):
        _fake_model_dir(root / name, published_config("ouro"), weights="pytorch_model.bin")
        torch.save(content, root / name / "pytorch_model.bin")  # an int; a Path, which the loader refuses
    weights = load_file(root / "ouro" / "model.safetensors")
    for name, change in (("ouro_missing", "drop"), ("ouro_misshaped", "shape")):
        shutil.copytree(root / "ouro", root / name)
        edited = dict(weights)
        if change == "drop":
            del edited["model.norm.weight"]
        else:
            edited["model.layers.1.mlp.up_proj.weight"] = torch.zeros(65, 32)
        save_file(edited, str(root / name / "model.safetensors"))
    _fake_model_dir(root / "ouro_pickled", published_config("ouro"), weights="pytorch_model.bin")
    remote = {"model_type": "raven_custom", "auto_map": {"AutoModelForCausalLM": "modeling.RavenForCausalLM"}}
    _fake_model_dir(root / "remote_only", remote)
    _fake_model_dir(root / "ouro_bad_config", published_config("ouro", num_attention_heads=0))
    for name, (family, field, value) in BAD_FIELDS.items():
        _fake_model_dir(root / name, published_config(family, **{field: value}))
    _fake_model_dir(root / "ouro_sliding", published_config("ouro", use_sliding_window=True))


def _broken_hrm_dirs(root: Path) -> None:
    """HRM-Text dirs (a family transformers builds) with broken weights or config."""
    from safetensors.torch import load_file, save_file

    weights = load_file(root / "hrm_text" / "model.safetensors")
    edits = {
        "hrm_no_head": lambda w: {k: v for k, v in w.items() if k != "lm_head.weight"},
        "hrm_misshaped": lambda w: {**w, "lm_head.weight": torch.zeros(7, 32)},
        "hrm_nan": lambda w: {**w, "lm_head.weight": torch.full_like(w["lm_head.weight"], float("nan"))},
        "hrm_int8": lambda w: {**w, "lm_head.weight": w["lm_head.weight"].to(torch.int8)},
    }
    for name, edit in edits.items():
        shutil.copytree(root / "hrm_text", root / name)
        save_file(edit(weights), str(root / name / "model.safetensors"))
    shutil.copytree(root / "hrm_text", root / "hrm_truncated")
    data = (root / "hrm_text" / "model.safetensors").read_bytes()
    (root / "hrm_truncated" / "model.safetensors").write_bytes(data[: len(data) // 2])
    shutil.copytree(root / "hrm_text", root / "hrm_empty")
    (root / "hrm_empty" / "model.safetensors").write_bytes(b"")
    shutil.copytree(root / "hrm_text", root / "hrm_and_run")
    (root / "hrm_and_run" / "config.toml").write_text("[task]\nname = 'addition'\n")
    shutil.copytree(root / "hrm_text", root / "hrm_no_cycles")
    config = json.loads((root / "hrm_text" / "config.json").read_text())
    (root / "hrm_no_cycles" / "config.json").write_text(json.dumps({**config, "H_cycles": 0}))


def _shard_dirs(root: Path) -> None:
    """Sharded Ouro and HRM-Text dirs whose index points outside the dir or at the wrong shard, and dirs where
    a stray file repeats a key."""
    from safetensors.torch import load_file, save_file

    for family in ("ouro", "hrm_text"):
        weights = load_file(root / family / "model.safetensors")
        keys = sorted(weights)
        halves = {"part-1.safetensors": keys[: len(keys) // 2], "part-2.safetensors": keys[len(keys) // 2 :]}
        maps = {
            "outside": {key: "../ouro/model.safetensors" for key in keys},
            "absolute": {key: "/etc/passwd" for key in keys},
            "wrong": {key: name for name, part in zip(reversed(list(halves)), halves.values()) for key in part},
        }
        for kind, weight_map in maps.items():
            folder = root / f"{family}_shard_{kind}"
            shutil.copytree(root / family, folder)
            (folder / "model.safetensors").unlink()
            for name, part in halves.items():
                save_file({key: weights[key] for key in part}, str(folder / name))
            (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        folder = root / f"{family}_stray_copy"
        shutil.copytree(root / family, folder)
        save_file({keys[0]: torch.zeros_like(weights[keys[0]])}, str(folder / "stray.safetensors"))


def snapshot(directory: Path) -> dict[str, str]:
    """Content hash of every file under ``directory``."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


TEXT_ARG = "--text {root}/text.txt"
#: (command, the text its one line contains)
CASES = [
    # ---- what the directory is
    (f"eval {{root}}/not_model {TEXT_ARG} --out {{new}}", "not_model is not a model dir (no config.json"),
    (f"eval {{root}}/missing {TEXT_ARG} --out {{new}}", "model dir not found:"),
    (f"eval {{root}}/a_file {TEXT_ARG} --out {{new}}", "a_file is a file, not a model dir"),
    (f"eval {{root}}/no_tokenizer {TEXT_ARG} --out {{new}}", "holds no tokenizer (tokenizer.json / tokenizer_config"),
    (
        f"eval {{root}}/gpt2 {TEXT_ARG} --out {{new}}",
        "holds model_type 'gpt2', which looplab does not loop; supported: hrm_text, huginn_raven, inkling2_loop, "
        "inkling2_loop_text, nanbeige, ouro, parcae (native looped LMs; parcae by _class_name ParcaeConfig), and "
        "retrofits of llama, mistral, olmo2, qwen2, qwen3",
    ),
    # ---- broken weights and configs (a family transformers builds)
    (f"eval {{root}}/hrm_no_head {TEXT_ARG} --out {{new}}", "lacks 1 weight(s) the model needs: lm_head.weight"),
    (
        f"eval {{root}}/hrm_misshaped {TEXT_ARG} --out {{new}}",
        "weight lm_head.weight has shape [7, 32], the config needs [61, 32]",
    ),
    (f"eval {{root}}/hrm_nan {TEXT_ARG} --out {{new}}", "weight lm_head.weight holds NaN or infinite values"),
    (f"eval {{root}}/hrm_int8 {TEXT_ARG} --out {{new}}", "weight lm_head.weight is stored as I8 in model.safetensors"),
    (f"eval {{root}}/hrm_truncated {TEXT_ARG} --out {{new}}", "model.safetensors is not a readable safetensors file"),
    (f"eval {{root}}/hrm_empty {TEXT_ARG} --out {{new}}", "model.safetensors is not a readable safetensors file"),
    (f"eval {{root}}/hrm_and_run {TEXT_ARG} --out {{new}}", "holds both config.json (a model dir) and config.toml"),
    (f"eval {{root}}/hrm_no_cycles {TEXT_ARG} --out {{new}}", "the model runs 0 loops by itself (HRM-Text"),
    ("generate {root}/hrm_nan --prompt In --json", "weight lm_head.weight holds NaN or infinite values"),
    ("generate {root}/hrm_no_head --prompt In", "lacks 1 weight(s) the model needs: lm_head.weight"),
    ("generate {root}/huginn --prompt In --decoder wavefront", "a coda (1 layers) would read their unfinished states"),
    (
        "generate {root}/huginn --prompt In --exit kl --decoder depth",
        "the kl exit reads each loop's logits, which follow the coda (1 layers)",
    ),
    ("generate {root}/ouro --prompt In --exit gate --decoder speculative", "use the fixed exit, not gate"),
    # ---- shards: inside the dir, each key once, where the index says
    *[
        (f"eval {{root}}/{family}_shard_{kind} {TEXT_ARG} --out {{new}}", message)
        for family in ("ouro", "hrm_text")
        for kind, message in (
            ("outside", "to ../ouro/model.safetensors, outside"),
            ("absolute", "to /etc/passwd, outside"),
            ("wrong", "but part-1.safetensors holds it"),
        )
    ],
    (f"eval {{root}}/ouro_stray_copy {TEXT_ARG} --out {{new}}", "is stored twice, in"),
    (f"eval {{root}}/hrm_text_stray_copy {TEXT_ARG} --out {{new}}", "is stored twice, in"),
    # ---- Ouro and Huginn dirs
    (f"eval {{root}}/remote_only {TEXT_ARG} --out {{new}}", "model_type 'raven_custom', which looplab does not loop"),
    (f"eval {{root}}/ouro_missing {TEXT_ARG} --out {{new}}", "lacks 1 weight(s) the model needs: model.norm.weight"),
    (
        f"eval {{root}}/ouro_misshaped {TEXT_ARG} --out {{new}}",
        "weight model.layers.1.mlp.up_proj.weight has shape [65, 32] in model.safetensors, the config needs [64, 32]",
    ),
    (
        f"eval {{root}}/ouro_pickled {TEXT_ARG} --out {{new}}",
        "pytorch_model.bin is not a weights-only PyTorch state dict",
    ),
    (
        f"eval {{root}}/huginn_no_tokenizer {TEXT_ARG} --out {{new}}",
        "give the folder holding it (--tokenizer DIR; lm-eval",
    ),
    ("generate {root}/parcae_no_tokenizer --prompt In", "holds no tokenizer (tokenizer.json / tokenizer_config.json"),
    (
        f"eval {{root}}/huginn_no_tokenizer {TEXT_ARG} --tokenizer {{root}}/ouro/model.safetensors --out {{new}}",
        "/ouro/model.safetensors is not a directory (one holding tokenizer.json)",
    ),
    (
        "generate {root}/huginn_no_tokenizer --prompt In --tokenizer {root}/huginn_no_tokenizer",
        "huginn_no_tokenizer holds no tokenizer (tokenizer.json / tokenizer_config.json",
    ),
    (
        f"eval {{root}}/ouro_not_tensors {TEXT_ARG} --out {{new}}",
        "holds something other than a map of names to tensors",
    ),
    (f"eval {{root}}/ouro_foreign_pickle {TEXT_ARG} --out {{new}}", "is not a weights-only PyTorch state dict"),
    (
        f"eval {{root}}/ouro_bad_config {TEXT_ARG} --out {{new}}",
        "num_attention_heads must be an integer ≥ 1, got 0",
    ),
    (f"eval {{root}}/ouro_sliding {TEXT_ARG} --out {{new}}", "sliding-window layers are not supported"),
    *[(f"eval {{root}}/{name} {TEXT_ARG} --out {{new}}", message) for name, message in BAD_FIELD_MESSAGES.items()],
    *[
        (f"{command} {{root}}/{name} {flags}", BAD_FIELD_MESSAGES[name])
        for name in ("ouro_theta_text", "huginn_noise", "ouro_loops_huge")
        for command, flags in (("generate", "--prompt In"), ("serve", "--port 0"))
    ],
    (f"eval {{root}}/huginn {TEXT_ARG} --max-loops 4097 --out {{new}}", "--max-loops must lie in 1..4096"),
    ("generate {root}/ouro --prompt In --loops 5000", "loops: must be an integer in 1..4096, got 5000"),
    ("generate {root}/ouro --prompt In --exit gate --exit-param threshold=0", "threshold"),
    ("generate {root}/ouro --prompt In --exit gate --exit-param threshold=1.5", "threshold"),
    (
        "generate {root}/huginn --prompt In --exit gate",
        "the gate exit reads a learned exit gate, which huginn_raven lacks",
    ),
    (
        "generate {root}/ouro --prompt In --exit gate --read-only-exit --batching depth",
        "read_only_exit: a parameter of the step decoder; this request chooses exit gate, cache per_loop, "
        "decoder depth",
    ),
    (
        "generate {root}/huginn --prompt In --exit entropy-diff --batching depth",
        "the entropy-diff exit reads each loop's",
    ),
    (
        f"eval {{root}}/pickled {TEXT_ARG} --out {{new}}",
        "as pytorch_model.bin (pickle); looplab reads safetensors only",
    ),
    (f"eval {{root}}/bad_json {TEXT_ARG} --out {{new}}", "bad_json/config.json is not valid JSON (line 1"),
    (f"eval {{root}}/bad_split {TEXT_ARG} --out {{new}}", "retrofit.json is not a retrofit description"),
    (f"eval {{root}}/no_injection {TEXT_ARG} --out {{new}}", "is a retrofit without its injection.safetensors"),
    (f"eval {{root}}/split_too_deep {TEXT_ARG} --out {{new}}", "split_too_deep/retrofit.json: a retrofit split"),
    (f"eval {{root}}/split_dir {TEXT_ARG} --out {{new}}", "split_dir/retrofit.json is not a file"),
    (f"eval {{root}}/int_injection {TEXT_ARG} --out {{new}}", "its weight is stored as I32"),
    (
        f"eval {{root}}/bad_tokenizer_json {TEXT_ARG} --out {{new}}",
        "bad_tokenizer_json/tokenizer_config.json is not valid JSON",
    ),
    (f"eval {{root}}/llama {TEXT_ARG} --out {{new}}", "is a llama model, not a looped one: make one of it with"),
    (
        f"eval {{root}}/huge {TEXT_ARG} --dtype float32 --out {{new}}",
        "(6,960.6 B parameters in float32, 25,930.13 GiB) needs an estimated",
    ),
    (f"eval {{root}}/huge {TEXT_ARG} --dtype bfloat16 --out {{new}}", "more than the"),
    (f"analyze {{root}}/huge {TEXT_ARG} --out {{new}}", "needs an estimated"),
    # ---- loops, windows, samples, flags
    (f"eval {{root}}/hrm_text {TEXT_ARG} --max-loops 0 --out {{new}}", "--max-loops must lie in 1..4096"),
    (f"eval {{root}}/hrm_text {TEXT_ARG} --max-loops 4097 --out {{new}}", "--max-loops must lie in 1..4096"),
    (f"analyze {{root}}/hrm_text {TEXT_ARG} --loops 0 --out {{new}}", "--loops must lie in 1..4096"),
    (f"analyze spectral {{root}}/retrofit {TEXT_ARG} --loops 5000 --out {{new}}", "--loops must lie in 1..4096"),
    (f"eval {{root}}/hrm_text {TEXT_ARG} --window 1 --out {{new}}", "--window must lie in 2..64 tokens"),
    (f"eval {{root}}/hrm_text {TEXT_ARG} --window 65 --out {{new}}", "--window must lie in 2..64 tokens"),
    (f"eval {{root}}/hrm_text {TEXT_ARG} --samples 0 --out {{new}}", "--samples must be >= 1"),
    (f"eval {{root}}/hrm_text {TEXT_ARG} --device cuda:99 --out {{new}}", "--device 'cuda:99'"),
    (f"eval {{root}}/hrm_text {TEXT_ARG} --dtype float16 --out {{new}}", "invalid choice: 'float16'"),
    (f"eval {{root}}/hrm_text {TEXT_ARG} --lengths 4 --out {{new}}", "only a looplab run dir (config.toml) takes"),
    (f"analyze spectral {{root}}/hrm_text {TEXT_ARG} --length 4 --out {{new}}", "takes --length"),
    (f"analyze {{root}}/hrm_text {TEXT_ARG} --set model.d_model=8 --out {{new}}", "takes --set"),
    (f"analyze {{root}}/hrm_text {TEXT_ARG} --zero-mlp core9 --out {{new}}", "unknown MLP to zero 'core9'"),
    (f"analyze spectral {{root}}/hrm_text {TEXT_ARG} --exact-at 9 --loops 4 --out {{new}}", "lie outside 1..4"),
    ("analyze pca {root}/hrm_text --out {new}", "give --text FILE"),
    (f"analyze pca {{root}}/hrm_text {TEXT_ARG} --sample 99 --out {{new}}", "--sample 99:"),
    (f"analyze pca {{root}}/hrm_text {TEXT_ARG} --sample -1 --out {{new}}", "--sample must be >= 0"),
    (f"analyze pca {{root}}/hrm_text {TEXT_ARG} --length 4 --out {{new}}", "takes --length"),
    # ---- the text
    ("eval {root}/hrm_text --out {new}", "give --text FILE"),
    ("eval {root}/hrm_text --text {root}/latin1.txt --out {new}", "latin1.txt is not UTF-8 text (byte 24)"),
    ("eval {root}/hrm_text --text {root}/missing.txt --out {new}", "--text not found"),
    ("eval {root}/hrm_text --text {root} --out {new}", "is a directory, not a text file"),
    (
        "eval {root}/hrm_text --text {root}/short.txt --window 16 --out {new}",
        "tokens under the model's tokenizer, shorter than one window of 16 (--window)",
    ),
    ("analyze {root}/hrm_text --text {root}/short.txt --out {new}", "shorter than one window of 64"),
    ("eval {root}/hrm_text --text  --out {new}", "text must not be empty"),
    # ---- outputs
    (f"eval {{root}}/hrm_text {TEXT_ARG} --out {{root}}/a_file", "is a file; give a directory"),
    (f"eval {{root}}/hrm_text {TEXT_ARG} --out {{root}}/llama", "is a model dir (it holds config.json)"),
    (f"analyze {{root}}/hrm_text {TEXT_ARG} --out {{root}}/retrofit", "is a model dir (it holds config.json)"),
    # ---- retrofit
    (
        "retrofit {root}/llama --prelude 2 --core 2 --coda 1 --injection mix --out {new}",
        "prelude + core + coda <= 4, the source's layer count; got (2, 2, 1)",
    ),
    ("retrofit {root}/llama --prelude -1 --core 2 --coda 1 --injection mix --out {new}", "got (-1, 2, 1)"),
    ("retrofit {root}/llama --prelude 0 --core 0 --coda 0 --injection mix --out {new}", "--core >= 1"),
    ("retrofit {root}/llama --prelude 0 --core 4 --coda 0 --injection random --out {new}", "invalid choice: 'random'"),
    ("retrofit {root}/llama --prelude 0 --core 4 --coda 0 --injection mix --out {root}/full", "is not empty"),
    ("retrofit {root}/llama --prelude 0 --core 4 --coda 0 --injection mix --out {root}/a_file", "is a file"),
    ("retrofit {root}/hrm_text --prelude 0 --core 1 --coda 0 --injection mix --out {new}", "is a native looped LM"),
    ("retrofit {root}/retrofit --prelude 0 --core 1 --coda 0 --injection mix --out {new}", "is already a retrofit"),
    ("retrofit {root}/not_model --prelude 0 --core 1 --coda 0 --injection mix --out {new}", "is not a model dir"),
    ("retrofit {root}/gpt2 --prelude 0 --core 1 --coda 0 --injection mix --out {new}", "model_type 'gpt2'"),
    ("retrofit {root}/fake.gguf --prelude 0 --core 1 --coda 0 --injection mix --out {new}", "as a GGUF model"),
    ("retrofit {root}/missing.gguf --prelude 0 --core 1 --coda 0 --injection mix --out {new}", "GGUF file not found"),
    ("retrofit {root}/llama --prelude 0 --core 4 --coda 0 --out {new}", "required: --injection"),
]


@pytest.mark.parametrize("template, message", CASES, ids=[c[0].split(" --")[0] for c in CASES])
def test_bad_model_dir_input_is_one_line_and_harmless(world, tmp_path, capsys, template, message):
    new = tmp_path / "new"
    args = template.format(root=world, new=new).split(" ")  # "--text  --out" gives an empty argument
    before = snapshot(world)
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("looplab: error: "), err
    assert message in lines[0], lines[0]
    assert "Traceback" not in err
    assert not new.exists(), "a refused command wrote its output"
    assert snapshot(world) == before, "a refused command wrote into the world"


def test_the_table_covers_every_kind_of_bad_input():
    assert len(CASES) >= 63
