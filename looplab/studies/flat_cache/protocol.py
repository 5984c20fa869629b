"""The flat-memory cache study's protocol, frozen before its first run (issue #44, item 5).

Question: which training makes the flat-memory KV caches (``shared``: one key and value per core
layer across loops; ``last_m``: each token's last m loops) as good as the exact ``per_loop`` cache?

Task and model: the generation demo LM (preset ``generation/kjv_trace``: byte-level, d 64, RMSNorm
post-sandwich core of 2 layers, RoPE, KJV text and chain-trace problems of 1..4 steps), 800 steps.

Arms (overrides of the preset; everything else equal):

    fixed4        trained at a fixed 4 loops
    lognormal     log-normal loops in [1, 16] (the preset as it is)
    contractive   log-normal loops and the contractive (Parcae) injection
    stars         log-normal loops and JSRR (λ 0.1, JVP, 1 power iteration, 8 rows) from step 401

An arm trained with the shared cache's own view of earlier tokens is not among them (see the page).

Seeds: :data:`SEEDS`, three per arm, never used by any earlier run of this preset.

Reads, per run, at each of :data:`READ_LOOPS` loops and each cache of :data:`CACHES`
(``last_m`` keeps :data:`KEEP_LOOPS` loops per token), greedy, at a fixed depth:

    exact_match   chain-trace problems (:data:`PROBLEMS` of each of 1..4 steps, drawn from the
                  generator derived from ("flat-cache", "problems")), answers decoded for real,
                  token by token through the cache; the fraction whose whole answer is right
    loss          teacher-forced loss in nats per byte of :data:`PASSAGES` KJV validation passages
                  of :data:`PASSAGE_BYTES` bytes (drawn with ("flat-cache", "passages")), every byte
                  read through the cache (:func:`looplab.generation.score`)
    cache_mib     the keys and values held after the last problem batch

Primary metrics, per (arm, loops), one value per seed:

    em_gap    = exact_match(per_loop) − exact_match(shared), in points
    loss_gap  = loss(shared) − loss(per_loop), in nats per byte

Decision rule, per arm: the shared cache is **free** for an arm when, at every read loop count,
the upper bound of the two-sided 95 % Student-t interval of the mean em_gap over its seeds is
≤ :data:`EM_MARGIN` points and that of loss_gap ≤ :data:`LOSS_MARGIN` nats; **not free** when at
some loop count the lower bound of either exceeds its margin; otherwise **not resolved**. Between
arms, the em_gap at 8 loops of each arm against ``fixed4``'s, by Welch's interval (described, not
a decision). The same rule, with ``last_m`` in place of ``shared``, is reported beside it.
"""

from __future__ import annotations

PRESET = "generation/kjv_trace"
STEPS = 800
ARMS: dict[str, list[str]] = {
    "fixed4": ["schedule.name=fixed"],
    "lognormal": [],
    "contractive": ["model.injection=contractive"],
    "stars": [
        "stability.jsrr.estimator=jvp",
        "stability.jsrr.weight=0.1",
        "stability.jsrr.power_iters=1",
        "stability.jsrr.rows=8",
        "stability.jsrr.warmup=400",
    ],
}
SEEDS = (7101, 7102, 7103)
READ_LOOPS = (4, 8, 16)
CACHES = ("per_loop", "last_m", "shared")
KEEP_LOOPS = 2
PROBLEMS = 32
PASSAGES, PASSAGE_BYTES = 16, 64
EM_MARGIN = 1.0
LOSS_MARGIN = 0.05
