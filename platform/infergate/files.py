"""Writing a file that another process may read at any moment."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(target: Path, data: bytes | str, mode: int = 0o666) -> None:
    """Replace ``target`` with ``data`` in one step: a reader finds the old file or the
    new one, never a part of either. The data goes to ``<name>.partial`` beside it, a
    new file with ``mode`` (less the umask; one a crash left is removed first, as it may
    have another mode), then is renamed over ``target``."""
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    os.replace(partial, target)
