"""Coalesce the concurrent requests of one replica into one Triton call per model.

Every request that reaches a replica while a call to the same Triton model is in flight
waits in that model's lane; when a call returns (or fewer than ``max_in_flight`` calls are
out), everything waiting leaves together as one request of stacked rows. Nothing ever
waits for company: alone, a request goes out at once, so concurrency 1 pays no delay, and
under load the batches grow by themselves. One call instead of N saves what is paid per
call on both sides: building the gRPC message in Python, Triton's request handling, and
the Python-backend stub's per-request work.

Under load heavy enough to fill whole calls (``max_rows`` rows waiting), up to
``full_calls_ahead`` more calls may be out, full ones only: they wait in Triton's queue,
so an instance that finishes a batch starts the next at once instead of idling while the
replica turns the answer around. Lighter load never sends them, and its calls stay big.

Right-padding rows of different lengths is invisible in the results because every served
graph pools with the attention mask (see ``infergate.triton.backend_model``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from infergate.errors import BackendUnavailable, InfergateError, Overloaded

if TYPE_CHECKING:
    from infergate.config import FrontendSettings

PAD_ID = 0  # any id works under mask 0; BERT's [PAD] is 0


class Backend(Protocol):
    """Runs a Triton model on token ids: Triton over gRPC, or a batcher in front of it."""

    async def infer(
        self,
        model: str,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        output_name: str,
        *,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """``extra``: more int64 ``[rows, n]`` inputs by name (translation's decoding
        settings); only tasks that need them pass them."""
        ...


@dataclass
class _Waiting:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    output_name: str
    future: asyncio.Future[np.ndarray]
    extra: Mapping[str, np.ndarray] | None = None

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class _Lane:
    """The requests waiting for one Triton model, and how many calls it has out."""

    waiting: deque[_Waiting] = field(default_factory=deque)
    rows: int = 0  # in ``waiting``
    in_flight: int = 0


class BatchingBackend:
    """A ``Backend`` that sends concurrent requests for the same model as one call.

    Meant for one asyncio event loop (a replica's). ``max_rows`` caps the rows of one call
    (Triton's ``max_batch_size``); a single request larger than that is sent in slices.
    ``max_in_flight`` calls per model may be out at once, so Triton can run one batch
    while the replica prepares the next; ``full_calls_ahead`` more when each is full.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        max_rows: int,
        max_in_flight: int,
        full_calls_ahead: int = 0,
        max_queued_rows: int | None = None,
    ) -> None:
        if max_rows < 1 or max_in_flight < 1:
            raise ValueError("max_rows and max_in_flight must be at least 1")
        if full_calls_ahead < 0:
            raise ValueError("full_calls_ahead must be at least 0")
        self.backend = backend
        self.max_rows = max_rows
        self.max_in_flight = max_in_flight
        self.full_calls_ahead = full_calls_ahead
        self.max_queued_rows = max_queued_rows
        self._lanes: dict[str, _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # strong references while they run

    @classmethod
    def from_settings(cls, backend: Backend, settings: FrontendSettings) -> BatchingBackend:
        """The coalescing a front-end replica's settings ask for."""
        return cls(
            backend,
            max_rows=settings.batch_max_rows,
            max_in_flight=settings.batch_max_in_flight,
            full_calls_ahead=settings.batch_full_calls_ahead,
            max_queued_rows=settings.max_queued_rows,
        )

    @property
    def idle(self) -> bool:
        """No request waits in a lane and no call is out."""
        lanes = self._lanes.values()
        return not self._tasks and not any(lane.waiting or lane.in_flight for lane in lanes)

    async def infer(
        self,
        model: str,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        output_name: str,
        *,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        rows = input_ids.shape[0]
        if rows > self.max_rows:  # Triton refuses a call above its max_batch_size
            step = self.max_rows
            parts = [
                self.infer(model, input_ids[i : i + step], attention_mask[i : i + step],
                           output_name,
                           extra={k: v[i : i + step] for k, v in extra.items()} if extra else None)
                for i in range(0, rows, step)
            ]  # fmt: skip
            return _concat_rows(await asyncio.gather(*parts))
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        lane = self._lanes.setdefault(model, _Lane())
        limit = self.max_queued_rows
        if limit is not None and lane.waiting and lane.rows + rows > limit:
            # Shed at once: a request queued behind this many would only wait longer, and
            # the client may as well try another replica or come back.
            raise Overloaded(
                f"{lane.rows} texts already wait for model {model!r} on this replica "
                f"(limit {limit}); retry shortly",
                retry_after_s=1.0,
            )
        lane.waiting.append(_Waiting(input_ids, attention_mask, output_name, future, extra))
        lane.rows += rows
        self._dispatch(model, lane)
        return await future

    def _may_send(self, lane: _Lane) -> bool:
        if lane.in_flight < self.max_in_flight:
            return True
        if lane.in_flight >= self.max_in_flight + self.full_calls_ahead:
            return False
        rows = 0  # beyond max_in_flight only with a full call's worth waiting
        for item in lane.waiting:  # callers that gave up count until skipped
            rows += item.rows
            if rows >= self.max_rows:
                return True
        return False

    def _dispatch(self, model: str, lane: _Lane) -> None:
        while lane.waiting and self._may_send(lane):
            batch = self._take(lane)
            if not batch:  # every waiting caller gave up
                continue
            lane.in_flight += 1
            task = asyncio.get_running_loop().create_task(self._call(model, lane, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self, lane: _Lane) -> list[_Waiting]:
        """The next batch: waiting requests in arrival order, up to ``max_rows`` rows, all
        for the same output (a model has one, but the caller names it)."""
        batch: list[_Waiting] = []
        rows = 0
        while lane.waiting:
            head = lane.waiting[0]
            if head.future.done():  # cancelled: its client went away
                lane.waiting.popleft()
                lane.rows -= head.rows
                continue
            if batch and (
                rows + head.rows > self.max_rows
                or head.output_name != batch[0].output_name
                or _extra_names(head) != _extra_names(batch[0])
            ):
                break
            batch.append(lane.waiting.popleft())
            lane.rows -= head.rows
            rows += head.rows
        return batch

    async def _call(self, model: str, lane: _Lane, batch: list[_Waiting]) -> None:
        try:
            await self._run(model, batch)
        finally:
            lane.in_flight -= 1
            if lane.waiting:
                self._dispatch(model, lane)
            elif lane.in_flight == 0:
                self._lanes.pop(model, None)  # a version unloaded must not keep a lane

    async def _run(self, model: str, batch: list[_Waiting]) -> None:
        try:
            output = await self._infer(model, batch)
        except BackendUnavailable as error:
            _fail(batch, error)
            return
        except InfergateError as error:
            if len(batch) == 1:
                _fail(batch, error)
                return
            # The model rejected the batch: run each request alone so that only a faulty
            # one fails (the same rule as the Triton model applies to its batches).
            for item in batch:
                await self._run(model, [item])
            return
        except BaseException as error:  # a bug or cancellation: nobody may wait forever
            _fail(batch, error)
            raise
        start = 0
        for item in batch:
            stop = start + item.rows
            if not item.future.done():
                rows = output[start:stop]
                if rows.ndim == 3:  # per-token: this request's own sequence length
                    rows = rows[:, : item.input_ids.shape[1]]
                item.future.set_result(rows)
            start = stop

    async def _infer(self, model: str, batch: list[_Waiting]) -> np.ndarray:
        first = batch[0]
        if len(batch) == 1:
            if first.extra:
                return await self.backend.infer(
                    model, first.input_ids, first.attention_mask, first.output_name,
                    extra=first.extra,
                )  # fmt: skip
            return await self.backend.infer(
                model, first.input_ids, first.attention_mask, first.output_name
            )
        input_ids = _pad_and_stack([item.input_ids for item in batch])
        attention_mask = _pad_and_stack([item.attention_mask for item in batch])
        if first.extra:  # the same names in every item (``_take``)
            extra = {
                name: np.concatenate([item.extra[name] for item in batch if item.extra])
                for name in first.extra
            }
            output = await self.backend.infer(
                model, input_ids, attention_mask, first.output_name, extra=extra
            )
        else:
            output = await self.backend.infer(model, input_ids, attention_mask, first.output_name)
        if output.shape[0] != input_ids.shape[0]:
            raise InfergateError(
                f"The inference backend returned {output.shape[0]} rows for "
                f"{input_ids.shape[0]} inputs."
            )
        return output


def _extra_names(item: _Waiting) -> tuple[str, ...]:
    return tuple(sorted(item.extra or ()))


def _concat_rows(parts: list[np.ndarray]) -> np.ndarray:
    """Rows of several calls as one array; 2-d outputs of different widths (generated
    token ids, padded with -1 to each call's longest) are padded to the widest."""
    if parts[0].ndim == 2 and parts[0].dtype == np.int64:
        widest = max(part.shape[1] for part in parts)
        parts = [
            np.pad(part, ((0, 0), (0, widest - part.shape[1])), constant_values=-1)
            for part in parts
        ]
    return np.concatenate(parts)


def _fail(batch: list[_Waiting], error: BaseException) -> None:
    for item in batch:
        if not item.future.done():
            item.future.set_exception(error)


def _pad_and_stack(arrays: list[np.ndarray]) -> np.ndarray:
    """``[rows_i, length_i]`` arrays as one ``[sum rows, max length]`` array, right-padded."""
    longest = max(array.shape[1] for array in arrays)
    stacked = np.full((sum(a.shape[0] for a in arrays), longest), PAD_ID, dtype=np.int64)
    row = 0
    for array in arrays:
        stacked[row : row + array.shape[0], : array.shape[1]] = array
        row += array.shape[0]
    return stacked
