"""``infergate register``: optimise a Hugging Face model and store it as a registry version.

Steps: export to ONNX, ONNX Runtime fusions, quantisation at the fastest setting whose
quality on the reference texts meets the budget, parity against PyTorch
(``infergate.registration.onnx_export``), reference statistics on reference texts run through the
very tokenizer and graph that will be served, then one MLflow run holding every file
(the quality report among them) and one new model version pointing at it. A model given
as an ONNX file takes ``infergate.registration.onnx_folder`` instead of the export, and is measured
against that file.

That is the ONNX engine's build; a task's engine (``tasks.Task.engine``) picks the build
(``ENGINES``: translation's converts with CTranslate2), and every engine's version is
stored the same way (``_store``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from infergate import tasks
from infergate.config import TritonSettings
from infergate.errors import ModelNotFound, RegistrationError
from infergate.observe.reference import reference_stats
from infergate.registration.prompts import prompt_spec
from infergate.registration.quality import Budget, QualityReport
from infergate.registration.reference_texts import (
    DEFAULT_REFERENCE_TEXTS,
    read_inputs,
    reference_queries,
    run_reference,
)
from infergate.registry import Registry
from infergate.serving.tokenization import TextTokenizer
from infergate.tasks import Figures
from infergate.triton.repository import build_config, build_translation_config, render_config
from infergate.versions import (
    PARITY_FILE,
    QUALITY_FILE,
    REFERENCE_FILE,
    SPEC_FILE,
    triton_model_name,
)

ENGINE_NAMES = {tasks.ONNX: "ONNX", tasks.CTRANSLATE2: "CTranslate2"}


@dataclass(frozen=True)
class Registered:
    name: str
    version: str
    task: str
    precision: str
    parity_check: str  # the gated figure against its tolerance (ParityReport.check)
    onnx_bytes: int
    quality: str = ""  # the setting kept and its figures (QualityReport.summary)


def resolve_source(src: str, work: Path) -> Path:
    """A local folder as it is; an MLflow artifact URI (``runs:/``, ``models:/``...) fetched."""
    if ":/" not in src:
        return Path(src).expanduser()
    import mlflow

    try:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=src, dst_path=str(work)))
    except Exception as exc:
        raise RegistrationError(f"could not download {src}: {exc}") from None


def register_model(
    src: str,
    *,
    name: str,
    task: str,
    registry: Registry,
    precision: str = "int8",
    max_length: int | None = None,
    reference_texts: Path | None = None,
    alias: str | None = None,
    quality_budget: str = "default",
    triton: TritonSettings | None = None,
    progress: bool = True,
    onnx_file: str | None = None,
    prompts: dict[str, str] | None = None,
    default_prompt: str | None = None,
) -> Registered:
    """Register ``src`` as a new version of ``name``; ``quality_budget`` is
    ``infergate.registration.quality.Budget.parse``'s text (``default``, ``none`` or
    ``NAME=VALUE,...``).

    ``src`` is a Hugging Face folder, built by the engine of ``task``
    (``tasks.Task.engine``): exported from PyTorch to ONNX, or, with ``onnx_file`` (or
    when the folder has an ONNX file and no PyTorch weights), the folder of the tokenizer
    and config beside a graph registered as it is (``infergate.registration.onnx_folder``);
    a translation model is converted by CTranslate2 (``infergate.registration.ct2_export``).
    ``prompts`` (name -> text) and ``default_prompt`` are the version's named prompts,
    over those of the folder's sentence-transformers config (``registration.prompts``)."""
    if task not in tasks.TASKS:
        raise RegistrationError(
            f"task {task!r} is not supported; choose one of {list(tasks.TASKS)}"
        )
    if not name or name != name.strip() or "/" in name:
        raise RegistrationError(f"model name {name!r} is not valid; use letters, digits, - or _")
    if alias == "":
        raise RegistrationError("--alias needs a name, such as champion")
    served = tasks.get(task)
    try:
        budget = Budget.parse(quality_budget, served.output_name)
    except ValueError as exc:
        raise RegistrationError(str(exc)) from None
    _check_task(registry, name, task)
    texts, queries = read_inputs(reference_texts or DEFAULT_REFERENCE_TEXTS)
    if onnx_file is not None and served.engine != tasks.ONNX:
        raise RegistrationError(
            f"a {task} model is registered from its Hugging Face folder, which "
            f"{ENGINE_NAMES[served.engine]} converts; --onnx does not apply"
        )
    asked = Registration(
        src, name, task, precision, max_length, texts, queries, budget, onnx_file,
        triton or TritonSettings(), progress,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="infergate-register-") as tmp:
        work = Path(tmp)
        source = resolve_source(src, work / "source")
        named = prompt_spec(task, source, prompts, default_prompt)  # refused before the build
        # The reference texts as served: with the default prompt, if there is one, before
        # each (the quality measures and the drift baseline see what requests will).
        default = named.get("prompts", {}).get(named.get("default_prompt_name"), "")
        asked = replace(asked, texts=[default + text for text in asked.texts])
        built = ENGINES[served.engine](asked, source, work / "model")
        return _store(registry, asked, replace(built, spec={**built.spec, **named}), alias)


@dataclass(frozen=True)
class Registration:
    """What a registration asks for, checked; each engine reads what it needs."""

    src: str
    name: str
    task: str
    precision: str
    max_length: int | None
    texts: list[str]  # the reference texts
    queries: list[str] | None  # their queries, where the file has them (text-ranking)
    budget: Budget
    onnx_file: str | None
    triton: TritonSettings
    progress: bool


class Parity(Protocol):
    """An engine's parity report (``parity.ParityReport``, ``ct2_export.TranslationParity``)."""

    @property
    def check(self) -> str: ...  # the gated figure against its threshold
    @property
    def passed(self) -> bool: ...
    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Built:
    """A version an engine built in ``folder`` (its model and tokenizer), with what every
    version records beside them; ``spec``, ``metrics``, ``params`` and ``tags`` hold the
    engine's own entries, which ``_store`` adds to those every version has."""

    folder: Path
    labels: list[str]
    output_name: str
    output_dim: int
    max_length: int
    precision: str
    model_type: str
    model_bytes: int
    reference: dict[str, Any]  # the reference statistics (observe.reference)
    parity: Parity
    triton_config: str  # config.pbtxt
    quality: QualityReport | None = None  # the setting kept, where an engine chooses one
    spec: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def _store(registry: Registry, asked: Registration, built: Built, alias: str | None) -> Registered:
    """Write the files every version has beside the engine's, and register them."""
    out, parity, quality = built.folder, built.parity, built.quality
    spec = {
        "format": 1,
        "task": asked.task,
        "labels": built.labels,
        "output_name": built.output_name,
        "output_dim": built.output_dim,
        "max_length": built.max_length,
        "precision": built.precision,
        "model_type": built.model_type,
        "source": asked.src,
        **built.spec,
    }
    (out / SPEC_FILE).write_text(json.dumps(spec, indent=2))
    (out / REFERENCE_FILE).write_text(json.dumps(built.reference, indent=2))
    (out / PARITY_FILE).write_text(json.dumps(parity.to_dict(), indent=2))
    if quality is not None:
        (out / QUALITY_FILE).write_text(json.dumps(quality.to_dict(), indent=2))
    (out / "triton").mkdir(exist_ok=True)
    (out / "triton" / "config.pbtxt").write_text(built.triton_config)
    version = registry.register(
        asked.name,
        asked.task,
        out,
        metrics={
            **built.metrics,
            "reference_texts": float(len(asked.texts)),
            "unknown_token_ratio_reference": built.reference["unknown_token_ratio_mean"],
        },
        params={
            "task": asked.task,
            "precision": built.precision,
            "max_length": str(built.max_length),
            "model_type": built.model_type,
            "source": asked.src,
            **built.params,
        },
        tags={
            "infergate.precision": built.precision,
            "infergate.parity_check": parity.check,
            "infergate.parity_passed": str(parity.passed).lower(),
            **built.tags,
        },
        alias=alias,
    )
    return Registered(
        asked.name,
        version,
        asked.task,
        built.precision,
        parity.check,
        built.model_bytes,
        quality.summary() if quality is not None else "",
    )


# -- the engines (tasks.Task.engine) -----------------------------------------------------


def _onnx(asked: Registration, source: Path, out: Path) -> Built:
    """An ONNX graph: exported and optimised (``infergate.registration.onnx_export``), or
    the folder's own (``infergate.registration.onnx_folder``), at the fastest setting
    that meets the quality budget, parity-checked, and its reference statistics run
    through the very tokenizer and graph that will be served."""
    from infergate.registration import onnx_export, onnx_folder

    task, texts, progress = asked.task, asked.texts, asked.progress
    served = tasks.get(task)
    queries = reference_queries(texts, asked.queries) if served.pairs else None
    samples: list[onnx_export.Sample] = list(texts)
    if queries is not None:
        samples = list(zip(queries, texts, strict=True))
    graph = onnx_folder.onnx_file_of(source, asked.onnx_file)
    if graph is not None:
        built = onnx_folder.build(
            source, graph, task, asked.precision, out, max_length_tokens=asked.max_length,
            quality_texts=samples, budget=asked.budget, progress=progress,
        )  # fmt: skip
    else:
        built = onnx_export.build(
            source, task, asked.precision, out, max_length=asked.max_length,
            quality_texts=samples, budget=asked.budget, progress=progress,
        )  # fmt: skip
    source_format = "pytorch" if graph is None else "onnx"
    tokenizer = TextTokenizer.from_dir(built.tokenizer_dir, built.max_length)
    stats = run_reference(
        built.onnx_path, tokenizer, task, built.output_name, built.labels, texts, progress,
        queries,
    )  # fmt: skip
    config = build_config(
        triton_model_name(asked.name, "1"),
        output_name=built.output_name,
        output_dim=built.output_dim,
        settings=asked.triton,
    )
    parity, quality = built.parity, built.quality
    return Built(
        folder=out, labels=built.labels, output_name=built.output_name,
        output_dim=built.output_dim, max_length=built.max_length, precision=built.precision,
        model_type=built.model_type, model_bytes=built.onnx_path.stat().st_size,
        reference=stats, parity=parity, triton_config=render_config(config), quality=quality,
        spec={"source_format": source_format},
        metrics={
            "parity_max_abs_diff": parity.max_abs_diff,
            "parity_tolerance": parity.tolerance,
            **{f"parity_{k}": v for k, v in parity.extra.items()},
            **{f"quality_{k}": v for k, v in quality.figures.items()},
        },
        params={
            "quantisation": quality.setting,
            "quality_budget": quality.budget,
            "source_format": source_format,
            **({"onnx_file": str(graph)} if graph is not None else {}),
        },
        tags={
            "infergate.quantisation": quality.setting,
            "infergate.parity_max_abs_diff": f"{parity.max_abs_diff:.6g}",
        },
    )  # fmt: skip


def _ctranslate2(asked: Registration, source: Path, out: Path) -> Built:
    """A sequence-to-sequence model converted by CTranslate2 and parity-checked against
    transformers' ``generate`` (``infergate.registration.ct2_export``); its reference
    statistics follow the output lengths of the reference texts."""
    from infergate.registration import ct2_export

    texts = asked.texts
    built = ct2_export.build(
        source, asked.precision, out, texts=texts, max_length=asked.max_length,
        progress=asked.progress,
    )  # fmt: skip
    if asked.progress:
        print("reference statistics: translating the reference texts", file=sys.stderr)
    lengths, unknown, generated = ct2_export.reference_run(built, texts)
    figures = Figures(generated.astype(np.float64))
    stats = reference_stats(asked.task, lengths, unknown, np.zeros((0, 0)), [], figures=figures)
    config = build_translation_config(
        triton_model_name(asked.name, "1"), precision=built.precision,
        max_decoding_length=built.max_decoding_length, settings=asked.triton,
    )  # fmt: skip
    parity = built.parity
    return Built(
        folder=out, labels=[], output_name=tasks.get(asked.task).output_name,
        output_dim=1,  # a row of ids of any length: unused
        max_length=built.max_length, precision=built.precision, model_type=built.model_type,
        model_bytes=built.model_bytes, reference=stats, parity=parity,
        triton_config=render_config(config),
        spec={"max_decoding_length": built.max_decoding_length},
        metrics={
            "parity_exact_match": parity.exact_match,
            "parity_chrf": parity.chrf,
            "parity_min_chrf": parity.min_chrf,
            "parity_texts": float(parity.n_samples),
            "reference_output_tokens_mean": float(generated.mean()),
        },
        params={"engine": tasks.CTRANSLATE2, "compute_type_cpu": parity.compute_type},
    )  # fmt: skip


# Each engine's build (tasks.Task.engine): adding an engine is its function and its line.
ENGINES: dict[str, Callable[[Registration, Path, Path], Built]] = {
    tasks.ONNX: _onnx,
    tasks.CTRANSLATE2: _ctranslate2,
}


def _check_task(registry: Registry, name: str, task: str) -> None:
    """A model keeps its task: its clients read one kind of output."""
    try:
        served = registry.model(name).task
    except ModelNotFound:
        return  # a new model
    if served != task:
        raise RegistrationError(
            f"model {name!r} is a {served} model; register this {task} model under another name"
        )


def describe(registered: Registered) -> str:
    r = asdict(registered)
    engine = ENGINE_NAMES[tasks.get(r["task"]).engine]
    line = (
        f"registered {r['name']} version {r['version']} ({r['task']}, {r['precision']}, "
        f"{_size(r['onnx_bytes'])} {engine}, parity {r['parity_check']})"
    )
    return f"{line}\nquality {r['quality']}" if r["quality"] else line


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
