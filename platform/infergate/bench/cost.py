"""What a request costs in CPU, by part of the stack, and the front-end cores one GPU needs.

On a GPU the model's time shrinks to microseconds per sequence, and the CPU the front-end
spends per request becomes the platform's cost. Each measured cell's CPU (read from
``/proc`` per component, :mod:`infergate.bench.procfs`) is turned here into milliseconds per
request and microseconds per sequence for each part of the stack, and the front-end's
share into the cores that would keep a GPU of a stated throughput busy:

    cores = front-end CPU seconds per sequence x the GPU's sequences per second

The default throughput is what an NVIDIA H200 did with an all-MiniLM-L6-v2-shaped encoder
in fp16 at 16 tokens and batch 1024 (PyTorch eager, measured for issue 37): 253,000
sequences a second. Pure: a results document in, rows out.
"""

from __future__ import annotations

from typing import Any

from infergate.bench.tables import num, table

H200_FP16_16_TOKENS_SEQUENCES_PER_S = 253_000.0

# The parts of a stack, each the procfs components it is made of.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ingress", ("haproxy ingress", "serve proxy")),
    ("replica", ("serve replica",)),
    ("triton", ("tritonserver", "triton python stub")),
    ("control plane", ("supervisor", "mlflow", "prometheus")),
    ("ray", ("serve controller", "ray agents and actors", "ray system")),
)
# What scales with requests in front of the model server: the cores a GPU needs beside it.
FRONT_END = ("ingress", "replica")


def part_of(component: str) -> str:
    """The part of the stack a procfs component belongs to; ``server`` for the rest (a
    baseline's uvicorn workers, the ensemble's tokenizer: the whole server)."""
    for part, components in PARTS:
        if component in components:
            return part
    return "server"


def cell_cost(
    row: dict[str, Any], gpu_sequences_per_s: float = H200_FP16_16_TOKENS_SEQUENCES_PER_S
) -> dict[str, Any] | None:
    """One cell's CPU per request and per sequence by part, and the front-end cores per
    GPU (None for a server with no separate front-end); None when the cell answered
    nothing. ``server_cpu_percent`` is percent of one core over the cell."""
    if gpu_sequences_per_s <= 0:
        raise ValueError(f"gpu_sequences_per_s is {gpu_sequences_per_s}; expected > 0")
    rps = row.get("requests_per_s") or 0.0
    texts = row.get("texts") or 0
    if rps <= 0 or texts <= 0:
        return None
    seconds_per_request: dict[str, float] = {}
    for component, percent in row.get("server_cpu_percent", {}).items():
        if component == "total":
            continue
        part = part_of(component)
        seconds = percent / 100.0 / rps  # a core's share over requests per second
        seconds_per_request[part] = seconds_per_request.get(part, 0.0) + seconds
    total = sum(seconds_per_request.values())
    front_end = [seconds_per_request[p] for p in FRONT_END if p in seconds_per_request]
    front_end_s = sum(front_end) / texts if front_end else None
    replica_s = seconds_per_request.get("replica")
    return {
        "cell": row["cell"],
        "texts": texts,
        "requests_per_s": rps,
        "ms_per_request": {p: round(s * 1e3, 4) for p, s in seconds_per_request.items()},
        "us_per_sequence": {p: round(s * 1e6 / texts, 2) for p, s in seconds_per_request.items()},
        "total_ms_per_request": round(total * 1e3, 4),
        "front_end_us_per_sequence": round(front_end_s * 1e6, 2) if front_end_s else None,
        "gpu_sequences_per_s": gpu_sequences_per_s,
        # The replica alone (the tokenizing front-end), then with the ingress before it.
        "replica_cores_per_gpu": (
            round(replica_s / texts * gpu_sequences_per_s, 1) if replica_s else None
        ),
        "front_end_cores_per_gpu": (
            round(front_end_s * gpu_sequences_per_s, 1) if front_end_s else None
        ),
    }


def cost_rows(
    results: dict[str, Any],
    gpu_sequences_per_s: float = H200_FP16_16_TOKENS_SEQUENCES_PER_S,
    concurrency: int = 32,
) -> list[dict[str, Any]]:
    """:func:`cell_cost` of every scenario's cells at ``concurrency``, with the scenario's
    name (the cells that answered nothing left out)."""
    rows = []
    for name, record in results.get("scenarios", {}).items():
        for row in record.get("cells", []):
            if row.get("concurrency") != concurrency:
                continue
            cost = cell_cost(row, gpu_sequences_per_s)
            if cost is not None:
                rows.append({"scenario": name, **cost})
    return rows


def gpu_rate(results: dict[str, Any]) -> float:
    """The GPU throughput a run was asked to price against (older runs: the default)."""
    return float(
        results.get("meta", {}).get("gpu_sequences_per_s") or H200_FP16_16_TOKENS_SEQUENCES_PER_S
    )


def cost_section(results: dict[str, Any]) -> list[str]:
    """CPU per request and per sequence by part of the stack, and the front-end cores a GPU
    needs (:mod:`infergate.bench.cost`)."""
    gpu = gpu_rate(results)
    rows = cost_rows(results, gpu)
    if not rows:
        return []
    parts = [part for part, _ in PARTS] + ["server"]
    shown = [p for p in parts if any(p in r["ms_per_request"] for r in rows)]
    out = ["", "## What a request costs (c=32 cells, CPU from /proc)", ""]
    out += table(
        ["scenario", "cell", "req/s", *(f"{p} ms/req" for p in shown), "total ms/req",
         "replica us/seq", "front-end us/seq", "replica cores/GPU", "front-end cores/GPU"],
        (
            [
                r["scenario"], r["cell"], num(r["requests_per_s"], 1),
                *(num(r["ms_per_request"].get(p), 3) for p in shown),
                num(r["total_ms_per_request"], 3),
                num(r["us_per_sequence"].get("replica"), 1),
                num(r["front_end_us_per_sequence"], 1),
                num(r["replica_cores_per_gpu"], 0),
                num(r["front_end_cores_per_gpu"], 0),
            ]
            for r in rows
        ),
    )  # fmt: skip
    out += [
        "",
        "CPU milliseconds per request, all cores together, by part: the ingress (HAProxy, "
        "Serve's proxy), the Serve replicas, Triton (server and model stubs), the control "
        "plane (`infergate up`'s supervisor, MLflow, Prometheus) and Ray's own processes "
        "(Serve's controller, agents, GCS, raylet); 'server' is a whole server that is none "
        f"of these (a baseline). Cores per GPU: front-end CPU per sequence times {gpu:,.0f} "
        "sequences/s (`--gpu-sequences-per-s`; default an H200 running the model in fp16 at "
        "16 tokens): the replica alone, and with the ingress (front-end). The stand-in "
        "scenario is the same stack before a model that costs Triton next to nothing, the "
        "front-end flat out as before a GPU: its cores per GPU are the ones that price one. "
        "The lean scenario's "
        "replica figure also carries the idle platform replica beside it; the in-process "
        "scenario's replica runs the model too. A figure holds at its cell's rate only: "
        "the same replica code spends more CPU per request at fewer requests a second (its "
        "idle CPU over fewer requests, fewer requests per Triton call and per wake-up; "
        "with 16 texts 143-170 us per sequence at 40 req/s against 56-66 flat out, "
        "docs/benchmarks.md).",
    ]
    return out
