"""The flat-cache confirmation study's protocol, frozen before its first run (issue #56).

Question: for a looped LM trained half in the ``shared`` KV cache's own view with the contractive
injection, is decoding through ``shared`` (one key and value per core layer, flat in depth) equivalent to
the exact ``per_loop`` cache, within the project's margins? Is training in the view what makes it so?
The earlier studies (flat-cache: no view; flat-cache-view: 3 seeds) are the pilot: their per-seed spreads
set the seed count below, and none of their seeds is reused.

Task and model: the flat-cache studies' (preset ``generation/kjv_trace``: byte-level, d 64, RMSNorm
post-sandwich core of 2 layers, RoPE, KJV text and chain-trace problems of 1..4 steps), 800 steps,
log-normal loops in [1, 16], one depth per batch. Every arm runs from one commit (this module's).

Arms (overrides of the preset; everything else equal):

    contractive_view   the contractive (Parcae) injection, train.shared_view_weight = 0.5
    contractive        the contractive injection alone (no view training)
    lognormal_view     train.shared_view_weight = 0.5 alone (no contractive injection)

Seeds: :data:`SEEDS`, 20 per arm, fresh (the pilots used 7101–7103 and 7201–7203).

Power (from the committed pilot reads, docs/results/flat-cache*/reads.csv): contractive_view's per-seed
exact-match gap has SD 0.45 points over 3 seeds (its loss gap 0.002–0.006 nats); the 80 % upper
confidence limit of that SD is 0.95 points. The equivalence test of one read at the margin of 1 point,
true gap 0, at the level a test may face under Holm across the study's 20 decisions (0.05 / 20 at
worst), has power 0.98 with 10 seeds at SD 0.45, but 0.13 with 10, 0.48 with 15 and 0.81 with 20 seeds
at SD 0.95 (simulated, 20,000 draws each). The study takes 20 seeds per arm, the count at which the
conservative spread still gives power 0.8. The loss margin (0.05 nats) is ten times the pilot's spread:
power ≈ 1 at any of these counts.

Reads, per run, at each of :data:`READ_LOOPS` loops and each cache of :data:`CACHES`, greedy, at a fixed
depth (the flat-cache studies' reads, with more problems and passages):

    exact_match   :data:`PROBLEMS` chain-trace problems of each of 1..4 steps (4 × 250 = 1,000, drawn from
                  the generator derived from ("flat-cache-confirm", "problems")), answers decoded for real,
                  token by token through the cache; per problem whether the whole answer is right
    loss          teacher-forced loss in nats per byte of :data:`PASSAGES` KJV validation passages of
                  :data:`PASSAGE_BYTES` bytes (drawn with ("flat-cache-confirm", "passages")), every byte
                  read through the cache; per passage its loss
    cache_mib     the keys and values held while scoring the passages

Primary metrics, per (arm, loops), one value per seed:

    em_gap    = exact_match(per_loop) − exact_match(shared), in points
    loss_gap  = loss(shared) − loss(per_loop), in nats per byte

Decisions (20 tests, Holm's step-down at α = 0.05 across all of them):

- equivalence, 18 tests: per (arm, loops, metric), two one-sided Student-t tests of the mean gap over
  the arm's seeds against ± the margin (:data:`EM_MARGIN` points, :data:`LOSS_MARGIN` nats); the
  test's p is the larger of the two one-sided p. An arm's ``shared`` cache is **equivalent** to
  ``per_loop`` when all six of its tests are rejected after Holm; otherwise **not shown equivalent**.
- the causal contrast, 2 tests: per seed, the gap averaged over the three read depths; contractive_view
  against contractive (Welch's two-sided t test, per metric). The view training **changes** the gap
  when its test is rejected after Holm; otherwise the difference is **not shown**.

Reported beside, not decided: the earlier studies' non-inferiority rule (every 95 % Student-t upper bound
within its margin) per arm; per (arm, loops) how many seeds' gaps exceed each margin; per problem, the
problems right under one cache and wrong under the other, pooled over seeds; per passage, the loss gap's
mean and spread; the memory of both caches.
"""

from __future__ import annotations

from looplab.studies.flat_cache import protocol as flat_cache

PRESET = flat_cache.PRESET
STEPS = flat_cache.STEPS
ARMS: dict[str, list[str]] = {
    "contractive_view": ["model.injection=contractive", "train.shared_view_weight=0.5"],
    "contractive": ["model.injection=contractive"],
    "lognormal_view": ["train.shared_view_weight=0.5"],
}
SEEDS = tuple(range(7301, 7321))
READ_LOOPS = (4, 8, 16)
CACHES = ("per_loop", "shared")
PROBLEMS = 250  # per step count 1..4
PASSAGES, PASSAGE_BYTES = 64, 64
EM_MARGIN = flat_cache.EM_MARGIN
LOSS_MARGIN = flat_cache.LOSS_MARGIN
ALPHA = 0.05
#: the causal contrast: (arm, the arm it is held against)
CONTRAST = ("contractive_view", "contractive")
