"""The model in the worker's own process, behind the serving path's ``Backend``.

The front-end's :class:`~infergate.serving.runtime.ModelRuntime` calls ``infer`` as it
calls Triton; here the call runs the session or engine the Triton models run
(``infergate.triton.backend_model.make_session`` and ``run``; ``translator_model.Engine``),
on the version's own files from the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from infergate.errors import InfergateError
from infergate.serving.loader import load_version
from infergate.serving.runtime import ModelRuntime
from infergate.tasks import CTRANSLATE2
from infergate.tasks.translation import DECODING_INPUT
from infergate.versions import CT2_DIR, ONNX_FILE, ServedVersion, version_cache

if TYPE_CHECKING:
    from infergate.registry import Registry


class OnnxBackend:
    """ONNX Runtime on the version's ``model.onnx``, with the Triton model's options."""

    def __init__(self, onnx_path: Path, output_name: str, *, threads: int, gpu: bool) -> None:
        from infergate.triton import backend_model

        self._model = backend_model
        providers = backend_model.providers(gpu)
        self._session = backend_model.make_session(onnx_path, threads, providers, output_name)
        self._rows_alone = backend_model.rows_alone(self._session)

    async def infer(
        self,
        model: str,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        output_name: str,
        *,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        return self._model.run(
            self._session, output_name, input_ids, attention_mask, rows_alone=self._rows_alone
        )


class TranslatorBackend:
    """CTranslate2 on the version's converted model, as Triton's translation model."""

    def __init__(self, model_dir: Path, *, precision: str, max_decoding_length: int,
                 threads: int, gpu: bool) -> None:  # fmt: skip
        from infergate.triton import translator_model

        self._padded = translator_model.padded
        self._engine = translator_model.Engine(
            model_dir,
            precision=precision or "int8",
            gpu=gpu,
            threads=threads,
            max_decoding_length=max_decoding_length or None,
        )

    async def infer(
        self,
        model: str,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        output_name: str,
        *,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        decoding = (extra or {})[DECODING_INPUT]
        try:
            rows = self._engine.rows(input_ids, attention_mask, decoding)
        except ValueError as exc:
            raise InfergateError(str(exc)) from None
        outputs, failed = self._engine.translate(rows)
        if failed:
            raise InfergateError(next(iter(failed.values())))
        return self._padded(outputs)


def load(served: ServedVersion, registry: Registry, cache_dir: Path, *, threads: int,
         gpu: bool) -> tuple[ModelRuntime, Any]:  # fmt: skip
    """The version's runtime (spec, tokenizer) and a backend running its model file."""
    runtime = load_version(served, registry, cache_dir)
    cache = version_cache(cache_dir, served)
    spec = runtime.spec
    if runtime.task.engine == CTRANSLATE2:
        model_dir = registry.download(served.source, CT2_DIR, cache)
        backend: Any = TranslatorBackend(
            model_dir, precision=spec.precision, max_decoding_length=spec.max_decoding_length,
            threads=threads, gpu=gpu,
        )  # fmt: skip
    else:
        onnx_path = registry.download(served.source, ONNX_FILE, cache)
        backend = OnnxBackend(onnx_path, spec.output_name, threads=threads, gpu=gpu)
    return runtime, backend
