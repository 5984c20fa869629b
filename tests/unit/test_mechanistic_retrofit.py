"""The trained-retrofit blocks read the protocol's rules from per-seed files as stated."""

import numpy as np
import pandas as pd

from looplab.studies.mechanistic import trained_retrofit as blocks

LAYERS, LOOPS, REFERENCE_LAYERS = 6, 8, 30


def _write_seed(folder, seed: int, rng: np.random.Generator, learned: bool = True) -> None:
    reference = np.sin(np.linspace(0, 3, REFERENCE_LAYERS))
    curve = reference.reshape(LAYERS, -1).mean(1)
    stages = []
    for step in (0, 200):
        for condition, zeroed, shape in (
            ("base", "", curve),
            ("zero_massive", 2, -0.2 * curve),  # a fifth of the amplitude, the profile reversed
            ("zero_layer2", 2, -0.2 * curve),
            ("zero_control", 7, curve),
        ):
            trained = shape if step else -shape  # the untrained retrofit's profile runs the other way
            for loop in range(1, LOOPS + 1):
                noisy = trained + rng.normal(0, 0.01, LAYERS)
                stages += [
                    {
                        "seed": seed,
                        "step": step,
                        "model": "m",
                        "condition": condition,
                        "zeroed_layer": zeroed,
                        "loop": loop,
                        "layer": layer,
                        "colsum": 0.5 + 0.1 * noisy[layer],
                        "sink_mass": 0.4,
                    }
                    for layer in range(LAYERS)
                ]
    losses = [
        {"seed": seed, "step": step, "loops": r, "val_loss": 10.0 if step == 0 or not learned else 5.0}
        for step in (0, 200)
        for r in (1, 4, 8, 16)
    ]
    mlps = [{"seed": seed, "step": 200, "mlp": "prelude2", "layer": 2, "max_abs_output": 800.0}]
    (folder / f"seed-{seed}").mkdir(parents=True)
    for name, rows in (("stages", stages), ("losses", losses), ("mlps", mlps)):
        pd.DataFrame(rows).to_csv(folder / f"seed-{seed}" / f"{name}.csv", index=False)
    return reference


def _results(tmp_path, seeds, unlearned=()):
    study = tmp_path / blocks.STUDY
    rng = np.random.default_rng(0)
    for seed in seeds:
        reference = _write_seed(study / blocks.FOLDER, seed, rng, learned=seed not in unlearned)
    pd.DataFrame(
        {"model": "feedforward", "condition": "base", "layer": range(REFERENCE_LAYERS), "colsum": reference}
    ).to_csv(study / blocks.RETROFIT_FILE, index=False)
    return tmp_path


def test_the_rules_hold_when_the_loops_repeat_the_reference_and_zeroing_removes_them(tmp_path):
    text = blocks.retrofit_trained_decisions_block(_results(tmp_path, (1, 2, 3)))
    assert "3 of 3 seeds" in text
    assert "Each loop repeats SmolLM2's stages: alignment 1.000" in text and text.count("**holds**") == 2
    table = blocks.retrofit_trained_block(tmp_path)
    assert len(table.splitlines()) == 2 + 6 and "layer 2: -" in table  # a row per (seed, step); the ablation reverses


def test_a_seed_that_did_not_learn_is_left_out_and_one_seed_decides_nothing(tmp_path):
    text = blocks.retrofit_trained_decisions_block(_results(tmp_path, (1, 2), unlearned=(2,)))
    assert "1 of 2 seeds" in text and "(1 seed)" in text and "**n/a**" in text


def test_no_seed_yet_is_said_not_zero(tmp_path):
    (tmp_path / blocks.STUDY).mkdir()
    assert blocks.retrofit_trained_block(tmp_path).startswith("n/a")
    assert blocks.retrofit_trained_mlps_block(tmp_path).startswith("n/a")


def test_rule_2_is_said_as_a_test_of_a_precondition_only_when_rule_1_grants_the_stages(tmp_path):
    results = _results(tmp_path, (1, 2, 3))
    assert "found absent" not in blocks.retrofit_trained_says_mlp(results)  # rule 1 holds here
    reversed_reference = tmp_path / blocks.STUDY / blocks.RETROFIT_FILE
    frame = pd.read_csv(reversed_reference)
    frame["colsum"] = -frame.colsum  # the loops now run against SmolLM2's curve: rule 1 fails
    frame.to_csv(reversed_reference, index=False)
    text = blocks.retrofit_trained_says_mlp(results)
    assert "**Each loop repeats SmolLM2's stages (rule 1): fails.**" in blocks.retrofit_trained_says_stages(results)
    assert 'Rule 1 reads "fails", so rule 2 tests a precondition of stages rule 1 found absent' in text
    assert "a test of a precondition of stages rule 1 found absent" in blocks.retrofit_trained_summary(results)


def test_seeds_that_start_from_one_model_are_said_to_share_one_initialisation(tmp_path):
    results = _results(tmp_path, (1, 2))
    for seed in (1, 2):
        pd.DataFrame({"seed": seed, "step": [1, 2], "loops": 8, "loss": 5.0, "seconds": 100.0 * seed}).to_csv(
            tmp_path / blocks.STUDY / blocks.FOLDER / f"seed-{seed}" / "train.csv", index=False
        )
    text = blocks.retrofit_trained_says_seeds(results)
    # the fixture's noise differs by seed at step 0 too: the stage measures are not one model's
    assert "step 0 differs between the 2 seeds" in text and "100–200 s per seed" in text


def test_the_committed_seeds_are_said_to_share_one_initialisation():
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    assert "the seeds share one initialisation" in blocks.retrofit_trained_says_seeds(results)
