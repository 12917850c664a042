"""What each precision setting of ``infergate.registration.quantise`` keeps and costs, side by side.

``python -m infergate.bench.settings FOLDER --task feature-extraction`` builds the folder at
fp32 once, converts that graph to every int8 setting, and for each measures the quality
figures registration uses (``infergate.registration.quality``, against the fp32 graph, which equals
PyTorch within parity's 1e-3) on the reference texts, and its throughput: batches of 32
reference texts, pre-tokenized, on one ONNX Runtime session with one thread, the
settings taking turns for ``--rounds`` rounds so that a slow phase of the machine falls on
all of them; each keeps its best round. Throughput is reported as a ratio to the best of
``int8-dynamic`` in the same run. Prints a markdown table and writes it with the raw
figures (JSON) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from infergate.bench.ceiling import make_session
from infergate.config import PROJECT_ROOT
from infergate.registration.quality import measure
from infergate.registration.quantise import SETTINGS, convert
from infergate.registration.reference_texts import DEFAULT_REFERENCE_TEXTS, read_texts
from infergate.serving.tokenization import TextTokenizer

BATCH = 32
BASELINE = "int8-dynamic"


def compare_settings(
    folder: Path, task: str, texts: list[str], *, rounds: int, round_s: float, work: Path
) -> dict[str, Any]:
    """Quality and throughput of each int8 setting (and fp32) of ``folder``'s graph."""
    from infergate.registration import onnx_export

    built = onnx_export.build(folder, task, "fp32", work / "fp32", progress=False)
    shutil.copyfile(built.onnx_path, work / "optimised.onnx")
    tokenizer = TextTokenizer.from_dir(built.tokenizer_dir, built.max_length)
    batches = [tokenizer(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)]
    sessions = {
        setting: make_session(convert(None, work, setting), 1, spinning=False)
        for setting in SETTINGS["int8"]
    }

    def outputs(session: Any) -> np.ndarray:
        rows = []
        for batch in batches:
            feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
            raw = session.run([built.output_name], feeds)[0]
            rows.append(raw[batch.attention_mask.astype(bool)] if raw.ndim == 3 else raw)
        return np.concatenate(rows)

    original = outputs(sessions["fp32"])
    quality = {s: measure(built.output_name, original, outputs(x)) for s, x in sessions.items()}
    full = [b for b in batches if len(b.input_ids) == BATCH] or batches
    speed: dict[str, list[float]] = {setting: [] for setting in sessions}
    for _ in range(rounds):
        for setting, session in sessions.items():
            speed[setting].append(_sequences_per_s(session, built.output_name, full, round_s))
    best = {setting: max(figures) for setting, figures in speed.items()}
    return {
        "model": str(folder),
        "task": task,
        "texts": len(texts),
        "rounds": rounds,
        "round_s": round_s,
        "quality": quality,
        "sequences_per_s": speed,
        "ratio": {setting: best[setting] / best[BASELINE] for setting in best},
    }


def _sequences_per_s(session: Any, output: str, batches: list[Any], seconds: float) -> float:
    session.run([output], _feeds(batches[0]))  # warm
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = batches[done % len(batches)]
        session.run([output], _feeds(batch))
        done += 1
    elapsed = time.perf_counter() - start
    return sum(len(batches[i % len(batches)].input_ids) for i in range(done)) / elapsed


def _feeds(batch: Any) -> dict[str, np.ndarray]:
    return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}


def markdown(results: dict[str, Any]) -> str:
    """One row per setting: its quality figures, best throughput and ratio."""
    names = sorted({name for figures in results["quality"].values() for name in figures})
    lines = [
        f"{results['model']} ({results['task']}), {results['texts']} texts, batches of "
        f"{BATCH}, one thread, best of {results['rounds']} rounds of {results['round_s']:g} s",
        "",
        "| setting | " + " | ".join(names) + " | sequences/s | ratio to int8-dynamic |",
        "|---" * (len(names) + 3) + "|",
    ]
    for setting, figures in results["quality"].items():
        cells = [f"{figures[name]:.4f}" if name in figures else "-" for name in names]
        best = max(results["sequences_per_s"][setting])
        ratio = results["ratio"][setting]
        lines.append(f"| {setting} | " + " | ".join(cells) + f" | {best:.0f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infergate.bench.settings")
    parser.add_argument("folder", type=Path, help="a Hugging Face model folder")
    parser.add_argument("--task", default="feature-extraction")
    parser.add_argument("--texts", type=Path, default=DEFAULT_REFERENCE_TEXTS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-s", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench-results" / "settings")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="infergate-settings-") as tmp:
        results = compare_settings(
            args.folder, args.task, read_texts(args.texts), rounds=args.rounds,
            round_s=args.round_s, work=Path(tmp),
        )  # fmt: skip
    table = markdown(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "settings.json").write_text(json.dumps(results, indent=2))
    (args.out / "settings.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
