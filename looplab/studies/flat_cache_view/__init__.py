"""The flat-memory cache study's shared-view arms (#44 item 5): does training in the ``shared`` cache's own
view of earlier tokens make that cache cost nothing?

``protocol`` is the frozen protocol (committed before the first run), ``run`` the runner, ``page`` the
page writer; the reads and the rule are the flat-cache study's (:mod:`looplab.studies.flat_cache`).
Importing this package registers the study as frozen.
"""

from pathlib import Path

from looplab.report.pages import register_frozen

STUDY = "flat-cache-view"
register_frozen(STUDY, str(Path(__file__).with_name("protocol.py")))
