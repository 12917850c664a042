"""How to run the real ``tritonserver`` that the ``nvidia-pytriton`` wheel ships.

This module only builds paths, a command line and an environment; starting, watching and
stopping the process belongs to the stack supervisor. The binary needs three things from
the wheel's layout: its bundled libraries on ``LD_LIBRARY_PATH``, the Python-backend stub
next to ``libtriton_python.so``, and the venv's ``bin`` first on ``PATH``; pytriton's own
``server/triton_server.py`` starts it the same way.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from infergate.config import TritonSettings
from infergate.errors import StackError

BACKENDS_DIR_NAME = "triton-backends"
STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of the wheel's Triton live."""

    binary: Path
    """The ``tritonserver`` executable."""
    libs_dir: Path
    """Shared libraries the binary links against (``nvidia_pytriton.libs``)."""
    python_backend_dir: Path
    """``libtriton_python.so`` and ``triton_python_backend_utils.py``."""
    stub: Path
    """The Python-backend stub built for the running Python version."""


def find_tritonserver() -> TritonInstall:
    """Locate Triton inside the installed ``nvidia-pytriton`` wheel.

    Raises:
        StackError: the wheel, or a part of it, is missing.
    """
    # find_spec locates the package without importing it (pytriton's import is slow).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise StackError(
            "Triton is not installed: the package 'nvidia-pytriton' is missing. "
            "Install the project's dependencies (pip install -e .)."
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    server_dir = package_dir / "tritonserver"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    install = TritonInstall(
        binary=server_dir / "bin" / "tritonserver",
        libs_dir=package_dir.parent / "nvidia_pytriton.libs",
        python_backend_dir=server_dir / "backends" / "python",
        stub=server_dir / "python_backend_stubs" / python_version / STUB_NAME,
    )
    for what, path in (
        ("tritonserver binary", install.binary),
        ("Triton's bundled libraries", install.libs_dir),
        ("Triton's Python backend", install.python_backend_dir / "libtriton_python.so"),
        (f"Python-backend stub for Python {python_version}", install.stub),
    ):
        if not path.exists():
            raise StackError(
                f"The nvidia-pytriton wheel at {package_dir} has no {what} (expected {path}); "
                "reinstall nvidia-pytriton==0.7.0 for this Python version."
            )
    return install


def _copy_if_changed(source: Path, target: Path) -> None:
    """Copy ``source`` over ``target`` unless it already holds the same file.

    The copy goes to a temporary name first and is renamed into place, so a running Triton
    that has the old ``.so`` mapped never sees a half-written file.
    """
    if target.exists():
        src, dst = source.stat(), target.stat()
        if src.st_size == dst.st_size and int(src.st_mtime) == int(dst.st_mtime):
            return
    partial = target.with_name(target.name + ".partial")
    shutil.copy2(source, partial)  # copy2 keeps the mtime compared above and the exec bit
    os.replace(partial, target)


def prepare_backends(state_dir: Path, *, install: TritonInstall | None = None) -> Path:
    """Assemble a writable backend folder: the wheel's Python backend plus the stub for
    the running Python, which the backend looks for next to ``libtriton_python.so``.

    Idempotent: files already up to date are left alone.

    Returns:
        The value for ``tritonserver --backend-directory``.
    """
    install = install or find_tritonserver()
    backends_dir = state_dir / BACKENDS_DIR_NAME
    python_dir = backends_dir / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in install.python_backend_dir.iterdir():
        if source.is_file():
            _copy_if_changed(source, python_dir / source.name)
    _copy_if_changed(install.stub, python_dir / STUB_NAME)
    return backends_dir


def server_command(
    settings: TritonSettings,
    repository: Path,
    backend_dir: Path,
    *,
    install: TritonInstall | None = None,
) -> list[str]:
    """The ``tritonserver`` command line for ``Popen``.

    Models are loaded and unloaded only through the repository API (explicit model
    control), so the control plane decides what is served.
    """
    install = install or find_tritonserver()
    address = settings.bind_address
    # Pinned (page-locked) host memory only speeds up GPU copies; on a CPU-only machine
    # Triton fails to allocate it and says so in a warning at every start.
    pinned_memory = [] if settings.gpu else ["--pinned-memory-pool-byte-size=0"]
    return [
        str(install.binary),
        f"--model-repository={repository}",
        "--model-control-mode=explicit",
        f"--backend-directory={backend_dir}",
        # We write complete config.pbtxt files; Triton should not fill anything in.
        "--disable-auto-complete-config",
        # Startup errors (none in explicit mode, where nothing loads at start) must not
        # exit; a model failing to load later never stops the server.
        "--exit-on-error=false",
        # With strict readiness (the default) the server reports "not ready" once any model
        # failed to load (checked on 2.51), which would take every healthy model down with it
        # in health checks. Model readiness is asked per model instead.
        "--strict-readiness=false",
        f"--http-address={address}",
        f"--http-port={settings.http_port}",
        f"--grpc-address={address}",
        f"--grpc-port={settings.grpc_port}",
        "--allow-metrics=true",
        f"--allow-gpu-metrics={str(settings.gpu).lower()}",
        "--allow-cpu-metrics=true",
        f"--metrics-address={address}",
        f"--metrics-port={settings.metrics_port}",
        "--log-verbose=0",
        *pinned_memory,
    ]


def server_environment(
    base: Mapping[str, str], *, install: TritonInstall | None = None
) -> dict[str, str]:
    """The environment for ``tritonserver``: ``base`` plus the wheel's libraries on
    ``LD_LIBRARY_PATH`` and this venv's ``bin`` first on ``PATH``.

    The Python-backend stub finds its interpreter's packages (numpy, onnxruntime) through
    ``PATH``; ``PYTHONPATH`` alone did not reach it.
    """
    install = install or find_tritonserver()
    env = dict(base)
    env["LD_LIBRARY_PATH"] = _prepend(str(install.libs_dir), base.get("LD_LIBRARY_PATH"))
    env["PATH"] = _prepend(sysconfig.get_path("scripts"), base.get("PATH", os.defpath))
    return env


def _prepend(entry: str, search_path: str | None) -> str:
    return f"{entry}{os.pathsep}{search_path}" if search_path else entry
