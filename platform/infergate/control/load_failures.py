"""Why a version could not be loaded: a fault of the place (Triton away, the artifact
cache's disk full), which holds a new version back without judging it, or of its files,
which keeps it away from traffic; and the words its rollback reason gives."""

from __future__ import annotations

import errno
import os

from infergate.errors import BackendUnavailable, InfergateError

# The local disk cannot take the version's files: full, over quota. Freeing space is the
# fix, not rolling the version back.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def of_the_place(exc: BaseException) -> bool:
    """Whether a load failed for a reason outside the version's files: Triton not
    reachable, or the artifact cache's disk full, seen through the errors that wrap it.
    MLflow's artifact download reports its failures in one exception's text, without
    chaining them, so the disk's errors are also recognised by their message."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, BackendUnavailable):
            return True
        if isinstance(current, OSError) and current.errno in DISK_FULL:
            return True
        if any(os.strerror(code) in str(current) for code in DISK_FULL):
            return True
        current = current.__cause__ or current.__context__
    return False


def reason_of(exc: Exception) -> str:
    """Why a load failed, for a rollback reason: infergate's errors say what could not;
    anything else (an artifact download, say) gets its type, as a bare KeyError has none."""
    if isinstance(exc, InfergateError):
        return str(exc)
    return f"loading it failed: {type(exc).__name__}: {exc}"
