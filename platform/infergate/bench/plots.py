"""PNG plots of a benchmark run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: a headless backend, whatever the environment says
import matplotlib.pyplot as plt

from infergate.bench.analysis import WITHOUT_MODEL, best_ceiling_row

# The lean front-end in grey: a bound for infergate rather than a rival layout.
COLORS = {
    "infergate": "C0", "lean": "C7", "inprocess": "C2", "ensemble": "C1", "naive": "C3",
    "naive-int8": "C4",
}  # fmt: skip
VARIANT_COLORS = ("C4", "C5", "C6", "C8", "C9")  # "infergate (label)", in order


def _plotted(results: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(scenario, colour) for every scenario drawn, variants in colours of their own."""
    picked, variants = [], 0
    for name in results.get("scenarios", {}):
        if name in WITHOUT_MODEL:
            continue
        color = COLORS.get(name)
        if color is None and name.startswith("infergate ("):
            color = VARIANT_COLORS[variants % len(VARIANT_COLORS)]
            variants += 1
        picked.append((name, color))
    return picked


def _groups(results: dict[str, Any]) -> list[tuple[int, int]]:
    """(texts, tokens) pairs measured, each one panel."""
    found = {
        (row["texts"], row["tokens"])
        for record in results.get("scenarios", {}).values()
        for row in record.get("cells", [])
    }
    return sorted(found, key=lambda g: (g[1], g[0]))


def _series(results: dict[str, Any], scenario: str, texts: int, tokens: int) -> list[dict]:
    rows = results["scenarios"][scenario].get("cells", [])
    picked = [r for r in rows if r["texts"] == texts and r["tokens"] == tokens]
    return sorted(picked, key=lambda r: r["concurrency"])


def _panels(count: int) -> tuple[Any, list[Any]]:
    columns = min(count, 2) or 1
    rows = (count + columns - 1) // columns or 1
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4 * rows), squeeze=False)
    flat = list(axes.flat)
    for extra in flat[count:]:
        extra.set_visible(False)
    return figure, flat


def _by_concurrency(
    results: dict[str, Any],
    path: Path,
    draw: Callable[[Any, str, str | None, list[dict]], None],
    finish: Callable[[Any, int], None],
) -> Path:
    """One panel per (texts, tokens), concurrency on the x axis: ``draw`` plots one
    scenario's series on a panel, ``finish`` adds what the panel needs beyond that."""
    groups = _groups(results)
    figure, axes = _panels(len(groups))
    for axis, (texts, tokens) in zip(axes, groups, strict=False):
        for name, color in _plotted(results):
            series = _series(results, name, texts, tokens)
            if series:
                draw(axis, name, color, series)
        finish(axis, tokens)
        axis.set_xscale("log", base=2)
        axis.set_title(f"{texts} text(s) of ~{tokens} tokens per request")
        axis.set_xlabel("concurrency")
    return _save(figure, path)


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def throughput_plot(results: dict[str, Any], path: Path) -> Path:
    def draw(axis: Any, name: str, color: str | None, series: list[dict]) -> None:
        x = [r["concurrency"] for r in series]
        axis.plot(x, [r["sequences_per_s"] for r in series], marker="o", label=name, color=color)

    def finish(axis: Any, tokens: int) -> None:
        ceiling = best_ceiling_row(results, tokens)
        if ceiling:
            axis.axhline(
                ceiling["sequences_per_s"],
                color="k",
                linestyle="--",
                linewidth=1,
                label=f"ceiling (best: batch {ceiling['batch']})",
            )
        axis.set_ylabel("sequences / s")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")

    return _by_concurrency(results, path, draw, finish)


def latency_plot(results: dict[str, Any], path: Path) -> Path:
    def draw(axis: Any, name: str, color: str | None, series: list[dict]) -> None:
        x = [r["concurrency"] for r in series]
        axis.plot(x, [r["p50_ms"] for r in series], marker="o", color=color, label=f"{name} p50")
        axis.plot(x, [r["p99_ms"] for r in series], linestyle=":", marker="x", color=color,
                  label=f"{name} p99")  # fmt: skip

    def finish(axis: Any, tokens: int) -> None:
        axis.set_yscale("log")
        axis.set_ylabel("latency (ms)")
        axis.grid(True, alpha=0.3, which="both")
        axis.legend(fontsize="x-small", ncol=2)

    return _by_concurrency(results, path, draw, finish)


def memory_plot(results: dict[str, Any], path: Path) -> Path:
    memories = [("ceiling", (results.get("ceiling") or {}).get("memory") or {})]
    memories += [(n, r.get("memory") or {}) for n, r in results.get("scenarios", {}).items()]
    memories = [(n, m) for n, m in memories if m.get("total")]
    components = sorted({c for _, memory in memories for c in memory if c != "total"})
    palette = plt.get_cmap("tab20")
    colors = {c: palette(i % 20) for i, c in enumerate(components)}  # one colour per component
    figure, axis = plt.subplots(figsize=(10, 2.5 + 0.5 * max(len(memories), 1)))
    for row, (_, memory) in enumerate(memories):
        left = 0.0
        for component in components:
            mib = memory.get(component, {}).get("rss_mb", 0.0)
            if mib:
                axis.barh(row, mib, left=left, color=colors[component], edgecolor="white")
                left += mib
        axis.text(left, row, f" {left:,.0f} MiB", va="center", fontsize=8)
    for component in components:
        axis.barh(0, 0, color=colors[component], label=component)  # legend entries only
    axis.set_yticks(range(len(memories)), [n for n, _ in memories])
    axis.set_xlabel("resident memory, summed over the scenario's processes (MiB)")
    axis.invert_yaxis()
    axis.legend(fontsize="x-small", ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return _save(figure, path)


def write_plots(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """``throughput.png``, ``latency.png`` and ``memory.png`` in ``out_dir``."""
    return {
        "throughput": throughput_plot(results, out_dir / "throughput.png"),
        "latency": latency_plot(results, out_dir / "latency.png"),
        "memory": memory_plot(results, out_dir / "memory.png"),
    }
