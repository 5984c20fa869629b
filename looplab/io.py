"""Small file helpers shared by the writers of run directories."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write`` on a temporary sibling of ``path``, then rename it into place.

    A kill at any moment leaves either the old file or the complete new one.
    """
    tmp = path.with_name(f".tmp_{path.name}")
    write(tmp)
    os.replace(tmp, path)
