"""One small plugin per extension family, each a module of its own (docs/extending.md).

Name any of them in a config's ``[run] plugins`` list to use it from ``looplab
train``, ``eval``, ``analyze``, ``sweep`` and ``generate``::

    [run]
    plugins = ["looplab.examples.plugins.reverse", "looplab.examples.plugins.scaled"]

- ``reverse``: a task (write the input backwards);
- ``scaled``: a depth schedule (supervise at factor × T(n), capped);
- ``state_energy``: a regulariser (the mean square of the probe state);
- ``first_confident``: a test-time exit (the first loop whose answer is confident);
- ``final_norm``: an analysis metric (the norm of each token's last state);
- ``normed_residual``: a norm placement (N(x) + f(N(x)));
- ``top_margin``: a generation exit (stop a token once its top choice leads by a margin; ``looplab generate``);
- ``first_loop``: a KV cache policy (every earlier token read at its first loop; ``--cache first_loop``);
- ``one_at_a_time``: a decoder (each prompt alone through the step decoder; ``--decoder one_at_a_time``);
- ``oracle_only``: a paper for ``looplab report --paper`` (our Oracle OOD by group, as a paper's table).

This package imports none of them: a plugin registers its entry when it is imported.
"""

#: the example plugins, by module name
NAMES = (
    "reverse",
    "scaled",
    "state_energy",
    "first_confident",
    "final_norm",
    "normed_residual",
    "top_margin",
    "first_loop",
    "one_at_a_time",
    "oracle_only",
)
MODULES = tuple(f"looplab.examples.plugins.{name}" for name in NAMES)
