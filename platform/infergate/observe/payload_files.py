"""The payload log's files: a folder (local, or any URL pyarrow's filesystems take) of
Parquet files, one per flush of one replica.

A file's name starts with the UTC time of its flush, later than every record in it, then
the replica's name and a sequence number: names sort by time across replicas, no two
replicas ever write the same file, and a reader asking for records since some time skips
the files older than that without opening them. The folder's size is bounded for all
replicas together: after each write the writer deletes the oldest files past the bound
(two replicas deleting the same file is harmless).

Reading and exporting are in ``infergate.observe.payload_reader``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from infergate.observe.payloads import Payload

log = logging.getLogger(__name__)
PREFIX = "payloads-"
SUFFIX = ".parquet"
STAMP = "%Y%m%dT%H%M%S"  # then milliseconds and Z: fixed width, so names sort by time
HASH_PREFIX = "sha256:"
MB = 1024 * 1024

SCHEMA = pa.schema(
    [
        pa.field("time", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("version", pa.string(), nullable=False),  # "" when none was picked
        pa.field("role", pa.string(), nullable=False),  # champion, canary, shadow or ""
        pa.field("texts", pa.int32()),  # how many the request had; null: its body unread
        pa.field("inputs", pa.list_(pa.string())),  # the texts, their hashes, or null
        pa.field("outputs", pa.string()),  # the answers as JSON text; null without one
        pa.field("latency_ms", pa.float64(), nullable=False),
        pa.field("status", pa.int32(), nullable=False),
        pa.field("key_id", pa.string(), nullable=False),  # the API key's id, never the key
        pa.field("agreement", pa.list_(pa.float64())),  # shadow: per text judged
        pa.field("champion_version", pa.string()),  # shadow: compared with this version
        pa.field("champion_outputs", pa.string()),  # ... and its answers as JSON text
    ]
)


def filesystem(url: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a local folder or a URL (``s3://bucket/prefix``)."""
    if "://" not in url:
        url = str(Path(url).expanduser().resolve())
    return pafs.FileSystem.from_uri(url)


@dataclass(frozen=True)
class StoredFile:
    """One file of the folder as listed: its full path on the filesystem and size."""

    path: str
    size: int

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def flushed_s(self) -> float:
        """When it was written (its name says), in seconds since the epoch."""
        stamp = self.name[len(PREFIX) : len(PREFIX) + 19]  # 20260101T120000.123
        return datetime.strptime(stamp, STAMP + ".%f").replace(tzinfo=timezone.utc).timestamp()


def stored_files(fs: pafs.FileSystem, folder: str) -> list[StoredFile]:
    """The folder's payload files, oldest first; none if the folder is absent."""
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    files = [
        StoredFile(info.path, info.size or 0)
        for info in infos
        if info.type == pafs.FileType.File
        and info.base_name.startswith(PREFIX)
        and info.base_name.endswith(SUFFIX)
    ]
    return sorted(files, key=lambda stored: stored.name)


def file_name(flushed_s: float, replica: str, sequence: int) -> str:
    moment = datetime.fromtimestamp(flushed_s, tz=timezone.utc)
    stamp = f"{moment.strftime(STAMP)}.{moment.microsecond // 1000:03d}Z"
    return f"{PREFIX}{stamp}-{replica}-{sequence:06d}{SUFFIX}"


class PayloadWriter:
    """Writes batches of one replica's records to ``url``, a new file per batch, and keeps
    the folder under ``max_total_mb``. Runs in the payload log's thread."""

    def __init__(
        self,
        url: str,
        replica: str,
        *,
        texts: str = "hash",
        max_total_mb: float = 1024.0,
        clock: Any = time.time,
    ) -> None:
        self.url = url
        self.replica = replica
        self.texts = texts
        self.max_bytes = int(max_total_mb * MB)
        self._clock = clock
        self._sequence = itertools.count(1)
        self._where: tuple[pafs.FileSystem, str] | None = None

    @property
    def fs(self) -> pafs.FileSystem:
        return self._resolved()[0]

    @property
    def folder(self) -> str:
        return self._resolved()[1]

    def _resolved(self) -> tuple[pafs.FileSystem, str]:
        # On first use, in the log's thread: an object store's filesystem may ask the
        # network (an S3 bucket's region) as it is made.
        if self._where is None:
            fs, folder = self._where = filesystem(self.url)
            # Object stores have no folders, but some filesystems do (an HDFS, pyarrow's
            # in-memory one); a store that refuses to make one still takes the files.
            with contextlib.suppress(OSError):
                fs.create_dir(folder, recursive=True)
        return self._where

    def __call__(self, batch: list[Payload]) -> None:
        table = to_table(batch, self.texts)
        name = file_name(self._clock(), self.replica, next(self._sequence))
        path = f"{self.folder}/{name}"
        if isinstance(self.fs, pafs.LocalFileSystem):
            # Readers list the folder at any time: they must never find half a file. An
            # object store shows an object only once it is whole.
            self.fs.create_dir(self.folder, recursive=True)  # again, if someone removed it
            partial = f"{self.folder}/.{name}.partial"
            pq.write_table(table, partial, filesystem=self.fs)
            self.fs.move(partial, path)
        else:
            pq.write_table(table, path, filesystem=self.fs)
        self.prune(keep=path)

    def prune(self, keep: str = "") -> list[str]:
        """Delete the oldest files until the folder is within its bound (never ``keep``,
        the file just written); the paths deleted."""
        files = stored_files(self.fs, self.folder)
        total = sum(stored.size for stored in files)
        deleted = []
        for stored in files:
            if total <= self.max_bytes:
                break
            if stored.path == keep:
                continue
            with contextlib.suppress(FileNotFoundError):  # another replica pruned it first
                self.fs.delete_file(stored.path)
            total -= stored.size
            deleted.append(stored.path)
        if deleted:
            log.info("payload log: %d oldest files deleted (over the size bound)", len(deleted))
        return deleted


def to_table(batch: Iterable[Payload], texts: str) -> pa.Table:
    """The records of ``batch`` as a table of ``SCHEMA``, the texts kept, hashed or
    dropped (``texts``: keep, hash, drop)."""
    return pa.Table.from_pylist([_row(payload, texts) for payload in batch], schema=SCHEMA)


def _row(payload: Payload, texts: str) -> dict[str, Any]:
    given = payload.texts
    return {
        "time": int(payload.time_s * 1000),
        "model": payload.model,
        "version": payload.version,
        "role": payload.role,
        "texts": None if given is None else len(given),
        "inputs": None if given is None else encode_texts(given, texts),
        "outputs": to_json(payload.outputs),
        "latency_ms": float(payload.latency_ms),
        "status": int(payload.status),
        "key_id": payload.key_id,
        "agreement": None if payload.agreement is None else [float(a) for a in payload.agreement],
        "champion_version": payload.champion_version or None,
        "champion_outputs": to_json(payload.champion_outputs),
    }


def encode_texts(given: Sequence[str], texts: str) -> list[str] | None:
    """What a record keeps of the texts (``texts``: keep, hash, drop; redact: kept as
    the log redacted them)."""
    if texts == "drop":
        return None
    if texts == "hash":
        # surrogatepass: a JSON body may carry a lone surrogate, which UTF-8 refuses.
        return [HASH_PREFIX + hashlib.sha256(_bytes(text)).hexdigest() for text in given]
    return [text.encode("utf-8", "replace").decode() for text in given]  # lone ones: "?"


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def to_json(value: Any) -> str | None:
    """An answer as JSON text (numpy arrays as lists, as the client got them)."""
    if value is None:
        return None
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except TypeError:  # what orjson does not know: as text rather than lose the record
        return json.dumps(value, default=str)
