"""Each schedule checks the [schedule] keys it reads, and only those."""

import pytest

from looplab.config import load_config
from looplab.errors import LooplabError
from looplab.experiment import check_config
from looplab.plugins import import_plugin
from looplab.schedules import SCHEDULES, base


@pytest.mark.parametrize(
    "schedule, override, domain",
    [
        ("fixed", "depth=0", r"\[1, inf\)"),
        ("fixed_window", "window=-1", r"\[0, inf\)"),
        ("window", "t_max=0", r"\[1, inf\)"),
        ("multi_depth", "t_max=-3", r"\[1, inf\)"),
        ("lognormal", "sigma=-0.1", r"\[0, inf\)"),
        ("lognormal", "mu=nan", r"\(-inf, inf\)"),
        ("lognormal", "lo=0", r"\[1, inf\)"),
        ("poisson_lognormal", "mean_depth=0.5", r"\[1, inf\)"),
        ("rl_halting", "baseline_momentum=1.0", r"\[0, 1\)"),
        ("rl_halting", "entropy_weight=-1", r"\[0, inf\)"),
        ("rl_halting", "lr_scale=0", r"\(0, inf\)"),
        ("pondernet", "ponder_prior=1.0", r"\(0, 1\)"),
        ("pondernet", "ponder_beta=-0.5", r"\[0, inf\)"),
        ("pondernet", "t_max=0", r"\[1, inf\)"),
    ],
)
def test_schedule_parameters_are_checked_by_the_schedule_that_reads_them(schedule, override, domain):
    key = override.split("=")[0]
    with pytest.raises(LooplabError, match=rf"schedule\.{key} must be in {domain} for the {schedule} schedule"):
        check_config(load_config(None, [f"schedule.name={schedule}", f"schedule.{override}"]))
    # a schedule that does not read the key is not bothered by it
    other = "matched" if schedule != "matched" else "fixed"
    if key not in SCHEDULES[other].keys():
        check_config(load_config(None, [f"schedule.name={other}", f"schedule.{override}"]))


@pytest.mark.parametrize(
    "override, message",
    [
        (["schedule.name=lognormal", "schedule.lo=5", "schedule.hi=2"], "lo <= schedule.hi"),
        (["schedule.name=rl_halting", "schedule.entropy_mode=guess"], "exact, sampled"),
        (["schedule.name=rl_halting", "train.backprop_loops=2"], "needs a rule schedule"),
        (
            ["schedule.name=pondernet", "train.segment_loops=2"],
            "does not apply to the pondernet schedule; it applies to: act_bce, fixed",
        ),
        (["schedule.name=act_bce"], "halts between deep-supervision segments: set train.segment_loops > 0"),
        (["schedule.name=q_halt", "schedule.t_max=9", "train.segment_loops=2"], "t_max = 9 must be a whole"),
        (["schedule.name=fixed", "train.segment_loops=2", "train.backprop_loops=3"], "at most train.segment_loops"),
        (["schedule.name=act_bce", "train.segment_loops=2", "schedule.halt_exploration_prob=1.5"], r"\[0, 1\]"),
        (["schedule.name=multi_depth", "schedule.t_max=3"], "the multi_depth schedule clips training depths"),
    ],
)
def test_schedule_constraints_between_keys(override, message):
    with pytest.raises(LooplabError, match=message):
        check_config(load_config(None, override))


PLUGIN = """
from looplab.params import at_least, param
from looplab.schedules import DepthRule, register_schedule


@register_schedule
class Capped(DepthRule):
    name = "capped_{tag}"

    @dataclass
    class Params:
        t_max: int = param(20, at_least(1))  # declared exactly as rl_halting and window declare it

    @classmethod
    def training_depth(cls, params, deepest):
        return params.t_max

    def train_depths(self, lengths, generator):
        return lengths.clamp_max(self.params.t_max)

    def policy_depth(self, lengths):
        return lengths.clamp_max(self.params.t_max)
"""


@pytest.fixture
def restored_schedules(monkeypatch):
    """The schedule registry and its declarations as they were, whatever a test registers."""
    monkeypatch.setattr(base, "SCHEDULES", dict(base.SCHEDULES))
    monkeypatch.setattr(base, "_DECLARED", dict(base._DECLARED))
    return base


@pytest.mark.parametrize("future", [True, False], ids=["postponed", "evaluated"])
def test_a_shared_key_is_compared_by_its_resolved_type(restored_schedules, tmp_path, future):
    """A plugin's t_max: int is the same declaration as the built-ins', with or without postponed annotations."""
    tag = "postponed" if future else "evaluated"
    path = tmp_path / f"capped_{tag}.py"
    header = "from __future__ import annotations\n" if future else ""
    path.write_text(header + "from dataclasses import dataclass\n" + PLUGIN.format(tag=tag))
    import_plugin(str(path))
    assert f"capped_{tag}" in restored_schedules.SCHEDULES


def test_a_taken_name_is_refused_before_the_class_is_checked(restored_schedules):
    from looplab.schedules import DepthRule, register_schedule

    class Stub(DepthRule):  # leaves the whole contract unimplemented: the name is still the problem named
        name = "fixed"

    with pytest.raises(ValueError, match="schedule name 'fixed' is taken by looplab.schedules.rules.Fixed"):
        register_schedule(Stub)
