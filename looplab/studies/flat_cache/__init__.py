"""The flat-memory cache study (#44 item 5): which training makes the ``shared`` KV cache cost nothing.

``protocol`` is the frozen protocol (committed before the first run; its first commit is what
``looplab results --check`` checks the committed reads against), ``run`` the runner, ``page`` the page
writer. Importing this package registers the study as frozen.
"""

from pathlib import Path

from looplab.report.pages import register_frozen

#: the study's folder under docs/results; its protocol is a module of this package, not a PROTOCOL.md, so it
#: is registered by its absolute path (found wherever the results folder is copied to)
STUDY = "flat-cache"
register_frozen(STUDY, str(Path(__file__).with_name("protocol.py")))
