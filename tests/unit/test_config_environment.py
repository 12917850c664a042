"""What an INFERGATE_* variable's text means: read as its setting's type by pydantic, as
YAML only for a mapping, a list or null."""

import re

import pytest

from infergate.config import DEFAULT_CONFIG_FILE, PROJECT_ROOT, load_config
from infergate.errors import InvalidConfig


@pytest.mark.parametrize("token", ["12345", "007", "@dm1n", "yes", "1e3", "`x`", "[x"])
def test_a_token_is_taken_as_written(token):
    config = load_config(DEFAULT_CONFIG_FILE, environ={"INFERGATE_ADMIN__TOKEN": token})
    assert config.admin.token == token


def test_numbers_and_flags_are_read_as_their_settings_types():
    config = load_config(DEFAULT_CONFIG_FILE, environ={
        "INFERGATE_TRITON__GRPC_PORT": "9101", "INFERGATE_SERVE__FAST_INGRESS": "false",
        "INFERGATE_TRITON__GPU": "yes", "INFERGATE_ADMIN__ANALYSIS_INTERVAL_S": "2.5",
    })  # fmt: skip
    assert config.triton.grpc_port == 9101 and config.serve.fast_ingress is False
    assert config.triton.gpu is True and config.admin.analysis_interval_s == 2.5


def test_a_mapping_sets_a_section_and_null_unsets_a_setting():
    config = load_config(DEFAULT_CONFIG_FILE, environ={
        "INFERGATE_SERVE__AUTOSCALING": "{min_replicas: 2, max_replicas: 4}",
        "INFERGATE_SERVE__AUTOSCALING__MAX_REPLICAS": "3",
        "INFERGATE_SERVE__RAY_NUM_CPUS": "null",
    })  # fmt: skip
    assert (config.serve.autoscaling.min_replicas, config.serve.autoscaling.max_replicas) == (2, 3)
    assert config.serve.ray_num_cpus is None


def test_what_make_and_ci_export_is_a_setting_or_outside_the_prefix():
    """Every INFERGATE_* variable reaches the settings, so one the Makefile or CI exports
    for another purpose would stop every `infergate` command the tests start."""
    exported = set()
    for path in (PROJECT_ROOT / "Makefile", PROJECT_ROOT / ".ci" / "run"):
        exported |= set(re.findall(r"\bexport\s+(INFERGATE_\w+)", path.read_text()))
        exported |= set(re.findall(r"^\s*(INFERGATE_\w+)\s*[:?]?=", path.read_text(), re.M))
    for name in sorted(exported - {"INFERGATE_CONFIG"}):
        try:
            load_config(DEFAULT_CONFIG_FILE, environ={name: "1"})
        except InvalidConfig as error:
            assert "is not a setting" not in str(error), error
