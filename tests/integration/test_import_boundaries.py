"""What each part of the package may import, checked in a fresh interpreter so that every
module imported on the way counts (``sys.modules`` after the imports).

The core (requests, tokenization, traffic split, post-processing, statistics, drift,
rollout policy, the front-end's HTTP surface) runs without Ray, Triton's client or MLflow:
it is tested in milliseconds and reused wherever those are absent.
"""

import os
import subprocess
import sys

import pytest

CORE = (
    "infergate.access",
    "infergate.batching",
    "infergate.config",
    "infergate.control.policy",
    "infergate.control.windows",
    "infergate.chrf",
    "infergate.counters",
    "infergate.drift",
    "infergate.errors",
    "infergate.frontend",
    "infergate.http",
    "infergate.kserve_v2",
    "infergate.metrics",
    "infergate.monitor",
    "infergate.openai_api",
    "infergate.openapi",
    "infergate.postprocess",
    "infergate.protocol",
    "infergate.quality",
    "infergate.reference",
    "infergate.replica_logs",
    "infergate.rerank_api",
    "infergate.routes",
    "infergate.routing",
    "infergate.runtime",
    "infergate.tasks",
    "infergate.telemetry",
    "infergate.tokenization",
    "infergate.versions",
)
ADAPTER_PACKAGES = ("ray", "tritonclient", "mlflow")


def imported_after(modules: tuple[str, ...], watched: tuple[str, ...]) -> list[str]:
    """The ``watched`` top-level packages in ``sys.modules`` after importing ``modules``."""
    code = (
        "import importlib, sys\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        f"print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & {set(watched)!r})))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy()
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_the_core_imports_no_ray_triton_client_or_mlflow():
    assert imported_after(CORE, ADAPTER_PACKAGES) == []


@pytest.mark.parametrize("adapter, package", [
    ("infergate.serve_app", "ray"), ("infergate.triton.client", "tritonclient"),
    ("infergate.registry", "mlflow"),
])  # fmt: skip
def test_the_check_sees_what_an_adapter_imports(adapter, package):
    assert package in imported_after((adapter,), ADAPTER_PACKAGES)


def test_backend_model_is_never_imported_by_the_package():
    # It imports triton_python_backend_utils, which exists only inside Triton.
    modules = ("infergate.triton.client", "infergate.triton.repository", "infergate.triton.server")
    code = (
        f"import importlib, sys\nfor name in {list(modules)!r}: importlib.import_module(name)\n"
        "assert 'infergate.triton.backend_model' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy())
