"""Triton model repository and server command, without starting Triton."""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from infergate.config import TritonSettings
from infergate.triton.repository import (
    build_config,
    model_files,
    remove_model,
    render_config,
    write_model,
)
from infergate.triton.server import (
    find_tritonserver,
    prepare_backends,
    server_command,
    server_environment,
)
from infergate.versions import triton_model_name

SETTINGS = TritonSettings(
    max_batch_size=32, max_queue_delay_us=750, instance_count=2, ort_intra_op_threads=1
)


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_config_matches_the_contract() -> None:
    config = parse(
        render_config(
            build_config("sentiment__v3", output_name="logits", output_dim=2, settings=SETTINGS)
        )
    )

    assert config.name == "sentiment__v3"
    assert config.backend == "python"
    assert config.max_batch_size == 32
    assert [(i.name, i.data_type, list(i.dims), i.allow_ragged_batch) for i in config.input] == [
        ("input_ids", mc.TYPE_INT64, [-1], True),
        ("attention_mask", mc.TYPE_INT64, [-1], True),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("logits", mc.TYPE_FP32, [2])
    ]
    assert config.dynamic_batching.max_queue_delay_microseconds == 750
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (2, mc.ModelInstanceGroup.KIND_CPU)
    ]
    assert config.parameters["ort_intra_op_threads"].string_value == "1"


def test_native_onnxruntime_config_follows_the_backends_documented_parameters() -> None:
    """Triton's ONNX Runtime backend (onnxruntime_backend README): platform
    onnxruntime_onnx, its thread parameter, and no ragged inputs (it takes one tensor)."""
    settings = SETTINGS.model_copy(update={"backend": "onnxruntime"})
    config = parse(
        render_config(build_config("m__v1", output_name="logits", output_dim=2, settings=settings))
    )
    assert (config.platform, config.backend) == ("onnxruntime_onnx", "")
    assert config.default_model_filename == "model.onnx"
    assert [(i.name, i.allow_ragged_batch) for i in config.input] == [
        ("input_ids", False),
        ("attention_mask", False),
    ]
    assert config.parameters["intra_op_thread_count"].string_value == "1"
    assert "ort_intra_op_threads" not in config.parameters
    assert config.dynamic_batching.max_queue_delay_microseconds == 750
    assert not config.optimization.execution_accelerators.gpu_execution_accelerator
    assert [w.name for w in config.model_warmup] == ["warmup"]


def test_tensorrt_accelerates_native_gpu_instances_in_fp16() -> None:
    settings = SETTINGS.model_copy(update={"backend": "onnxruntime", "gpu": True, "tensorrt": True})
    config = build_config("m__v1", output_name="embeddings", output_dim=384, settings=settings)
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt"
    assert dict(accelerator.parameters) == {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": str(1 << 30),
    }
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    # TensorRT needs a GPU: on CPU instances the setting is not applied.
    on_cpu = build_config(
        "m__v1",
        output_name="embeddings",
        output_dim=384,
        settings=settings.model_copy(update={"gpu": False}),
    )
    assert not on_cpu.optimization.execution_accelerators.gpu_execution_accelerator


def test_an_unresolved_backend_builds_no_config() -> None:
    with pytest.raises(ValueError, match="resolved"):
        build_config(
            "m__v1",
            output_name="logits",
            output_dim=2,
            settings=SETTINGS.model_copy(update={"backend": "auto"}),
        )


def test_the_files_sent_with_a_load_are_the_folder_written_to_disk(tmp_path: Path) -> None:
    """A Triton that cannot read our disk gets the same folder through its repository API:
    the config as JSON and every file as a ``file:<path>`` override."""
    onnx_path = tmp_path / "model.onnx"
    onnx_path.write_bytes(b"onnx bytes")
    files = model_files("m__v1", onnx_path, output_name="logits", output_dim=2, settings=SETTINGS)
    config, overrides = files.load_request()
    assert json_format.Parse(config, mc.ModelConfig()) == files.config
    model_dir = write_model(
        tmp_path / "repository", "m__v1", onnx_path, output_name="logits", output_dim=2,
        settings=SETTINGS,
    )  # fmt: skip
    on_disk = {
        f"file:{path.relative_to(model_dir)}": path.read_bytes()
        for path in model_dir.rglob("*")
        if path.is_file() and path.name != "config.pbtxt"
    }
    assert overrides == on_disk
    assert set(overrides) == {
        "file:1/model.onnx", "file:1/model.py", "file:warmup/input_ids",
        "file:warmup/attention_mask",
    }  # fmt: skip
    native = model_files(
        "m__v1", onnx_path, output_name="logits", output_dim=2,
        settings=SETTINGS.model_copy(update={"backend": "onnxruntime"}),
    )  # fmt: skip
    assert "file:1/model.py" not in native.load_request()[1]


def test_gpu_setting_places_instances_on_gpus() -> None:
    settings = SETTINGS.model_copy(update={"gpu": True})
    config = build_config("m__v1", output_name="embeddings", output_dim=384, settings=settings)
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU


@pytest.mark.parametrize(
    ("name", "output_name", "output_dim", "message"),
    [
        ("m__v1", "probabilities", 2, "output_name"),
        ("m__v1", "logits", 0, "output_dim"),
        ("../escape", "logits", 2, "not a valid Triton model name"),
        ("", "logits", 2, "not a valid Triton model name"),
        ("a/b", "logits", 2, "not a valid Triton model name"),
    ],
)
def test_config_rejects_bad_arguments(
    name: str, output_name: str, output_dim: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_config(name, output_name=output_name, output_dim=output_dim, settings=SETTINGS)


def test_triton_model_name() -> None:
    assert triton_model_name("sentiment", "3") == "sentiment__v3"
    assert triton_model_name("Sentiment-EN_2", "12") == "Sentiment-EN_2__v12"
    odd = [triton_model_name(n, "1") for n in ("my model", "my_model", "my.model", "../x", "é")]
    assert len(set(odd)) == len(odd)
    for name in odd:
        build_config(name, output_name="logits", output_dim=2, settings=SETTINGS)  # valid
        assert "/" not in name and ".." not in name and " " not in name


def test_write_and_remove_model(tmp_path: Path) -> None:
    onnx_path = tmp_path / "exported.onnx"
    onnx_path.write_bytes(b"onnx bytes")
    repository = tmp_path / "repository"

    for _ in range(2):  # writing again replaces the folder's files
        model_dir = write_model(
            repository,
            "sentiment__v3",
            onnx_path,
            output_name="logits",
            output_dim=2,
            settings=SETTINGS,
        )

    assert model_dir == repository / "sentiment__v3"
    assert sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*")) == [
        "1",
        "1/model.onnx",
        "1/model.py",
        "config.pbtxt",
        "warmup",
        "warmup/attention_mask",
        "warmup/input_ids",
    ]
    assert parse((model_dir / "config.pbtxt").read_text()).output[0].name == "logits"
    backend_source = resources.files("infergate.triton").joinpath("backend_model.py")
    assert (model_dir / "1" / "model.py").read_bytes() == backend_source.read_bytes()
    assert (model_dir / "1" / "model.onnx").read_bytes() == b"onnx bytes"
    assert (model_dir / "1" / "model.onnx").stat().st_ino == onnx_path.stat().st_ino  # linked

    remove_model(repository, "sentiment__v3")
    assert not model_dir.exists()
    remove_model(repository, "sentiment__v3")  # already gone: no error
    with pytest.raises(ValueError):
        remove_model(repository, "..")


def test_write_model_needs_the_onnx_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_model(
            tmp_path,
            "m__v1",
            tmp_path / "missing.onnx",
            output_name="logits",
            output_dim=2,
            settings=SETTINGS,
        )


def test_backend_model_compiles() -> None:
    # It cannot be imported here (see tests/integration/test_import_boundaries.py).
    source = resources.files("infergate.triton").joinpath("backend_model.py").read_text()
    compile(source, "backend_model.py", "exec")


# Server command line and environment: paths only, Triton is not started.


def test_prepare_backends_is_idempotent(tmp_path: Path) -> None:
    first = prepare_backends(tmp_path)
    stub = first / "python" / "triton_python_backend_stub"
    mtime = stub.stat().st_mtime_ns
    assert prepare_backends(tmp_path) == first == tmp_path / "triton-backends"
    assert stub.stat().st_mtime_ns == mtime
    assert os.access(stub, os.X_OK)
    assert (first / "python" / "libtriton_python.so").is_file()
    assert not list(first.rglob("*.partial"))


def test_server_command_and_environment(tmp_path: Path) -> None:
    install = find_tritonserver()
    settings = TritonSettings(http_port=1, grpc_port=2, metrics_port=3)
    command = server_command(settings, tmp_path / "repo", tmp_path / "backends")
    assert command[0] == str(install.binary)
    for flag in (
        f"--model-repository={tmp_path / 'repo'}",
        f"--backend-directory={tmp_path / 'backends'}",
        "--model-control-mode=explicit",
        "--exit-on-error=false",
        "--strict-readiness=false",
        "--allow-metrics=true",
        "--http-port=1",
        "--grpc-port=2",
        "--metrics-port=3",
    ):
        assert flag in command

    env = server_environment({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib", "KEEP": "1"})
    assert env["LD_LIBRARY_PATH"] == f"{install.libs_dir}{os.pathsep}/opt/lib"
    assert env["PATH"] == f"{Path(sys.executable).parent}{os.pathsep}/usr/bin"
    assert env["KEEP"] == "1"
    assert server_environment({})["LD_LIBRARY_PATH"] == str(install.libs_dir)


def test_a_translation_version_is_a_python_model_running_ctranslate2(tmp_path: Path) -> None:
    from infergate.triton.repository import translation_files

    ct2 = tmp_path / "ctranslate2"
    ct2.mkdir()
    for name in ("model.bin", "config.json", "shared_vocabulary.json"):
        (ct2 / name).write_bytes(b"x")
    settings = SETTINGS.model_copy(update={"backend": "onnxruntime"})  # not for this model
    files = translation_files(
        "opus__v1", ct2, precision="int8", max_decoding_length=63, settings=settings
    )
    config = files.config
    assert config.backend == "python" and not config.platform
    assert [(i.name, list(i.dims), i.allow_ragged_batch) for i in config.input] == [
        ("input_ids", [-1], True),
        ("attention_mask", [-1], True),
        ("decoding", [2], False),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("translation_ids", mc.TYPE_INT64, [-1])
    ]
    assert config.parameters["precision"].string_value == "int8"
    assert config.parameters["max_decoding_length"].string_value == "63"
    assert sorted(files.files) == [
        "1/ctranslate2/config.json",
        "1/ctranslate2/model.bin",
        "1/ctranslate2/shared_vocabulary.json",
        "1/model.py",
        "warmup/attention_mask",
        "warmup/decoding",
        "warmup/input_ids",
    ]
    model_py = resources.files("infergate.triton").joinpath("translator_model.py").read_bytes()
    assert files.files["1/model.py"] == model_py
    # the config round-trips through Triton's text format, as written to config.pbtxt
    assert parse(render_config(config)) == config
    with pytest.raises(FileNotFoundError):
        translation_files("opus__v1", tmp_path, precision="int8", max_decoding_length=63,
                          settings=settings)  # fmt: skip
