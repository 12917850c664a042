"""The gRPC cell: the platform's front-end called with the Open Inference Protocol over gRPC
beside HTTP, on the same texts at the same concurrency, in one run (``infergate bench
--scenarios ... grpc``).

On a running stack of the bench (the first of ``lean`` and ``infergate`` among the
scenarios, after that scenario's cells; or one of its own when neither runs), each cell
of the profile at concurrency 32 and 16 tokens (one text a request, and 16) is measured
once per way in (``WAYS``), one after the other, with the bench's load generator and CPU
accounting (``infergate.bench.measure.measure_cell``):

- ``http predict``: ``POST /v1/models/sentiment/predict``, the infergate scenario's cell;
- ``http v2``: the V2 protocol's REST form, ``POST /v2/models/sentiment/infer`` (JSON);
- ``grpc v2``: ``ModelInfer`` on ``frontend.grpc_port`` (``infergate.bench.grpc_load``).

Each side has its best setting: over HTTP a keep-alive connection per client (what the
generator always does), over gRPC ``CLIENTS_PER_CHANNEL`` clients per channel, each
channel its own connection (one: the fastest of 1, 4 and 32 in a trial here, see
docs/benchmarks.md). A probe first sends the same two texts each way: the labels must
agree, and gRPC's probabilities must equal V2 REST's. The results go under ``grpc``;
``infergate.bench.grpc_table`` turns them into the report's rows and ratios.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from infergate.bench.grpc_load import GrpcTarget, call_once, infer_outputs, infer_request
from infergate.bench.loadgen import HttpTarget, LoadTarget, run_sync, send_once
from infergate.bench.measure import DISTINCT_BODIES, measure_cell, progress_line
from infergate.bench.options import BenchOptions, Say
from infergate.bench.prepare import MODEL_NAME, PreparedModel
from infergate.bench.scenarios import HOST, infergate_body, infergate_labels
from infergate.bench.stack_scenarios import InfergateStack
from infergate.bench.workload import PROBE_TEXTS, Cell, Profile, TextSets

CONCURRENCY = 32
TOKENS = 16
CLIENTS_PER_CHANNEL = 1  # a channel, so a connection, per client: see the docstring
INPUT = "text"  # the V2 input of a text model (infergate.protocols.kserve_v2)
# The platform's Ray Serve application (infergate.serve_app.APP_NAME, not imported here:
# that module loads Ray), named in each call: the lean scenario deploys a second one.
APPLICATION = (("application", "infergate"),)
# The smoke checks that the cell runs, not its figures: there a measurement that other
# load disturbed is not taken again, so that the cell keeps to its ~15 s of the run.
ONCE_IN = ("smoke",)
PREDICT_PATH = InfergateStack.path
V2_PATH = f"/v2/models/{MODEL_NAME}/infer"


def v2_body(texts: Sequence[str]) -> bytes:
    """A V2 REST infer request with ``texts`` as the text input (every output)."""
    tensor = {"name": INPUT, "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}
    return orjson.dumps({"inputs": [tensor]})


def v2_outputs(answer: bytes) -> dict[str, np.ndarray]:
    """A V2 REST answer's outputs as arrays (labels as bytes, as gRPC's)."""
    arrays = {}
    for output in orjson.loads(answer)["outputs"]:
        data = output["data"]
        if output["datatype"] == "BYTES":
            values = np.array([value.encode() for value in data], dtype=object)
        else:
            values = np.array(data, dtype=np.float32)
        arrays[output["name"]] = values.reshape(output["shape"])
    return arrays


@dataclass(frozen=True)
class Way:
    """One way into the front-end: its name, the endpoint and the client's setting."""

    name: str
    endpoint: str
    setting: str
    target: Callable[[InfergateStack, list[list[str]]], LoadTarget]


def channel_setting(clients_per_channel: int) -> str:
    if clients_per_channel == 1:
        return "a channel (its own connection) per client"
    return f"{clients_per_channel} clients per channel (its own connection)"


def _grpc_port(stack: InfergateStack) -> int:
    return int(stack.env["INFERGATE_FRONTEND__GRPC_PORT"])


WAYS = (
    Way("http predict", f"POST {PREDICT_PATH}", "a keep-alive connection per client",
        lambda stack, requests: HttpTarget(
            HOST, stack.port, PREDICT_PATH, tuple(map(infergate_body, requests)))),
    Way("http v2", f"POST {V2_PATH}", "a keep-alive connection per client",
        lambda stack, requests: HttpTarget(
            HOST, stack.port, V2_PATH, tuple(map(v2_body, requests)))),
    Way("grpc v2", "ModelInfer", channel_setting(CLIENTS_PER_CHANNEL),
        lambda stack, requests: GrpcTarget(
            HOST, _grpc_port(stack),
            tuple(infer_request(MODEL_NAME, INPUT, texts) for texts in requests),
            clients_per_channel=CLIENTS_PER_CHANNEL, metadata=APPLICATION)),
)  # fmt: skip


def cells_of(profile: Profile) -> list[Cell]:
    """The profile's cells the gRPC cell measures: concurrency 32, 16 tokens."""
    return sorted(c for c in profile.cells if c.concurrency == CONCURRENCY and c.tokens == TOKENS)


def probe(stack: InfergateStack, timeout_s: float) -> dict[str, Any]:
    """``PROBE_TEXTS`` each way: the labels of each, and whether they agree (gRPC's
    probabilities equal to V2 REST's, its labels to both HTTP answers')."""
    texts = list(PROBE_TEXTS)
    predict = HttpTarget(HOST, stack.port, PREDICT_PATH, (b"",))
    status, answer = run_sync(lambda: send_once(predict, infergate_body(texts), timeout_s))
    if status != 200:
        raise RuntimeError(f"the predict probe answered {status}: {answer[:300]!r}")
    rest = HttpTarget(HOST, stack.port, V2_PATH, (b"",))
    rest_status, rest_answer = run_sync(lambda: send_once(rest, v2_body(texts), timeout_s))
    if rest_status != 200:
        raise RuntimeError(f"the V2 REST probe answered {rest_status}: {rest_answer[:300]!r}")
    request = infer_request(MODEL_NAME, INPUT, texts)
    grpc_target = GrpcTarget(HOST, _grpc_port(stack), (request,), metadata=APPLICATION)
    over_grpc = infer_outputs(run_sync(lambda: call_once(grpc_target, request, timeout_s)))
    over_rest = v2_outputs(rest_answer)
    labels = {
        "http predict": infergate_labels(answer),
        "http v2": [label.decode() for label in over_rest["label"]],
        "grpc v2": [label.decode() for label in over_grpc["label"]],
    }
    same_tensors = set(over_grpc) == set(over_rest) and all(
        np.array_equal(over_grpc[name], over_rest[name]) for name in over_grpc
    )
    agree = same_tensors and labels["grpc v2"] == labels["http v2"] == labels["http predict"]
    return {"labels": labels, "tensors_equal_v2_rest": same_tensors, "agree": agree}


def measure_grpc_cell(
    stack: InfergateStack, texts: TextSets, profile: Profile, options: BenchOptions, say: Say
) -> dict[str, Any]:
    """The cell on ``stack`` (running): see the module's docstring."""
    began = time.monotonic()
    if profile.name in ONCE_IN:
        options = replace(options, noisy_retries=0)
    record: dict[str, Any] = {
        "stack": stack.name, "model": MODEL_NAME,
        "ways": {way.name: {"endpoint": way.endpoint, "setting": way.setting} for way in WAYS},
        "load_average_at_start": list(os.getloadavg()), "rows": [],
    }  # fmt: skip
    say(f"[grpc] the platform's front-end over gRPC beside HTTP, on the {stack.name} stack")
    try:
        record["probe"] = probe(stack, options.timeout_s)
        for cell in cells_of(profile):
            requests = [texts.request_texts(cell, i) for i in range(DISTINCT_BODIES)]
            for way in WAYS:
                target = way.target(stack, requests)
                row = measure_cell(stack, texts, cell, profile, options, say, target)
                record["rows"].append({**row, "way": way.name})
                say(progress_line(way.name, row))
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        say(f"[grpc] FAILED: {record['error']}")
        traceback.print_exc()
    record["load_average_at_end"] = list(os.getloadavg())
    record["cell_s"] = round(time.monotonic() - began, 1)
    return record


def on_own_stack(
    prepared: PreparedModel,
    texts: TextSets,
    profile: Profile,
    options: BenchOptions,
    workdir: Path,
    say: Say,
) -> dict[str, Any]:
    """The cell on a stack of its own, for a run with no stack scenario."""
    stack = InfergateStack(prepared, workdir / "stack-run")
    say("[grpc] starting a stack of its own")
    try:
        stack.start()
        return measure_grpc_cell(stack, texts, profile, options, say)
    except Exception as exc:
        say(f"[grpc] FAILED: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}", "log_tail": stack.log_tail()}
    finally:
        stack.stop()
