"""Reading the payload log back: its files summarised, its records filtered, exported as
one Parquet or JSON Lines file, and a canary's shadow agreement recomputed from them.

The agreement counts as the replicas' shadow counters do (``infergate.serving.mirror``),
so the figure a rollout was judged on can be checked against the records: an answer
compared adds its per-text agreement, a failed one (5xx) its texts as disagreeing, and a
refusal (4xx, parameters the canary does not take) nothing. The log holds a sample of
the mirrored requests (``payloads.sample.shadow``), so the figure is an estimate of the
counters', not a copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infergate.observe.payload_files import SCHEMA, StoredFile, filesystem, stored_files
from infergate.observe.payloads import SHADOW


@dataclass(frozen=True)
class Filters:
    """Which records to read; None matches any. ``since_s``: seconds since the epoch."""

    model: str | None = None
    version: str | None = None
    role: str | None = None
    since_s: float | None = None

    def expression(self) -> pc.Expression | None:
        terms = [
            pc.field(name) == value
            for name, value in (
                ("model", self.model),
                ("version", self.version),
                ("role", self.role),
            )
            if value is not None
        ]
        if self.since_s is not None:
            since = pa.scalar(int(self.since_s * 1000), type=SCHEMA.field("time").type)
            terms.append(pc.field("time") >= since)
        if not terms:
            return None
        expression = terms[0]
        for term in terms[1:]:
            expression = expression & term
        return expression


@dataclass(frozen=True)
class FileSummary:
    """One file as ``infergate payloads list`` shows it."""

    name: str
    size: int
    records: int
    first: datetime | None
    last: datetime | None


class PayloadFolder:
    """The payload log at ``url`` (a local folder or a pyarrow filesystem URL)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.folder = filesystem(url)

    def files(self) -> list[StoredFile]:
        return stored_files(self.fs, self.folder)

    def summaries(self) -> list[FileSummary]:
        summaries = []
        for stored in self.files():
            times = self._read(stored, columns=["time"]).column("time")
            span = pc.min_max(times)
            summaries.append(
                FileSummary(
                    stored.name, stored.size, len(times), span["min"].as_py(), span["max"].as_py()
                )
            )
        return summaries

    def tables(self, filters: Filters = Filters()) -> Iterator[pa.Table]:
        """The matching records, a table per file, oldest file first."""
        expression = filters.expression()
        for stored in self.files():
            if filters.since_s is not None and stored.flushed_s < filters.since_s:
                continue  # flushed before `since`: all of its records are older
            table = self._read(stored)
            if expression is not None:
                table = table.filter(expression)
            if table.num_rows:
                yield table

    def records(self, filters: Filters = Filters()) -> Iterator[dict[str, Any]]:
        """The matching records as dicts, oldest file first."""
        for table in self.tables(filters):
            yield from table.to_pylist()

    def export(self, out: Path, filters: Filters = Filters(), *, jsonl: bool = False) -> int:
        """Write the matching records to ``out``, Parquet or JSON Lines; how many."""
        out.parent.mkdir(parents=True, exist_ok=True)
        if jsonl:
            count = 0
            with out.open("w", encoding="utf-8") as handle:
                for record in self.records(filters):
                    handle.write(json_line(record) + "\n")
                    count += 1
            return count
        tables = list(self.tables(filters))
        table = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
        pq.write_table(table, out)
        return table.num_rows

    def _read(self, stored: StoredFile, columns: list[str] | None = None) -> pa.Table:
        # Files written by an older infergate may lack a newer column: read them to SCHEMA.
        table = pq.read_table(stored.path, filesystem=self.fs, columns=columns)
        fields = [SCHEMA.field(name) for name in (columns or SCHEMA.names)]
        arrays = [
            table.column(f.name) if f.name in table.column_names else pa.nulls(len(table), f.type)
            for f in fields
        ]
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def json_line(record: Mapping[str, Any]) -> str:
    """One record as a JSON line, its time in ISO 8601."""
    return json.dumps(
        {k: v.isoformat() if isinstance(v, datetime) else v for k, v in record.items()},
        ensure_ascii=False,
    )


@dataclass(frozen=True)
class Agreement:
    """How far a canary in shadow agreed with its champion, from its shadow records."""

    records: int
    texts: int
    agreed: float  # texts' worth of agreement, each text 0 to 1

    @property
    def share(self) -> float | None:
        """The share of texts that agreed; None without a text judged."""
        return self.agreed / self.texts if self.texts else None


def shadow_agreement(records: Iterable[Mapping[str, Any]]) -> Agreement:
    """The agreement of the shadow records among ``records`` (filter them to one model
    and canary version first), counted as the shadow counters count."""
    count = texts = 0
    agreed = 0.0
    for record in records:
        if record["role"] != SHADOW:
            continue
        status = record["status"]
        if status == 200 and record["agreement"] is not None:
            count += 1
            texts += len(record["agreement"])
            agreed += sum(record["agreement"])
        elif status >= 500:
            count += 1
            texts += record["texts"] or 0
    return Agreement(count, texts, agreed)
