"""The flat KV cache's confirmation (issue #56): is ``shared`` equivalent to ``per_loop`` for a looped LM
trained in its view, by a pre-registered equivalence test with power, Holm across its decisions, and is the
view training the cause?

``protocol`` is the frozen protocol (committed before the first run), ``run`` the runner, ``page`` the page
writer. Importing this package registers the study as frozen (``looplab results --check`` holds its runs'
provenance against the protocol's commit).
"""

from pathlib import Path

from looplab.report.pages import register_frozen

STUDY = "flat-cache-confirm"
register_frozen(STUDY, str(Path(__file__).with_name("protocol.py")))
