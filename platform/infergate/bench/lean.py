"""A lean front-end, deployed into a running infergate stack: what its layout allows.

:class:`LeanFrontend` does only what no front-end in this layout can skip: it reads the
JSON body, tokenizes with the platform's tokenizer, sends the rows to the stack's Triton
through the platform's coalescing ``BatchingBackend`` and gRPC client (same settings), and
answers a label and a score per text. No input checks, routing table, metrics, drift
statistics, canary counters or timing headers: the difference between its figures and the
platform's, on the same stack, is what those cost; its own figures bound what any Ray Serve
front-end before this Triton reaches on this machine.

Run by the benchmark as ``python -m infergate.bench.lean`` with the stack's environment
(``INFERGATE_*`` settings): it joins the stack's Ray cluster, deploys the application on its
own route of the same ingress, and exits once it answers; ``infergate down`` removes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import orjson
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from infergate.config import FrontendSettings, load_config
from infergate.serve_app import replica_options
from infergate.serving.batching import BatchingBackend
from infergate.serving.gc_tuning import collect_young_objects_rarely
from infergate.serving.postprocess import softmax
from infergate.serving.tokenization import TextTokenizer, tokenize_serially
from infergate.triton.client import TritonBackend

APP_NAME = "lean"


@serve.deployment(name="lean", logging_config={"enable_access_log": False})
class LeanFrontend:
    """Body in, labels out: tokenize, one coalesced Triton call, softmax."""

    def __init__(self, settings: dict, tokenizer_dir: str, model: str, spec: dict) -> None:
        tokenize_serially()  # as the platform's replicas do
        collect_young_objects_rarely()
        frontend = FrontendSettings.model_validate(settings)
        self._tokenizer = TextTokenizer.from_dir(Path(tokenizer_dir), int(spec["max_length"]))
        self._backend = BatchingBackend.from_settings(  # the platform's replicas' coalescing
            TritonBackend(frontend.triton_grpc_url, frontend.triton_timeout_s), frontend
        )
        self._model = model
        self._output = spec["output_name"]
        self._labels = np.asarray(spec["labels"], dtype=object)

    async def __call__(self, request: Request) -> Response:
        texts = orjson.loads(await request.body())["inputs"]
        batch = self._tokenizer([texts] if isinstance(texts, str) else texts)
        logits = await self._backend.infer(
            self._model, batch.input_ids, batch.attention_mask, self._output
        )
        scores = softmax(logits)
        best = scores.argmax(axis=1)
        outputs = [
            {"label": label, "score": score}
            for label, score in zip(
                self._labels[best].tolist(),
                scores[np.arange(len(best)), best].tolist(),
                strict=True,
            )
        ]
        return Response(orjson.dumps({"outputs": outputs}), media_type="application/json")


def main(argv: list[str] | None = None) -> int:
    import ray

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ray-address", required=True, help="the stack's Ray (stack.json)")
    parser.add_argument("--served-dir", type=Path, required=True, help="tokenizer/, infergate.json")
    parser.add_argument("--model", required=True, help="the Triton model to call")
    parser.add_argument("--route", default="/lean")
    args = parser.parse_args(argv)

    spec = orjson.loads((args.served_dir / "infergate.json").read_bytes())
    config = load_config()
    # The platform's replica options (scaling, CPUs, queue), so that only the work differs.
    app = LeanFrontend.options(**replica_options(config.serve)).bind(  # type: ignore[attr-defined]  # added by the Ray decorator
        config.frontend_settings().model_dump(mode="json"),
        str(args.served_dir.resolve() / "tokenizer"),
        args.model,
        spec,
    )
    ray.init(address=args.ray_address, namespace="serve", log_to_driver=False)
    try:
        serve.run(app, name=APP_NAME, route_prefix=args.route, blocking=False)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
