from pathlib import Path

import pytest
from pydantic import ValidationError

from infergate.config import DEFAULT_CONFIG_FILE, load_config
from infergate.errors import InvalidConfig


def test_shipped_defaults_load():
    config = load_config(DEFAULT_CONFIG_FILE, environ={})
    assert config.serve.port == 8000
    assert config.triton.grpc_port == 8101


def test_environment_overrides_nested_fields(tmp_path: Path):
    config = load_config(
        DEFAULT_CONFIG_FILE,
        environ={"INFERGATE_TRITON__GRPC_PORT": "9101", "INFERGATE_SERVE__FAST_INGRESS": "false"},
    )
    assert config.triton.grpc_port == 9101
    assert config.serve.fast_ingress is False
    assert config.frontend_settings().triton_grpc_url == "127.0.0.1:9101"


def test_unknown_fields_are_refused(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("triton:\n  grcp_port: 1\n")
    with pytest.raises(InvalidConfig, match="grcp_port"):
        load_config(path, environ={})


def test_config_is_frozen():
    config = load_config(DEFAULT_CONFIG_FILE, environ={})
    with pytest.raises(ValidationError):
        config.serve.port = 1  # type: ignore[misc]
