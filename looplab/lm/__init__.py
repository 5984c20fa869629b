"""Language modelling on text: the KJV corpus and loss-vs-loops evaluation (docs/methods.md §7).

The byte-level task itself lives in :mod:`looplab.tasks.text` (registered as
``kjv``) so the ordinary trainer drives it unchanged.
"""

from looplab.tasks.corpus import Corpus, load_corpus

__all__ = ["Corpus", "load_corpus"]
