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
