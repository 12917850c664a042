"""pytest imports test modules by their file name (no packages under tests/), putting each
test module's folder on ``sys.path``: two modules of one name in two folders stop the
whole run at collection, and a folder named like a module that some library imports if it
is there becomes that module (a ``tests/unit/triton/`` folder was imported by PyTorch as
OpenAI's Triton compiler, and every model load failed)."""

import importlib.util
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# Optional modules the libraries under test look for at import: absent here, so a folder
# of that name would be found instead.
OPTIONAL_IMPORTS = ("triton", "apex", "flash_attn", "deepspeed", "accelerate", "tensorrt")


def test_no_two_test_modules_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []


def test_no_test_folder_shadows_a_module():
    folders = {path.name for path in TESTS.rglob("*") if path.is_dir()}
    shadowing = [
        name
        for name in sorted(folders)
        if name in OPTIONAL_IMPORTS or (name.isidentifier() and _installed(name))
    ]
    assert shadowing == []


def _installed(name: str) -> bool:
    """A top-level module of that name outside the project (the standard library or the
    venv)."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return False
    places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    return any(place and TESTS.parent not in Path(place).parents for place in places)
