"""The whole package type-checks (mypy, configured in pyproject.toml), as `make lint` runs it."""

import shutil
import subprocess
import sys
from pathlib import Path

from infergate.config import PROJECT_ROOT


def test_the_package_type_checks(tmp_path: Path):
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    assert mypy, "mypy is a dev dependency: make install"
    run = subprocess.run(
        [mypy, "--cache-dir", str(tmp_path)], cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success" in run.stdout
