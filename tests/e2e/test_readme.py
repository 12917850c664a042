"""The code blocks of the README and of the docs pages, run against the session stack in
the order a reader meets them (README.md, then the pages in mkdocs.yml's nav), as a reader
would type them; what each prints is compared with what its page says it prints
(tests/readme_blocks.py says how blocks and expected outputs are read).

Each block runs in a folder of its own where ``.venv`` is this interpreter's environment
and ``path/to/hf-model-folder`` (and ``new-``) are tiny classifiers, with the session
stack's addresses in place of the default ones. The README's blocks show a fresh
``up --demo`` stack (its model lists): the modules that ran before on the session stack
registered models of their own, so the ``readme`` fixture takes those off first, whatever
the order the modules run in. The docs pages' own model, ``reviews`` (registered in
docs/registration.md, rolled out in docs/canary-rollouts.md), is left served with no
rollout running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import Stack, wait_for
from mlflow import MlflowClient

from readme_blocks import ROOT, Block, bash_commands, output_mismatch, printed_comments
from readme_blocks import readme_blocks as read_readme_blocks
from tiny_models import tiny_bert

pytestmark = pytest.mark.e2e
BLOCKS = [block for block in read_readme_blocks() if block.runs]
MODEL_FOLDERS = {"path/to/hf-model-folder": 0, "path/to/new-hf-model-folder": 1}  # and seeds
# What a fresh `up --demo` stack serves (infergate.registration.demo), as the README shows it.
DEMO_MODELS = ("embed", "ner", "sentiment")
DEMO_ALIASES = {"champion": "1"}
# One print call's output ends with this (see PRINT_HOOK).
END_OF_PRINT = "\x1e"
PRINT_HOOK = f"""\
import builtins, runpy, sys
_print = builtins.print
def _each(*args, **kwargs):
    _print(*args, **kwargs)
    _print({END_OF_PRINT!r}, end="", flush=True)
builtins.print = _each
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def default_addresses(stack: Stack) -> dict[str, str]:
    """The README's addresses (deployments/local.yaml's defaults) and the session stack's."""
    prometheus = f"127.0.0.1:{stack.env['INFERGATE_PROMETHEUS__PORT']}"
    return {
        "127.0.0.1:8000": stack.url.removeprefix("http://"),
        "127.0.0.1:5000": stack.mlflow.removeprefix("http://"),
        "127.0.0.1:8104": stack.admin.removeprefix("http://"),
        "127.0.0.1:9090": prometheus,
        "127.0.0.1:8081": f"127.0.0.1:{stack.env['INFERGATE_FRONTEND__GRPC_PORT']}",
    }


def serve_the_demo_models_alone(stack: Stack) -> None:
    """Bring the session stack back to what `up --demo` served: every other model loses
    its aliases (a rollout running ends), so nothing serves it, and each demo model has
    version 1 as champion and no canary; then wait until the front-end serves that."""
    client = MlflowClient(stack.mlflow)
    for model in client.search_registered_models(max_results=1000):
        wanted = DEMO_ALIASES if model.name in DEMO_MODELS else {}
        for alias, version in model.aliases.items():
            if wanted.get(alias) != version:
                client.delete_registered_model_alias(model.name, alias)
        for alias, version in wanted.items():
            if model.aliases.get(alias) != version:
                client.set_registered_model_alias(model.name, alias, version)
    alone = {"version": "1", "role": "champion", "weight": 100, "loaded": True}
    demo = [{"name": name, "versions": [alone]} for name in DEMO_MODELS]

    def served_alone(http: httpx.Client) -> bool:
        listed = http.get("/v1/models").json().get("models", [])
        shown = [{"name": m["name"], "versions": m["versions"]} for m in listed]
        ready = http.get("/readyz")
        return (
            shown == demo
            and ready.status_code == 200
            and ready.json()["models"] == [m["name"] for m in demo]
        )

    with httpx.Client(base_url=stack.url, timeout=30) as http:
        # Several answers in a row: each front-end replica has taken the new table.
        wait_for(lambda: all(served_alone(http) for _ in range(5)), 180, "the demo models alone")


@pytest.fixture(scope="module")
def readme(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the blocks run in, on a stack serving the demo models alone."""
    serve_the_demo_models_alone(stack)
    folder = tmp_path_factory.mktemp("readme")
    (folder / ".venv").symlink_to(Path(sys.executable).parents[1])
    for path, seed in MODEL_FOLDERS.items():
        tiny_bert(folder / path, "text-classification", labels=("negative", "positive"), seed=seed)
    return folder


def at_the_stack(text: str, stack: Stack) -> str:
    for default, address in default_addresses(stack).items():
        text = text.replace(default, address)
    return text


def dashboards() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((ROOT / "dashboards").glob("*.json"))}


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_the_readme_block_runs_and_prints_what_the_readme_says(block: Block, stack, readme):
    checked_in = dashboards()
    try:
        if block.language == "python":
            run_python(block, stack, readme)
        else:
            run_bash(block, stack, readme)
    finally:
        # `dashboards generate` writes into the checkout: the same bytes, or they were stale.
        rewritten = [name for name, data in dashboards().items() if checked_in[name] != data]
        for name in rewritten:
            (ROOT / "dashboards" / name).write_bytes(checked_in[name])
    assert not rewritten, f"the block rewrote dashboards/{rewritten}: they were not current"


def run_bash(block: Block, stack: Stack, folder: Path) -> None:
    printed = []
    for command in bash_commands(block.code):
        missing = [p for p in MODEL_FOLDERS if p in command and not (folder / p).is_dir()]
        assert not missing, missing
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", at_the_stack(command, stack)],
            cwd=folder, env=stack.env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr[-3000:]}"
        if done.stdout.strip():
            printed.append(done.stdout.rstrip("\n"))
    expected = at_the_stack(block.output.code, stack) if block.output else ""
    mismatch = output_mismatch(expected, "\n".join(printed))
    assert mismatch is None, f"{block.page} line {block.line}: {mismatch}"


def run_python(block: Block, stack: Stack, folder: Path) -> None:
    script = folder / f"{Path(block.page).stem}_line_{block.line}.py"
    script.write_text(at_the_stack(block.code, stack))
    # A reader's Python runs without the stack's HF_HUB_OFFLINE, which huggingface_hub's
    # InferenceClient obeys even for a local server (it refuses every request).
    env = {key: value for key, value in stack.env.items() if key != "HF_HUB_OFFLINE"}
    done = subprocess.run(
        [sys.executable, "-c", PRINT_HOOK, str(script)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    *calls, after_the_last = done.stdout.split(END_OF_PRINT)
    expected = printed_comments(block.code)
    assert after_the_last == "" and len(calls) == len(expected), (expected, done.stdout)
    for said, printed in zip(expected, calls, strict=True):
        mismatch = output_mismatch(at_the_stack(said, stack), printed)
        assert mismatch is None, f"{block.page} line {block.line}: {mismatch}"
