"""The task cells: for every task of ``infergate.bench.task_models.TASK_CASES``, infergate
over HTTP (the whole stack, as the ``infergate`` scenario starts it, every task's model
served at once) against the task's in-process ceiling, at concurrency 32 with a few texts
per request; for feature-extraction also the peers a user would pick instead
(``infergate.bench.peers``), driven by the same load generator.

Order: every task's ceiling, then the stack (a cell per task), then the peers, then every
ceiling again; each ceiling row keeps the faster of its two runs, as in the main run, so
that no ratio gains from a slow phase of the host. The stack is one of its own, or, in the
smoke, the lean scenario's (:class:`TaskRun` measures the cells on a stack it is given).
The results go under ``tasks`` in the results document (see
:func:`infergate.bench.analysis.task_rows`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from infergate.bench.loadgen import HttpTarget, run_sync, send_once
from infergate.bench.measure import (
    CEILING_NOISY_CPU_PERCENT,
    CEILING_THREADS,
    measure_cell,
    merge_ceiling_runs,
    progress_line,
)
from infergate.bench.options import BenchOptions, Say
from infergate.bench.peers import make_peer
from infergate.bench.prepare import PreparedModel, sha256
from infergate.bench.scenarios import HOST, Scenario
from infergate.bench.stack_scenarios import InfergateStack
from infergate.bench.task_models import PreparedTasks, Route, TaskModel, prepare_tasks
from infergate.bench.workload import Cell, Profile, build_text_sets
from infergate.versions import triton_model_name

TASK_CONCURRENCY = 32
TASK_TEXTS = 4  # texts per request: a few, as a search or indexing client sends
TASK_TOKENS = 16


def task_cell() -> Cell:
    return Cell(TASK_CONCURRENCY, TASK_TEXTS, TASK_TOKENS)


def served_task_files(state_dir: Path, tasks: PreparedTasks) -> dict[str, bool]:
    """Per task, whether the stack in ``state_dir`` serves the very file its ceiling runs."""
    served = {}
    for task, model in tasks.models.items():
        name = triton_model_name(model.case.model, model.version)
        file = state_dir / "triton-repository" / name / "1" / model.case.served_file
        served[task] = file.exists() and sha256(file) == model.model_sha256
    return served


class TaskStack(InfergateStack):
    """The whole stack on a copy of the task store: every task's model is a champion."""

    name = "infergate (tasks)"
    description = "infergate end to end, every task's model served: HAProxy -> Ray Serve -> Triton"

    def __init__(self, prepared: PreparedModel, tasks: PreparedTasks, workdir: Path) -> None:
        super().__init__(replace(prepared, store_dir=tasks.store_dir), workdir)
        self.tasks = tasks

    def start(self) -> None:
        super().start()
        # The ceiling of each task runs the very file Triton serves.
        self.info["served_model_is_prepared_file"] = served_task_files(self.state_dir, self.tasks)
        # The sentiment model's checks of the parent class: the task cells read the above.
        self.info.pop("served_onnx", None)
        self.info.pop("served_onnx_is_prepared_file", None)

    def triton_alone(self, texts: Any, profile: Profile) -> list[dict[str, Any]]:
        return []


def run_task_ceiling(
    model: TaskModel, profile: Profile, options: BenchOptions, say: Say
) -> dict[str, Any]:
    """The task's ceiling module on its served file, in a process of its own."""
    case = model.case
    command = [
        sys.executable,
        "-m",
        case.ceiling_module,
        f"--model={model.model_path}",
        f"--tokenizer={model.tokenizer_dir}",
        f"--spec={model.spec_path}",
        f"--lengths={TASK_TOKENS}",
        f"--duration={profile.ceiling_duration_s}",
        f"--threads={CEILING_THREADS}",
        f"--retries={options.noisy_retries}",
        f"--noisy-cpu-percent={CEILING_NOISY_CPU_PERCENT}",
        f"--quiet-wait={options.quiet_wait_s}",
        f"--task={case.task}",
    ]
    if case.query:
        command.append(f"--query={case.query}")
    if case.parameters:
        command.append(f"--parameters={json.dumps(dict(case.parameters))}")
    say(
        f"[ceiling: {case.task}] {case.ceiling_module} in one process on {case.model}'s served file"
    )
    done = subprocess.run(
        command, stdout=subprocess.PIPE, text=True, timeout=options.timeout_s * 20, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {case.task} ceiling failed with exit code {done.returncode}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _ceilings(
    models: dict[str, TaskModel],
    records: dict[str, dict[str, Any]],
    profile: Profile,
    options: BenchOptions,
    say: Say,
) -> None:
    """Measure every task's ceiling; a second call merges its rows with the first's."""
    for task, model in models.items():
        record = records[task]
        try:
            again = run_task_ceiling(model, profile, options, say)
        except Exception as exc:
            if not record.get("ceiling"):
                record["ceiling"] = {"error": f"{type(exc).__name__}: {exc}"}
            say(f"[ceiling: {task}] FAILED: {exc}")
            continue
        first = record.get("ceiling")
        if first and first.get("rows"):
            record["ceiling"] = merge_ceiling_runs(first, again)
        else:
            record["ceiling"] = again


def embeddings_of(answer: bytes) -> list[list[float]] | None:
    """The vectors of an embeddings answer, infergate's (``outputs``) or OpenAI's shape
    (``data``); None for another task's answer."""
    document = orjson.loads(answer)
    if "data" in document:
        return [item["embedding"] for item in document["data"]]
    outputs = document.get("outputs") or []
    if outputs and isinstance(outputs[0], list) and isinstance(outputs[0][0], float):
        return list(outputs)
    return None


def least_cosine(ours: list[list[float]], theirs: list[list[float]]) -> float:
    """The least cosine between the vectors two servers gave the same texts."""
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    cosines = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cosines.min())


def measure_task(
    scenario: Scenario,
    case: Route,
    tokenizer_dir: Path,
    profile: Profile,
    options: BenchOptions,
    say: Say,
    label: str,
) -> tuple[dict[str, Any], list[list[float]] | None]:
    """Probe, then measure the task cell of ``scenario`` on ``case``'s route; the probe
    must answer 200 with a result per text, else the cell is not measured. Returns the
    cell's row and the probe's vectors (embeddings only, to compare servers)."""
    cell = task_cell()
    texts = build_text_sets(tokenizer_dir, (cell.tokens,))
    bodies = [case.body(texts.request_texts(cell, i)) for i in range(64)]
    target = HttpTarget(HOST, scenario.port, case.path, tuple(bodies))
    status, answer = run_sync(lambda: send_once(target, bodies[0], options.timeout_s))
    answered = case.answers(answer) if status == 200 else None
    if answered != cell.texts:
        raise RuntimeError(
            f"{case.path} answered {status} with {answered} results for {cell.texts} texts: "
            f"{answer[:300]!r}"
        )
    row = measure_cell(scenario, texts, cell, profile, options, say, target)
    row["mean_tokens"] = texts.mean_tokens[cell.tokens]
    say(progress_line(label, row))
    return row, embeddings_of(answer)


class TaskRun:
    """The task part of a run, in its order: :meth:`ceilings`, the cells on a stack
    (:meth:`on_own_stack`, or :meth:`measure_on` a started stack and :meth:`shared_stack`
    once it is down), :meth:`finish` (the peers, the ceilings again, the ``tasks`` entry of
    the results document)."""

    def __init__(
        self,
        prepared: PreparedModel,
        task_names: Sequence[str],
        peers: Sequence[str],
        options: BenchOptions,
        workdir: Path,
        say: Say,
        cache_dir: Path,
    ) -> None:
        from infergate.bench.task_models import task_case

        self.prepared, self.peers, self.options, self.say = prepared, peers, options, say
        self.workdir = workdir
        cases = [task_case(name) for name in task_names]
        self.prepared_tasks = prepare_tasks(cases, prepared, cache_dir, say)
        self.records: dict[str, dict[str, Any]] = {
            case.task: {
                "model": case.model,
                "version": self.prepared_tasks.models[case.task].version,
                "precision": json.loads(
                    self.prepared_tasks.models[case.task].spec_path.read_text()
                ).get("precision"),
                "weights": case.weights,
                "random_weights": case.random_weights,
                "route": case.path,
                "served": {},
            }
            for case in cases
        }
        self.probes: dict[str, list[list[float]]] = {}
        self.measured_on: dict[str, Any] | None = None  # the stack measure_on was given
        self.started = time.monotonic()

    def ceilings(self) -> None:
        """Measure every task's ceiling; a second call merges its rows with the first's."""
        _ceilings(
            self.prepared_tasks.models, self.records, self.options.profile, self.options, self.say
        )

    def measure_on(self, stack: InfergateStack) -> None:
        """Every task's cell on ``stack``, started on a copy of the task store."""
        self.measured_on = {
            "served_model_is_prepared_file": served_task_files(stack.state_dir, self.prepared_tasks)
        }
        for task, model in self.prepared_tasks.models.items():
            try:
                row, vectors = measure_task(
                    stack, model.case, model.tokenizer_dir, self.options.profile, self.options,
                    self.say, task[:9],
                )  # fmt: skip
                self.records[task]["served"]["infergate"] = {"cell": row}
                if vectors is not None:
                    self.probes[task] = vectors
            except Exception as exc:
                self.records[task]["served"]["infergate"] = {
                    "error": f"{type(exc).__name__}: {exc}"
                }
                self.say(f"[tasks] {task} FAILED: {exc}")

    def on_own_stack(self) -> dict[str, Any]:
        """Start a stack of the task models, measure every cell on it, stop it; returns
        the ``stack`` entry (its start, its checks, what it left running, any error)."""
        stack_dir = self.workdir / "tasks-stack"
        stack_dir.mkdir(parents=True)
        stack = TaskStack(self.prepared, self.prepared_tasks, stack_dir)
        info: dict[str, Any] = {"description": stack.description}
        started = time.monotonic()
        try:
            self.say(f"[tasks] starting the stack with {', '.join(self.prepared_tasks.models)}")
            stack.start()
            info["start_s"] = round(time.monotonic() - started, 1)
            self.measure_on(stack)
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"
            info["log_tail"] = stack.log_tail()
            self.say(f"[tasks] the stack FAILED: {info['error']}")
            traceback.print_exc()
        finally:
            try:
                stack.stop()
            except Exception as exc:
                info["stop_error"] = f"{type(exc).__name__}: {exc}"
        info.update(stack.info)
        return info

    def shared_stack(self, scenario: Scenario, record: dict[str, Any]) -> dict[str, Any]:
        """The ``stack`` entry for cells measured on ``scenario``'s stack, which is down:
        its start and what it left running, from the scenario's ``record``."""
        info: dict[str, Any] = {"description": scenario.description, "shared_with": scenario.name}
        if self.measured_on is None:
            info["error"] = f"the {scenario.name} stack did not run: {record.get('error')}"
            info["log_tail"] = record.get("log_tail", "")
            return info
        info.update(self.measured_on)
        for key in ("start_s", "stop_error"):
            if key in record:
                info[key] = record[key]
        info["left_after_down"] = scenario.info.get("left_after_down")
        return info

    def finish(self, stack: dict[str, Any]) -> dict[str, Any]:
        """The peers, the ceilings again; the ``tasks`` entry of the results document."""
        embed = self.prepared_tasks.models.get("feature-extraction")
        for name in self.peers if embed is not None else ():
            assert embed is not None
            self.records["feature-extraction"]["served"][name] = _run_peer(
                name, embed, self.probes.get("feature-extraction"), self.options.profile,
                self.options, self.say, self.workdir / f"peer-{name}",
            )  # fmt: skip
        self.ceilings()
        return {
            "cell": {"concurrency": TASK_CONCURRENCY, "texts": TASK_TEXTS, "tokens": TASK_TOKENS},
            "stack": stack,
            "cases": self.records,
            "wall_s": round(time.monotonic() - self.started, 1),
        }


def run_tasks(
    prepared: PreparedModel,
    task_names: Sequence[str],
    peers: Sequence[str],
    options: BenchOptions,
    workdir: Path,
    say: Say,
    cache_dir: Path,
) -> dict[str, Any]:
    """The task part of a run on a stack of its own: the ``tasks`` entry of the results
    document."""
    run = TaskRun(prepared, task_names, peers, options, workdir, say, cache_dir)
    run.ceilings()
    return run.finish(run.on_own_stack())


def _run_peer(
    name: str,
    model: TaskModel,
    reference: list[list[float]] | None,
    profile: Profile,
    options: BenchOptions,
    say: Say,
    workdir: Path,
) -> dict[str, Any]:
    """Every setting a peer is tried with, one server each; the fastest is its figure.
    Each setting's answer to the probe is compared with infergate's (``reference``): the
    least cosine between their vectors of the same texts."""
    record: dict[str, Any] = {"settings": []}
    try:
        peer_settings = make_peer(name, model, workdir)
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        say(f"[{name}] cannot run: {exc}")
        return record
    for index, peer in enumerate(peer_settings):
        tried: dict[str, Any] = {
            "setting": peer.setting,
            "description": peer.description,
            "precision": peer.precision,
        }
        peer.workdir = workdir / f"setting-{index}"
        peer.workdir.mkdir(parents=True, exist_ok=True)
        try:
            say(f"[{name}] starting: {peer.description}")
            began = time.monotonic()
            peer.start()
            tried["start_s"] = round(time.monotonic() - began, 1)
            tried["cell"], vectors = measure_task(
                peer, peer.case, model.tokenizer_dir, profile, options, say, name
            )
            if reference is not None and vectors is not None:
                tried["cosine_to_infergate"] = least_cosine(reference, vectors)
        except Exception as exc:
            tried["error"] = f"{type(exc).__name__}: {exc}"
            tried["log_tail"] = peer.log_tail()
            say(f"[{name}] {peer.setting} FAILED: {exc}")
        finally:
            try:
                peer.stop()
            except Exception as exc:
                tried["stop_error"] = f"{type(exc).__name__}: {exc}"
        tried.update(peer.info)
        record["settings"].append(tried)
    measured = [s for s in record["settings"] if s.get("cell")]
    if measured:
        best = max(measured, key=lambda s: s["cell"]["sequences_per_s"])
        record["cell"], record["setting"] = best["cell"], best["setting"]
        record["cosine_to_infergate"] = best.get("cosine_to_infergate")
        record["precision"] = best["precision"]
    else:
        record["error"] = "; ".join(s.get("error", "?") for s in record["settings"])
    return record
