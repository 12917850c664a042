"""The payload log fed by a real inference path: a real tokenizer, a fake Triton, the
champion's answers and its canary's answers in shadow written as Parquet, and read back
by ``infergate payloads``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fakes import FakeTritonBackend
from infergate.cli import main
from infergate.config import PayloadSampling, PayloadSettings
from infergate.errors import InvalidInput
from infergate.observe.payload_files import PayloadWriter
from infergate.observe.payload_reader import PayloadFolder, shadow_agreement
from infergate.observe.payloads import PayloadLog
from infergate.serving.access import Caller, KeyEntry
from infergate.serving.inference import InferencePath
from infergate.serving.tokenization import TextTokenizer
from shadow_pair import LABELS, ask, minilm_tokenizer, positive, sentiment, settled, shadow_of

EVERY_CALL = PayloadSettings(
    enabled=True, texts="keep", sample=PayloadSampling(champion=1, canary=1, shadow=1)
)
TEAM = Caller(KeyEntry(id="team-a", sha256="0" * 64, models=("*",)))


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return minilm_tokenizer()


def served(tokenizer: TextTokenizer, folder: Path, *, labels=LABELS) -> InferencePath:
    payloads = PayloadLog(EVERY_CALL, PayloadWriter(str(folder), "replica-1", texts="keep"))
    model = sentiment(tokenizer, labels=labels)
    return InferencePath(FakeTritonBackend(outputs=positive), {"s": model}, payloads=payloads)


def read(capsys, folder: Path, *filters: str) -> list[dict]:
    assert main(["payloads", "read", "--url", str(folder), *filters]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_champion_and_shadow_answers_are_written_and_read_back(tokenizer, tmp_path, capsys):
    async def run() -> InferencePath:
        path = served(tokenizer, tmp_path)
        model = path.models["s"]
        with path.call(TEAM, "s") as call:
            await path.infer(call, model, ["good", "fine"], {})
        await ask(path, model, ["ok"], pinned="2")  # a client asked for the canary by name
        await settled(path.mirror)
        return path

    path = asyncio.run(run())
    assert path.payloads.flush() == 3  # in the replica, the log's thread does this

    champion, = read(capsys, tmp_path, "--role", "champion")  # fmt: skip
    assert (champion["model"], champion["version"], champion["status"]) == ("s", "1", 200)
    assert champion["inputs"] == ["good", "fine"] and champion["key_id"] == "team-a"
    assert [o["label"] for o in json.loads(champion["outputs"])] == ["positive"] * 2
    assert champion["latency_ms"] > 0

    shadow, = read(capsys, tmp_path, "--role", "shadow")  # fmt: skip
    assert (shadow["version"], shadow["champion_version"], shadow["key_id"]) == ("2", "1", "team-a")
    assert shadow["agreement"] == [1.0, 1.0] and shadow["inputs"] == ["good", "fine"]
    assert json.loads(shadow["champion_outputs"]) == json.loads(champion["outputs"])

    canary, = read(capsys, tmp_path, "--role", "canary")  # fmt: skip
    assert (canary["version"], canary["inputs"], canary["key_id"]) == ("2", ["ok"], "")


def test_the_agreement_recomputed_from_the_log_is_the_counters(tokenizer, tmp_path):
    async def run() -> InferencePath:
        path = served(tokenizer, tmp_path, labels=LABELS[::-1])  # a canary that disagrees
        for texts in (["good"], ["fine", "ok", "great"]):
            await ask(path, path.models["s"], texts)
        await settled(path.mirror)
        return path

    path = asyncio.run(run())
    path.payloads.flush()
    records = PayloadFolder(str(tmp_path)).records()
    recomputed = shadow_agreement(r for r in records if r["version"] == "2")
    assert recomputed.texts == shadow_of(path).texts == 4
    assert recomputed.share == pytest.approx(shadow_of(path).agreement) == 0.0


def test_a_body_that_failed_parsing_leaves_a_record_without_texts(tokenizer, tmp_path, capsys):
    path = served(tokenizer, tmp_path)
    with pytest.raises(InvalidInput), path.call(TEAM, "s"):
        raise InvalidInput("'inputs' is missing")  # as a protocol's parser raises it
    path.payloads.flush()
    record, = read(capsys, tmp_path)  # fmt: skip
    assert (record["model"], record["version"], record["role"]) == ("s", "", "")
    assert (record["status"], record["texts"], record["inputs"], record["outputs"]) == (
        422, None, None, None,
    )  # fmt: skip
    assert record["key_id"] == "team-a"
