"""A real Triton for measurements in process: one served version's ONNX file (or a stand-in
graph that costs Triton next to nothing) loaded as several Triton models, one per code
tree that ``infergate.bench.request_cpu`` runs side by side."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infergate.config import TritonSettings


def start_triton(
    workdir: Path, served_dir: Path, model: str, versions: Sequence[str], *, stand_in: bool
) -> tuple[subprocess.Popen, TritonSettings]:
    """A tritonserver serving ``served_dir``'s ONNX file as each of ``model``'s
    ``versions``, one Triton model each, so that side by side no worker waits in the
    other's queue (with ``stand_in``, :func:`write_stand_in_graph`'s graph instead);
    the stack's Triton settings (``load_config``) on free ports."""
    from infergate.config import load_config
    from infergate.stack.processes import free_ports
    from infergate.triton.client import TritonControl
    from infergate.triton.repository import write_model
    from infergate.triton.server import prepare_backends, server_command, server_environment
    from infergate.versions import triton_model_name

    http_port, grpc_port, metrics_port = free_ports(3)
    settings = load_config().triton.model_copy(
        update={"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    )
    spec = json.loads((served_dir / "infergate.json").read_text())
    repository = workdir / "repository"
    repository.mkdir(parents=True, exist_ok=True)
    onnx_path = served_dir / "model.onnx"
    if stand_in:
        onnx_path = workdir / "stand_in.onnx"
        write_stand_in_graph(onnx_path, spec["output_name"])
    triton_names = [triton_model_name(model, version) for version in versions]
    for triton_name in triton_names:
        write_model(
            repository,
            triton_name,
            onnx_path,
            output_name=spec["output_name"],
            output_dim=spec["output_dim"],
            settings=settings,
        )
    command = server_command(settings, repository, prepare_backends(workdir))
    log = (workdir / "tritonserver.log").open("wb")
    process = subprocess.Popen(
        command, env=server_environment(os.environ), stdout=log, stderr=subprocess.STDOUT
    )
    control = TritonControl(settings.grpc_url)
    try:
        deadline = time.monotonic() + settings.startup_timeout_s
        while not control.server_ready():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver did not start; see {workdir}/tritonserver.log")
            time.sleep(0.2)
        for triton_name in triton_names:
            control.load(triton_name, settings.load_timeout_s)
    except BaseException:
        process.terminate()
        process.wait(30)
        raise
    finally:
        control.close()
    return process, settings


def write_stand_in_graph(path: Path, output_name: str) -> None:
    """A graph with the served contract (``input_ids``, ``attention_mask`` -> ``[batch,
    2]`` float) that costs Triton next to nothing: the sine of each row's masked id sum
    and the cosine of its length. With the real model, Triton's own CPU on this 2-core
    box holds the replicas to a rate far below the issue's 819 req/s; the replica's work
    per request does not depend on what the graph computes."""
    import onnx
    from onnx import TensorProto, helper

    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["ids_f", "mask_f"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axes"], ["ids_sum"], keepdims=1),
        helper.make_node("ReduceSum", ["mask_f", "axes"], ["length"], keepdims=1),
        helper.make_node("Sin", ["ids_sum"], ["first"]),
        helper.make_node("Cos", ["length"], ["second"]),
        helper.make_node("Concat", ["first", "second"], [output_name], axis=1),
    ]
    batch_seq = ["batch", "sequence"]
    graph = helper.make_graph(
        nodes,
        "stand_in",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, batch_seq),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, batch_seq),
        ],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", 2])],
        initializer=[axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
