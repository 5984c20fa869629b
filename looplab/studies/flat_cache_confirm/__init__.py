"""The flat KV cache's confirmation (issue #56): is ``shared`` equivalent to ``per_loop`` for a looped LM
trained in its view, by a pre-registered equivalence test with power, Holm across its decisions, and is the
view training the cause?

``protocol`` is the frozen protocol (committed before the first run) and ``run`` the runner. The page
writer and the study's registration with ``looplab results --check`` land with its reads.
"""
