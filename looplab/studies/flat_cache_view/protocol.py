"""The shared-view arms of the flat-memory cache study, frozen before their first run (issue #44, item 5).

Question: does training in the ``shared`` KV cache's own view of earlier tokens make that cache as good
as the exact ``per_loop`` one? The flat-cache study (:mod:`looplab.studies.flat_cache.protocol`) left
this arm out; it is a study of its own, with its own seeds, so that study's frozen protocol stands.

Task and model: as the flat-cache study: preset ``generation/kjv_trace`` (byte-level, d 64, RMSNorm
post-sandwich core of 2 layers, RoPE, KJV text and chain-trace problems of 1..4 steps), 800 steps,
log-normal loops in [1, 16], one depth per batch.

Arms (overrides of the preset; everything else equal):

    lognormal_view     train.shared_view_weight = 0.5: the loss is half the ordinary unroll's and half
                       the shared view's (:mod:`looplab.model.shared_view`: a second unroll in which each
                       core layer reads earlier tokens through the first unroll's last-loop keys and values)
    contractive_view   the same with the contractive (Parcae) injection

The weight 0.5 is set before any run of the view (no pilot was run).

Seeds: :data:`SEEDS`, three per arm, never used by any earlier run of this preset.

Reads: exactly the flat-cache study's (its ``read_run``: the same :data:`READ_LOOPS`, :data:`CACHES`,
:data:`KEEP_LOOPS`, the same chain-trace problems and KJV passages, drawn from the generators derived
from ("flat-cache", "problems") and ("flat-cache", "passages")): exact_match, loss, cache_mib per (loops,
cache), greedy at a fixed depth.

Primary metrics, per (arm, loops), one value per seed:

    em_gap    = exact_match(per_loop) − exact_match(shared), in points
    loss_gap  = loss(shared) − loss(per_loop), in nats per byte

Decision rule, per arm (the flat-cache study's): the shared cache is **free** for an arm when, at every
read loop count, the upper bound of the two-sided 95 % Student-t interval of the mean em_gap over its
seeds is ≤ :data:`EM_MARGIN` points and that of loss_gap ≤ :data:`LOSS_MARGIN` nats; **not free** when
at some loop count the lower bound of either exceeds its margin; otherwise **not resolved**. The same
rule with ``last_m`` in place of ``shared`` is reported beside it.

Described, not decided: each arm's em_gap and loss_gap at 8 loops against the flat-cache study's arm
of the same base (:data:`BASES`; Welch's 95 % interval, its seeds 7101–7103), and the arms' ``per_loop``
exact match and loss against that arm's (what training in the view costs the exact cache).
"""

from __future__ import annotations

from looplab.studies.flat_cache import protocol as flat_cache

PRESET = flat_cache.PRESET
STEPS = flat_cache.STEPS
ARMS: dict[str, list[str]] = {
    "lognormal_view": ["train.shared_view_weight=0.5"],
    "contractive_view": ["model.injection=contractive", "train.shared_view_weight=0.5"],
}
BASES = {"lognormal_view": "lognormal", "contractive_view": "contractive"}
SEEDS = (7201, 7202, 7203)
READ_LOOPS = flat_cache.READ_LOOPS
CACHES = flat_cache.CACHES
KEEP_LOOPS = flat_cache.KEEP_LOOPS
EM_MARGIN = flat_cache.EM_MARGIN
LOSS_MARGIN = flat_cache.LOSS_MARGIN
