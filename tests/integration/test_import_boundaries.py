"""What each part of the package may import, checked in a fresh interpreter so that every
module imported on the way counts (``sys.modules`` after the imports).

The core (the data plane in ``serving``, the ``protocols``, what ``observe`` records, the
``tasks``, and the vocabulary: config, errors, versions, the rollout policy) runs without
Ray, Triton's client or MLflow: it is tested in milliseconds and reused wherever those are
absent. Its packages are taken whole, by folder, from ``[tool.infergate.core]`` in
pyproject.toml, so a module added to a core package is covered without being named
anywhere.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from infergate.config import PROJECT_ROOT

ADAPTER_PACKAGES = ("ray", "tritonclient", "mlflow")
# What registration needs and serving must not: an export or conversion engine in a
# replica would cost seconds and hundreds of MB per process.
REGISTRATION_PACKAGES = ("torch", "onnx", "onnxruntime", "ctranslate2", "transformers")


def module_names(package: str) -> list[str]:
    """Every module of ``package``, found by walking its folder."""
    folder = PROJECT_ROOT / "platform" / Path(*package.split("."))
    return sorted(
        ".".join((package, *path.relative_to(folder).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for path in folder.rglob("*.py")
    )


def core_modules() -> list[str]:
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    core = pyproject["tool"]["infergate"]["core"]
    return [name for package in core["packages"] for name in module_names(package)] + list(
        core["modules"]
    )


def imported_after(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    """The ``watched`` top-level packages (or ``infergate`` sub-packages, when dotted) in
    ``sys.modules`` after importing ``modules``."""
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"watched = {watched!r}\n"
        "print(' '.join(sorted(w for w in watched if any(m == w or m.startswith(w + '.') "
        "for m in sys.modules))))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy()
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_the_core_is_found_by_folder():
    core = core_modules()
    assert "infergate.serving.loader" in core and "infergate.protocols.frontend" in core
    assert len(core) > 40


def test_the_core_imports_no_ray_triton_client_or_mlflow():
    assert imported_after(core_modules(), ADAPTER_PACKAGES) == []


def test_the_core_imports_no_export_or_conversion_engine():
    assert imported_after(core_modules(), REGISTRATION_PACKAGES) == []


def test_the_control_plane_imports_no_protocol():
    control = [m for m in module_names("infergate.control") if m != "infergate.control.cli"]
    assert imported_after(control, ("infergate.protocols",)) == []


@pytest.mark.parametrize("module", ["infergate.serving.loader", "infergate.serving.inference"])
def test_loading_a_version_and_the_inference_path_import_no_protocol_and_no_http(module):
    assert imported_after([module], ("infergate.protocols", "starlette")) == []


@pytest.mark.parametrize("adapter, package", [
    ("infergate.serve_app", "ray"), ("infergate.triton.client", "tritonclient"),
    ("infergate.registry", "mlflow"), ("infergate.registration.onnx_export", "torch"),
    ("infergate.serve_app", "infergate.protocols"),
])  # fmt: skip
def test_the_check_sees_what_an_adapter_imports(adapter, package):
    assert package in imported_after([adapter], (*ADAPTER_PACKAGES, "torch", package))


def test_backend_model_is_never_imported_by_the_package():
    # It imports triton_python_backend_utils, which exists only inside Triton.
    modules = ("infergate.triton.client", "infergate.triton.repository", "infergate.triton.server")
    code = (
        f"import importlib, sys\nfor name in {list(modules)!r}: importlib.import_module(name)\n"
        "assert 'infergate.triton.backend_model' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy())
