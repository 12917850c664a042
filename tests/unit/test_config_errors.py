"""A wrong setting is one line: the setting, where it came from (the file or the
environment variable), what it should be, and for a name that is no setting the nearest
one that is. The command line prints that line and exits 1, without a traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import infergate
from infergate.cli import main
from infergate.config import load_config
from infergate.errors import InvalidConfig


def config_error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InvalidConfig) as raised:
        load_config(path, environ=environ or {})
    return raised.value.message.replace(str(path), "c.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("triton:\n  grcp_port: 1\n",
         "triton.grcp_port in c.yaml is not a setting; did you mean triton.grpc_port?"),
        ("tritn:\n  grpc_port: 1\n", "tritn in c.yaml is not a setting; did you mean triton?"),
        ("serve:\n  autoscaling:\n    max_replica: 3\n",
         "serve.autoscaling.max_replica in c.yaml is not a setting; "
         "did you mean serve.autoscaling.max_replicas?"),
        ("prometheus:\n  xyzzy: 1\n",
         "prometheus.xyzzy in c.yaml is not a setting; prometheus has enabled, port, binary"),
    ],
)  # fmt: skip
def test_an_unknown_name_in_the_file_gets_the_nearest_valid_one(tmp_path, text, message):
    assert config_error(tmp_path, text) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("triton:\n  grpc_port: abc\n",
         "triton.grpc_port in c.yaml is 'abc'; it should be a valid integer, unable to parse "
         "string as an integer"),
        ("triton:\n  max_batch_size: 0\n",
         "triton.max_batch_size in c.yaml is 0; it should be greater than or equal to 1"),
        ("triton:\n  backend: tensorflow\n",
         "triton.backend in c.yaml is 'tensorflow'; it should be 'python', 'onnxruntime' or "
         "'auto'"),
        ("serve: 8000\n", "serve in c.yaml is 8000; it should be a mapping of settings"),
        ("state_dir: 5\n", "state_dir in c.yaml is 5; it should be a path"),
        ("triton:\n  grpc_port: a\n  http_port: b\n",
         "triton.http_port in c.yaml is 'b'; it should be a valid integer, unable to parse "
         "string as an integer (and 1 more wrong setting)"),
    ],
)  # fmt: skip
def test_a_wrong_value_in_the_file_says_what_it_should_be(tmp_path, text, message):
    assert config_error(tmp_path, text) == message


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"INFERGATE_TRITON__GRPC_PORT": "abc"},
         "triton.grpc_port from INFERGATE_TRITON__GRPC_PORT is 'abc'; it should be a valid "
         "integer, unable to parse string as an integer"),
        ({"INFERGATE_TRITON__GRCP_PORT": "9101"},
         "triton.grcp_port from INFERGATE_TRITON__GRCP_PORT is not a setting; "
         "did you mean INFERGATE_TRITON__GRPC_PORT?"),
        ({"INFERGATE_SERVE__AUTOSCALING__MAX_REPLICA": "3"},
         "serve.autoscaling.max_replica from INFERGATE_SERVE__AUTOSCALING__MAX_REPLICA is not "
         "a setting; did you mean INFERGATE_SERVE__AUTOSCALING__MAX_REPLICAS?"),
        ({"INFERGATE_FRONTEND__PAYLOADS__TEXTS": "redact"},
         "frontend.payloads from INFERGATE_FRONTEND__PAYLOADS__TEXTS is {'texts': 'redact'}; "
         "texts: redact needs redact_model, the model that finds entities"),
        ({"INFERGATE_TRITON": "5", "INFERGATE_TRITON__GRPC_PORT": "9101"},
         "INFERGATE_TRITON__GRPC_PORT sets triton.grpc_port, inside triton, which "
         "INFERGATE_TRITON sets to '5'; unset one of them"),
    ],
)  # fmt: skip
def test_a_wrong_environment_variable_is_named(tmp_path, environ, message):
    assert config_error(tmp_path, "", environ) == message


@pytest.mark.parametrize(
    ("variable", "message"),
    [
        ("INFERGATE_ADMIN_TOKEN", "admin_token from INFERGATE_ADMIN_TOKEN is not a setting; "
                                  "did you mean INFERGATE_ADMIN__TOKEN?"),
        ("INFERGATE_TRITN__GRPC_PORT", "tritn.grpc_port from INFERGATE_TRITN__GRPC_PORT is not a "
                                       "setting; did you mean INFERGATE_TRITON__GRPC_PORT?"),
        ("INFERGATE_API_KEY", "api_key from INFERGATE_API_KEY is not a setting; the top level "
                              "has state_dir, mlflow, triton, serve, frontend, prometheus, "
                              "admin, reconcile_interval_s"),
    ],
)  # fmt: skip
def test_a_misspelt_variable_is_matched_as_a_whole(tmp_path, variable, message):
    """A single underscore where two belong, or a misspelt section: the suggestion is the
    whole variable to set, not only the section's name."""
    assert config_error(tmp_path, "", {variable: "1"}) == message


def test_the_variable_that_overrides_the_file_is_the_one_named(tmp_path):
    message = config_error(tmp_path, "triton:\n  grpc_port: 9101\n  http_port: 9100\n",
                           {"INFERGATE_TRITON__GRPC_PORT": "x"})  # fmt: skip
    assert message.startswith("triton.grpc_port from INFERGATE_TRITON__GRPC_PORT is 'x';")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("triton: [\n", "c.yaml is not valid YAML: expected the node content, but found "
                        "'<stream end>' (line 2, column 1)"),
        ("- triton\n", "c.yaml holds a list; it should be a mapping of settings"),
    ],
)  # fmt: skip
def test_a_file_that_is_no_mapping_of_settings_is_one_line(tmp_path, text, message):
    assert config_error(tmp_path, text) == message


@pytest.fixture
def clean_environment(monkeypatch):
    for name in os.environ:
        if name.startswith("INFERGATE_"):
            monkeypatch.delenv(name)


def test_the_command_line_prints_the_line_and_exits_1(tmp_path, capsys, clean_environment):
    path = tmp_path / "c.yaml"
    path.write_text("frontend:\n  max_body_byte: 10\n")
    assert main(["keys", "list", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"error: frontend.max_body_byte in {path} is not a setting; "
        "did you mean frontend.max_body_bytes?\n"
    )


def test_the_command_line_names_a_wrong_variable(tmp_path, capsys, monkeypatch, clean_environment):
    monkeypatch.setenv("INFERGATE_SERVE__PORT", "eighty")
    assert main(["keys", "list", "--config", str(tmp_path / "none.yaml")]) == 1
    assert capsys.readouterr().err == (
        "error: serve.port from INFERGATE_SERVE__PORT is 'eighty'; it should be a valid "
        "integer, unable to parse string as an integer\n"
    )


def test_a_wrong_setting_in_a_real_process_is_one_line_on_stderr(tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("INFERGATE_")}
    environ["PYTHONPATH"] = str(Path(infergate.__file__).parents[1])
    environ["INFERGATE_TRITON__GRCP_PORT"] = "9101"
    done = subprocess.run(
        [sys.executable, "-m", "infergate", "keys", "list", "--config", str(tmp_path / "no")],
        env=environ, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == (
        "error: triton.grcp_port from INFERGATE_TRITON__GRCP_PORT is not a setting; "
        "did you mean INFERGATE_TRITON__GRPC_PORT?\n"
    )
