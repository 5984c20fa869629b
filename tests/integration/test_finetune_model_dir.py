"""Fine-tuning a model dir (``model.pretrained``) as a looplab run: the STARS recipe of the preset
``model-dir/stars`` (log-normal loops + the JSRR penalty) on a tiny HRM-Text, Inkling-2 loop, Ouro, Huginn and a
retrofit of a Llama whose embedding is tied to its head (as SmolLM2's), on a tiny repeated text read with the dir's
own tokenizer (task ``text``). Each run's loss falls, its checkpoints hold safetensors only (the tied tensor
once), a run stopped halfway resumes to the same weights and optimizer state bit for bit, ``looplab eval``
reads the result, and its checkpoint reloads into the adapter with the same logits. Bad input is refused in
one line before anything is written. Nothing is downloaded: the dirs are random models written by
save_pretrained beside a tokenizer trained here (tests/lm_dirs.py)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")

from looplab.cli import main  # noqa: E402
from looplab.config import load_config  # noqa: E402
from looplab.config.schema import PRESETS  # noqa: E402
from looplab.experiment import Experiment, check_config  # noqa: E402
from looplab.rundir import read_log  # noqa: E402
from looplab.text.evaluate import lm_loss_by_loops  # noqa: E402
from looplab.train.trainer import train  # noqa: E402
from tests.lm_dirs import LLAMA, TEXT, save_model_dir, save_own_family, tiny_tokenizer  # noqa: E402
from tests.unit.test_native_looped import _randomise  # noqa: E402

FAMILIES = ("hrm_text", "inkling2_loop", "retrofit", "ouro", "huginn", "nanbeige", "parcae")
PRESET = "model-dir/stars"
STEPS, WINDOW, SAMPLES = 6, 16, 16


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny dir of each family (the retrofit by ``looplab retrofit`` from a tied Llama, which stays as a
    source that is not looped) and the texts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("finetune_dirs")
    for family in ("hrm_text", "inkling2_loop"):
        save_model_dir(family, root / family)
    for family in ("ouro", "huginn", "nanbeige", "parcae"):
        save_own_family(family, root / family)
    save_own_family("ouro", root / "ouro_small_vocab", vocab_size=40)  # the tokenizer has 61 tokens
    torch.manual_seed(0)
    _randomise(LlamaForCausalLM(LlamaConfig(**LLAMA, tie_word_embeddings=True)), 0.1).save_pretrained(root / "llama")
    tiny_tokenizer().save_pretrained(root / "llama")
    command = f"retrofit {root / 'llama'} --prelude 1 --core 2 --coda 1 --injection mix --out {root / 'retrofit'}"
    assert main(command.split()) == 0
    save_own_family("parcae", root / "parcae_apart", tokenizer=False)  # its published layout: the tokenizer apart
    (root / "text.txt").write_text(TEXT * 4, encoding="utf-8")
    (root / "short.txt").write_text("In the beginning\n", encoding="utf-8")
    return root


def _overrides(root, family: str, steps: int = STEPS) -> list[str]:
    """The preset at test scale: windows of 16 tokens of the tiny text, loops in 1..4 read at 2, JSRR on one row."""
    return [
        f"model.pretrained={root / family}",
        f"task.text_file={root / 'text.txt'}",
        f"task.train_min={WINDOW}",
        f"task.train_max={WINDOW}",
        f"task.eval_lengths=[{WINDOW}]",
        f"train.steps={steps}",
        "train.batch_size=4",
        "train.lr=3e-2",
        "train.warmup_steps=0",
        "train.log_every=1",
        f"train.checkpoint_every={steps // 2}",
        "schedule.mu=0.7",
        "schedule.hi=4",
        "schedule.depth=2",
        "eval.max_loops=4",
        f"eval.samples={SAMPLES}",
        "eval.exits.fixed.depth=2",
        "stability.jsrr.rows=1",
        "run.threads=1",
    ]


def _checkpoint(run_dir, step: int):
    return run_dir / "checkpoints" / f"step_{step:07d}"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stars_fine_tune_of_a_model_dir_learns_resumes_bit_for_bit_and_evaluates(world, tmp_path, family):
    config = load_config(PRESET, _overrides(world, family))
    untrained = Experiment.build(config)
    before = lm_loss_by_loops(untrained.model, untrained.task, WINDOW, SAMPLES, 4, config.run.seed)
    straight = tmp_path / "straight"
    trained = train(config, straight, progress=False)
    log = read_log(straight)
    assert [r["step"] for r in log] == list(range(1, STEPS + 1))
    assert all(r["jsrr"] > 0 for r in log), "the JSRR penalty ran on every step"
    files = {p.name for p in _checkpoint(straight, STEPS).iterdir()}
    assert files == {"model.safetensors", "optimizer.safetensors", "optimizer.json", "state.json"}

    assert main(["eval", str(straight)]) == 0  # validation loss at 1..eval.max_loops, the same windows
    after = pd.read_csv(straight / "eval" / "lm_loops.csv")
    assert after.loops.tolist() == before.loops.tolist() == [1, 2, 3, 4]
    drop = before.loss - after.loss
    assert (drop > 0.1).all(), (before.loss.tolist(), after.loss.tolist())

    stopped = tmp_path / "stopped"  # the run dir of a run killed just after its halfway checkpoint
    shutil.copytree(straight, stopped)
    shutil.rmtree(_checkpoint(stopped, STEPS))
    train(load_config(PRESET, _overrides(world, family)), stopped, progress=False)
    for file in ("model.safetensors", "optimizer.safetensors"):
        expected, resumed = (load_file(_checkpoint(run, STEPS) / file) for run in (straight, stopped))
        assert expected.keys() == resumed.keys()
        assert all(torch.equal(expected[name], resumed[name]) for name in expected), file
    assert [r["loss"] for r in read_log(stopped)] == [r["loss"] for r in log]

    reloaded = Experiment.from_run(straight)
    ids = torch.randint(0, 61, (2, WINDOW), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded.model(ids, loops=3), trained.model(ids, loops=3))


@pytest.mark.parametrize("family", ["ouro", "huginn", "hrm_text"])
def test_a_lora_fine_tune_trains_the_adapters_alone_and_resumes_bit_for_bit(world, tmp_path, family):
    """STARS through LoRA (``train.adapter = "lora"``, rank 4): the loss falls, the dir's weights do not
    move, a checkpoint holds the adapters alone, a run stopped halfway resumes to the same adapters and
    optimizer state, and the run reloads (dir + adapters) to the same logits."""
    sets = [*_overrides(world, family), "train.adapter=lora", "train.adapter_rank=4", "train.adapter_alpha=8"]
    config = load_config(PRESET, sets)
    source = Experiment.build(load_config(PRESET, _overrides(world, family)))
    straight = tmp_path / "straight"
    trained = train(config, straight, progress=False)
    before = lm_loss_by_loops(source.model, source.task, WINDOW, SAMPLES, 4, config.run.seed)
    after = lm_loss_by_loops(trained.model, trained.task, WINDOW, SAMPLES, 4, config.run.seed)
    drop = before.loss - after.loss  # a few steps of the adapters alone: less than a full fine-tune moves
    assert (drop > 0).all() and drop.max() > 0.1, (before.loss.tolist(), after.loss.tolist())
    saved = load_file(_checkpoint(straight, STEPS) / "model.safetensors")
    assert saved and all("lora_" in key for key in saved), sorted(saved)[:3]
    base = {k: v for k, v in trained.model.state_dict().items() if "lora_" not in k}
    expected = {k.replace(".base_layer", ""): v for k, v in base.items()}
    assert all(torch.equal(expected[k], v) for k, v in source.model.state_dict().items())
    trainable = [name for name, p in trained.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)

    stopped = tmp_path / "stopped"
    shutil.copytree(straight, stopped)
    shutil.rmtree(_checkpoint(stopped, STEPS))
    train(load_config(PRESET, sets), stopped, progress=False)
    for file in ("model.safetensors", "optimizer.safetensors"):
        expected_file, resumed = (load_file(_checkpoint(run, STEPS) / file) for run in (straight, stopped))
        assert expected_file.keys() == resumed.keys()
        assert all(torch.equal(expected_file[name], resumed[name]) for name in expected_file), file

    reloaded = Experiment.from_run(straight)
    ids = torch.randint(0, 61, (2, WINDOW), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded.model(ids, loops=2), trained.model(ids, loops=2))
        assert not torch.equal(reloaded.model(ids, loops=2), source.model(ids, loops=2))


def _stored_keys(folder) -> set[str]:
    from looplab.lm.weights import stored_headers

    return set(stored_headers(folder))


@pytest.mark.parametrize("family", FAMILIES)
def test_export_writes_the_run_back_in_the_published_layout(world, tmp_path, family, capsys):
    """``looplab export``: the exported dir holds the published key set, opens as a model dir of its family,
    and gives the run's logits bit for bit (a retrofit's W_I included)."""
    from looplab.lm.model_dir import open_model_dir

    run = tmp_path / "run"
    train(load_config(PRESET, _overrides(world, family, steps=2)), run, progress=False)
    out = tmp_path / "exported"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert f"-> {out}" in capsys.readouterr().out
    # Parcae's reference pickles its tied head beside the embedding; export writes safetensors, each tensor once
    tied_twice = {"lm_head.weight"} if family == "parcae" else set()
    assert _stored_keys(out) == _stored_keys(world / family) - tied_twice
    exported = open_model_dir(out).load(torch.float32, eager_experts=True)  # the run's dtype and expert loop
    ours = Experiment.from_run(run).model
    ids = torch.randint(0, 61, (2, WINDOW), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(exported(ids, loops=3), ours(ids, loops=3))


def test_export_merges_lora_adapters_and_loads_in_transformers(world, tmp_path):
    from transformers import AutoModelForCausalLM

    from looplab.lm.model_dir import open_model_dir
    from looplab.text.export import export_run

    run = tmp_path / "run"
    sets = [*_overrides(world, "hrm_text", steps=2), "train.adapter=lora", "train.adapter_rank=4"]
    train(load_config(PRESET, sets), run, progress=False)
    out = tmp_path / "exported"
    written = export_run(run, out)
    assert written["merged"] > 0
    assert _stored_keys(out) == _stored_keys(world / "hrm_text")  # no adapter keys: merged
    ours = Experiment.from_run(run).model.double()
    exported = open_model_dir(out).load(torch.float64)
    ids = torch.randint(0, 61, (2, WINDOW), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (exported(ids, loops=3) - ours(ids, loops=3)).abs().max() < 1e-5
        reference = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval()
        native = exported.native_loops
        assert torch.allclose(reference(ids).logits, exported(ids, loops=native), atol=1e-6)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{looplab_run}", "trains looplab's own model (no model.pretrained): export writes back a run fine-tuned"),
        ("{run} --out {full}", "exists and is not empty; give a new or empty directory (nothing overwritten)"),
        ("{run} --out {file}/model", "is a file, not a folder"),
    ],
)
def test_bad_export_is_one_line_and_overwrites_nothing(world, tmp_path, capsys, target, message):
    run, looplab_run = tmp_path / "run", tmp_path / "looplab_run"
    train(load_config(PRESET, _overrides(world, "ouro", steps=2)), run, progress=False)
    train(load_config("demo", ["train.steps=1", "eval.samples=8"]), looplab_run, progress=False)
    full, file = tmp_path / "full", tmp_path / "file"
    full.mkdir()
    (full / "kept.txt").write_text("kept\n")
    file.write_text("a file\n")
    args = target.format(run=run, looplab_run=looplab_run, full=full, file=file).split()
    if "--out" not in args:
        args += ["--out", str(tmp_path / "new")]
    capsys.readouterr()
    assert main(["export", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert (full / "kept.txt").read_text() == "kept\n" and [p.name for p in full.iterdir()] == ["kept.txt"]
    assert not (tmp_path / "new").exists()


def test_an_export_that_fills_the_disk_leaves_no_file_as_if_complete(world, tmp_path, capsys, monkeypatch):
    """A disk that fills after the weights were written (the tokenizer's save fails with ENOSPC): one line, exit
    2, and the out folder holds no file (the staged weights removed)."""
    import errno

    from transformers import PreTrainedTokenizerBase

    run, out = tmp_path / "run", tmp_path / "exported"
    train(load_config(PRESET, _overrides(world, "ouro", steps=2)), run, progress=False)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full_disk)
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err and "no file was left" in err, err
    assert not out.exists() or not any(out.rglob("*"))


def test_tied_weights_are_written_once_and_stay_tied_after_loading(world, tmp_path):
    run = tmp_path / "run"
    train(load_config(PRESET, _overrides(world, "retrofit", steps=2)), run, progress=False)
    saved = load_file(_checkpoint(run, 2) / "model.safetensors")
    assert "embed.weight" in saved and "lm_head.weight" not in saved
    model = Experiment.from_run(run).model
    assert model.lm_head.weight.data_ptr() == model.embed.weight.data_ptr()
    assert torch.equal(model.lm_head.weight, saved["embed.weight"])


@pytest.mark.parametrize("family", ["ouro", "retrofit"])
def test_a_run_fine_tuned_from_a_model_dir_generates_with_the_dirs_tokenizer(world, tmp_path, family, capsys):
    from looplab.generation import DecodeOptions, GenerationExit, generate
    from looplab.generation.text_lm import open_text_lm

    run = tmp_path / "run"
    trained = train(load_config(PRESET, _overrides(world, family, steps=2)), run, progress=False)
    lm = open_text_lm(run)
    assert lm.kind == "run" and "fine-tuned from" in lm.name
    prompt = lm.encode("In the beginning")
    assert prompt == list(tiny_tokenizer()("In the beginning")["input_ids"])
    options = DecodeOptions(GenerationExit("fixed", 2))
    expected = generate(trained.model.eval(), [prompt], 4, options)
    capsys.readouterr()
    assert (
        main(["generate", str(run), "--prompt", "In the beginning", "--json", "--loops", "2", "--max-new-tokens", "4"])
        == 0
    )
    assert json.loads(capsys.readouterr().out.splitlines()[0])["token_ids"] == expected.tokens[0]


def test_the_fine_tune_config_records_the_dir_and_reads_back(world, tmp_path):
    config = check_config(load_config(PRESET, _overrides(world, "hrm_text", steps=2)))
    text = config.to_toml()
    assert f'pretrained = "{world / "hrm_text"}"' in text and "text_file" in text
    plain = check_config(load_config("demo"))
    assert "pretrained" not in plain.to_toml() and "text_file" not in plain.to_toml(), "unset keys are not written"
    assert config.schedule.name == "lognormal" and config.stability["jsrr"]["estimator"] == "jvp"


TRAIN = (
    f"train {PRESET} --out {{new}} --no-progress --set task.text_file={{root}}/text.txt --set task.train_min=16 "
    "--set task.train_max=16 --set task.eval_lengths=[16]"
)
#: (the command, the text of its one line)
BAD = [
    (TRAIN + " --set model.pretrained={root}/missing", "model dir not found:"),
    (TRAIN + " --set model.pretrained_tokenizer={root}/parcae", "model.pretrained_tokenizer applies to a model dir"),
    (
        TRAIN + " --set model.pretrained={root}/parcae_apart --set model.pretrained_tokenizer={root}/text.txt",
        "the tokenizer folder",
    ),
    (TRAIN + " --set model.pretrained={root}/parcae_apart", "holds no tokenizer"),
    (TRAIN + " --set model.pretrained={root}/text.txt", "is a file, not a model dir"),
    (TRAIN + " --set model.pretrained={root}/llama", "is a llama model, not a looped one: make one of it with"),
    (
        TRAIN + " --set model.pretrained={root}/hrm_text --set model.d_model=128 --set model.causal=true",
        "takes its architecture from the model dir: remove model.d_model, model.causal",
    ),
    (
        TRAIN + " --set model.pretrained={root}/hrm_text --set task.name=kjv --set task.text_file=",
        "it needs task.name = 'text', not 'kjv' (whose tokens are bytes)",
    ),
    (TRAIN, "task 'text' reads its tokens with a model dir's tokenizer: set model.pretrained = DIR"),
    (
        TRAIN + " --set task.name=kjv --set task.text_file= --set model.pretrained_dtype=bfloat16",
        "model.pretrained_dtype applies to a model dir",
    ),
    (TRAIN + " --set model.pretrained={root}/hrm_text --set model.pretrained_dtype=float16", "'float16'"),
    (
        TRAIN + " --set model.pretrained={root}/hrm_text --set task.text_file={root}/short.txt",
        "a window of 16 tokens needs 17 tokens of text",
    ),
    (TRAIN + " --set model.pretrained={root}/hrm_text --set task.text_file={root}/none.txt", "text_file not found"),
    (
        TRAIN + " --set model.pretrained={root}/ouro --set train.shared_view_weight=0.5",
        "train.shared_view_weight = 0.5 applies to looplab's own model, not a model dir (model.pretrained)",
    ),
    (
        TRAIN + " --set model.pretrained={root}/hrm_text --set task.eval_lengths=[16,65]",
        "task windows reach 65 tokens (task.train_max, task.eval_lengths), beyond the 64",
    ),
    (TRAIN + " --set task.name=kjv", "task.text_file applies to task 'text'"),
    (
        TRAIN + " --set model.pretrained={root}/ouro --set train.adapter=lora --set train.adapter_targets=['qproj']",
        "train.adapter_targets: 'qproj' names no linear layer of the model; its linear layers end in",
    ),
    (TRAIN + " --set task.name=kjv --set task.text_file= --set train.adapter=lora", "fine-tunes a model dir"),
    (
        TRAIN + " --set model.pretrained={root}/ouro --set train.adapter_rank=4",
        "train.adapter_rank applies to train.adapter = 'lora'",
    ),
    (TRAIN + " --set model.pretrained={root}/ouro --set train.adapter=qlora", "valid choices: lora, none"),
    (
        TRAIN + " --set model.pretrained={root}/ouro_small_vocab",
        "past the model's 40 embedding rows (config.json vocab_size): its tokenizer and weights do not match",
    ),
]


@pytest.mark.parametrize("template, message", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_fine_tune_input_is_one_line_and_writes_nothing(world, tmp_path, capsys, template, message):
    new = tmp_path / "new"
    assert main(template.format(root=world, new=new).split(" ")) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("looplab: error: "), err
    assert message in lines[0], lines[0]
    assert not new.exists(), "a refused run wrote its run dir"


def test_every_model_dir_preset_checks_with_a_dir_of_each_family(world):
    for preset in sorted((PRESETS / "model-dir").glob("*.toml")):
        for family in FAMILIES:
            windows = [f"task.train_min={WINDOW}", f"task.train_max={WINDOW}", f"task.eval_lengths=[{WINDOW}]"]
            config = check_config(load_config(preset, [f"model.pretrained={world / family}", *windows]))
            assert config.task.name == "text" and json.loads(json.dumps(config.to_dict()))["model"]["pretrained"]


@pytest.mark.parametrize(
    "schedule",
    [
        ["schedule.name=rl_halting"],
        ["schedule.name=rl_halting", "schedule.entropy_mode=exact"],
        ["schedule.name=pondernet"],
    ],
    ids=["rl_halting-sampled", "rl_halting-exact", "pondernet"],
)
def test_halting_schedules_and_jsrr_read_parcaes_context(world, tmp_path, schedule):
    """Parcae's value embeddings read the token ids its start context holds: the halting schedules' readouts and
    the JSRR probe keep that context (a context built from the mask alone is refused)."""
    overrides = [
        f"model.pretrained={world / 'parcae'}", "task.name=text", f"task.text_file={world / 'text.txt'}",
        f"task.train_min={WINDOW}", f"task.train_max={WINDOW}", f"task.eval_lengths=[{WINDOW}]", "schedule.t_max=4",
        "schedule.depth=4", "train.steps=2", "train.batch_size=2", "train.log_every=1", "stability.jsrr.weight=0.1",
        "stability.jsrr.estimator=jvp", "stability.jsrr.rows=1", "eval.max_loops=4", "eval.samples=4",
        "run.threads=1", *schedule,
    ]  # fmt: skip
    train(load_config(None, overrides), tmp_path / "run", progress=False)
    log = read_log(tmp_path / "run")
    assert [r["step"] for r in log] == [1, 2] and all(r["jsrr"] > 0 for r in log)


def test_a_dir_whose_tokenizer_is_apart_fine_tunes_with_pretrained_tokenizer(world, tmp_path, monkeypatch):
    """``model.pretrained_tokenizer`` names Parcae's tokenizer folder (made absolute as the config is read), and the
    run reads the same windows as the dir holding its tokenizer beside the weights."""
    monkeypatch.chdir(world)
    config = load_config(PRESET, [*_overrides(world, "parcae_apart", steps=2), "model.pretrained_tokenizer=parcae"])
    assert config.model.pretrained_tokenizer == str(world / "parcae")
    train(config, tmp_path / "apart", progress=False)
    train(load_config(PRESET, _overrides(world, "parcae", steps=2)), tmp_path / "beside", progress=False)
    assert [r["loss"] for r in read_log(tmp_path / "apart")] == [r["loss"] for r in read_log(tmp_path / "beside")]
