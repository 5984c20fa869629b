"""Checks of a config's values that need nothing but the schema: every key's domain, and constraints between keys.

Each key's domain is declared beside it (``looplab.params.param`` in ``schema.py``)
and checked by :func:`looplab.params.check_domains`. What depends on the
registries (task and schedule names, a schedule's or regulariser's own
parameters) is checked by ``looplab.experiment.check_config``.
"""

from __future__ import annotations

import dataclasses

from looplab.config.schema import OPTIONAL_KEYS, PLACEMENT_ALIASES, Config, ModelConfig
from looplab.errors import LooplabError
from looplab.params import check_domains

SECTIONS = ("task", "model", "train", "eval", "generate", "run")  # the sections the schema declares key by key


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise LooplabError(message)


def validate(config: Config) -> None:
    """Check every declared key's domain and the constraints between keys; normalise placement aliases in place.

    The [schedule] and [stability.*] keys belong to the chosen schedule and to each
    regulariser, and are checked by them (``looplab.experiment.check_config``).
    """
    for section in SECTIONS:
        check_domains(getattr(config, section), section)
    m, t, ev = config.model, config.task, config.eval
    check_pretrained(m)
    check_adapter(config)
    m.placement = PLACEMENT_ALIASES.get(m.placement, m.placement)
    _require(
        m.d_model % m.n_heads == 0,
        f"model.d_model ({m.d_model}) must be a positive multiple of model.n_heads ({m.n_heads})",
    )
    _require(m.positional != "rope" or (m.d_model // m.n_heads) % 2 == 0, "rope needs an even head dimension")
    _require(
        m.injection != "none" or m.init_state == "embed",
        f"model.init_state = {m.init_state!r} has no effect with injection = 'none': without injection the "
        "loop starts from e (h_0 = e), or the input would never enter it; use init_state = 'embed'",
    )
    _require(t.train_min <= t.train_max, "task needs 1 <= train_min <= train_max")
    _require(len(t.eval_lengths) > 0 and min(t.eval_lengths) >= 1, "task.eval_lengths must be non-empty, all >= 1")
    _require(
        config.run.device == "cpu" or config.run.device.startswith("cuda"),
        f"run.device must be 'cpu' or 'cuda[:N]', got {config.run.device!r}",
    )
    _require(
        ev.flip_from <= max(ev.max_loops - 1, 1),
        f"eval.flip_from ({ev.flip_from}) must be <= eval.max_loops - 1 ({ev.max_loops - 1}): the flip rate "
        "averages Pr[answer at K+1 != answer at K] over K = flip_from..max_loops-1",
    )


def check_adapter(config: Config) -> None:
    """``train.adapter`` goes with a model dir, and its parameters with an adapter."""
    train, defaults = config.train, OPTIONAL_KEYS["train"]
    _require(
        train.adapter == "none" or bool(config.model.pretrained),
        f"train.adapter = {train.adapter!r} fine-tunes a model dir: set model.pretrained = DIR, or drop it",
    )
    own = [key for key in ("adapter_rank", "adapter_alpha", "adapter_targets") if getattr(train, key) != defaults[key]]
    _require(
        train.adapter != "none" or not own,
        f"train.{', train.'.join(own)} {'applies' if len(own) == 1 else 'apply'} to train.adapter = 'lora'",
    )
    _require(
        all(isinstance(target, str) and target for target in train.adapter_targets),
        f"train.adapter_targets must be non-empty names of linear layers, got {train.adapter_targets!r}",
    )


def check_pretrained(model: ModelConfig) -> None:
    """A model dir (``model.pretrained``) is the whole architecture: refuse an architecture key set beside it,
    and ``model.pretrained_dtype`` or ``model.pretrained_tokenizer`` without it."""
    if not model.pretrained:
        for key in ("pretrained_dtype", "pretrained_tokenizer"):
            _require(
                getattr(model, key) == OPTIONAL_KEYS["model"][key],
                f"model.{key} applies to a model dir: set model.pretrained = DIR, or drop {key}",
            )
        return
    default = ModelConfig()
    own = set(OPTIONAL_KEYS["model"])
    changed = [
        f.name
        for f in dataclasses.fields(model)
        if f.name not in own and getattr(model, f.name) != getattr(default, f.name)
    ]
    _require(
        not changed,
        f"model.pretrained = {model.pretrained!r} takes its architecture from the model dir: remove "
        f"model.{', model.'.join(changed)} (set beside it)",
    )
