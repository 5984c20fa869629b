"""The flat-memory cache study (#44 item 5): which training makes the ``shared`` KV cache cost nothing.

``protocol`` is the frozen protocol (committed before the first run; its first commit is what
``looplab results --check`` checks the committed reads against), ``run`` the runner, ``page`` the page
writer. Importing this package registers the study as frozen.
"""

from looplab.report.pages import register_frozen

#: the study's folder under docs/results, and its protocol relative to that folder (a module, not a PROTOCOL.md)
STUDY = "flat-cache"
register_frozen(STUDY, "../../looplab/studies/flat_cache/protocol.py")
