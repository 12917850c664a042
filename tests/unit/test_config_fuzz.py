"""Fuzzing the settings: whatever the config file and the INFERGATE_* variables hold,
load_config gives a StackConfig or an InvalidConfig of one line, never another error."""

import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infergate.config import StackConfig, load_config
from infergate.errors import InvalidConfig

SECTIONS = {name: list(field.annotation.model_fields)
            for name, field in StackConfig.model_fields.items()
            if hasattr(field.annotation, "model_fields")}  # fmt: skip
NAMES = sorted({*StackConfig.model_fields, *(n for ns in SECTIONS.values() for n in ns)})

names = st.sampled_from(NAMES) | st.text("abcdefghijklmnopqrstuvwxyz_019", max_size=12)
scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.sampled_from(["8101", "false", "null", "{max_replicas: 3}", "[1, 2]", "@x", "a: b"])
)  # fmt: skip
trees = st.recursive(
    scalars, lambda inner: st.dictionaries(names, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=12,
)  # fmt: skip
# Environment variables hold no NUL.
env_text = st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=20)
variables = st.dictionaries(
    st.lists(names, min_size=1, max_size=3).map(lambda p: "INFERGATE_" + "__".join(p).upper()),
    scalars.map(str).filter(lambda v: "\0" not in v) | env_text,
    max_size=4,
)
files = trees.map(lambda tree: yaml.safe_dump(tree, allow_unicode=True)) | st.text(max_size=80)


@given(text=files, environ=variables)
@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
def test_any_file_and_environment_give_a_config_or_one_line(text, environ):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_config(path, environ=environ)
        except InvalidConfig as error:
            assert "\n" not in error.message and error.message
