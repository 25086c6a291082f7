"""Bounded micro-batching of concurrent calls to one signature.

KServe's Python ModelServer has no batcher (KServe batches in its Go agent sidecar, and only
for v1 ``instances``), so concurrent ``predict`` requests would each pay a full model call.
This merges concurrent requests, up to ``max_batch_size`` rows, into one call and splits the
outputs back. It waits for batch-mates (at most ``max_latency_ms`` after the first request) only
while another merged call is running: when the model is idle a request goes straight in, so a
lone client pays no batching delay, and under load the wait overlaps a call that runs anyway. At most ``max_queue``
requests wait (later ones wait to enqueue: back-pressure, not unbounded memory) and at most
``max_inflight`` merged calls run at once. Inputs are validated before they are queued, so one
request's error cannot fail its batch-mates; if a merged call fails anyway, each request of the
batch is retried alone so the error reaches only the request that caused it. A request cancelled
while it waits (its client hung up: ``request_body``) is dropped, its rows never scored.

Which signatures can be merged, and how lists of different lengths are padded, is what the
export declares (``signatures.py``); ``not_batchable`` says why one cannot, and the server logs
it at start-up.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

from gmeta_tf.serve.signatures import Signature

Arrays = Dict[str, np.ndarray]


@dataclass(frozen=True)
class BatchingConfig:
    max_batch_size: int = 0  # rows per merged call; 0 turns batching off
    max_latency_ms: float = 2.0  # longest a request waits for batch-mates
    max_queue: int = 1024  # requests waiting to be merged
    max_inflight: int = 2  # merged calls running at once

    @property
    def enabled(self) -> bool:
        return self.max_batch_size > 0


def not_batchable(sig: Signature) -> Optional[str]:
    """Why requests to ``sig`` cannot be merged (rows concatenated, outputs split back), or None
    when they can: the export must declare one batch group holding every input, and the outputs
    as following it. (``adapt_and_predict`` cannot: its support set belongs to one request.)"""
    if not sig.declared:
        return "the SavedModel does not declare which inputs share a batch dimension (no assets.extra/export.json entry)"
    groups = sig.batch_groups
    if len(groups) != 1:
        return f"its inputs form {len(groups)} batch groups ({', '.join(sorted(groups))}): a request's groups belong together"
    (group, names), = groups.items()
    if len(names) != len(sig.inputs):
        return f"some inputs are outside its batch group {group!r}"
    if sig.output_group != group:
        return f"its export does not declare that the outputs follow its batch group {group!r}"
    if not all(o.batched for o in sig.outputs.values()):
        return "some outputs have no batch dimension"
    return None


def batchable(sig: Signature) -> bool:
    return not_batchable(sig) is None


def merge(items: List[Arrays], sig: Signature) -> Arrays:
    """Requests' inputs concatenated along the batch dimension. Lists of different lengths (a
    multi-hot input's second dimension) are padded to the longest with the value the export
    declares for that input; an input without one must have equal shapes (else ``ValueError``,
    and the batcher runs each request alone)."""
    merged = {}
    for name in items[0]:
        parts = [it[name] for it in items]
        widest = tuple(max(p.shape[d] for p in parts) for d in range(1, parts[0].ndim))
        pad = sig.inputs[name].pad if name in sig.inputs else None
        if pad is not None and any(p.shape[1:] != widest for p in parts):
            parts = [np.pad(p, [(0, 0)] + [(0, w - d) for w, d in zip(widest, p.shape[1:])], constant_values=pad)
                     for p in parts]
        merged[name] = np.concatenate(parts)
    return merged


@dataclass
class _Item:
    arrays: Arrays
    rows: int
    future: asyncio.Future


class MicroBatcher:
    def __init__(self, run: Callable[[Arrays], Arrays], config: BatchingConfig, sig: Signature):
        self._run = run
        self._config = config
        self._sig = sig
        self._queue: Optional[asyncio.Queue] = None
        self._worker: Optional[asyncio.Task] = None
        self._inflight: Optional[asyncio.Semaphore] = None
        self._running = 0  # merged calls in the model right now

    async def submit(self, arrays: Arrays) -> Arrays:
        if self._worker is None:  # created on first use, inside the server's event loop
            self._queue = asyncio.Queue(self._config.max_queue)
            self._inflight = asyncio.Semaphore(self._config.max_inflight)
            self._worker = asyncio.get_running_loop().create_task(self._loop())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Item(arrays, int(next(iter(arrays.values())).shape[0]), future))
        return await future

    async def _next(self) -> _Item:
        """The next queued request whose caller still waits for it."""
        while True:
            item = await self._queue.get()
            if not item.future.done():
                return item

    async def _collect(self) -> List[_Item]:
        loop = asyncio.get_running_loop()
        items = [await self._next()]
        rows = items[0].rows
        deadline = loop.time() + self._config.max_latency_ms / 1000.0
        while rows < self._config.max_batch_size:
            if self._queue.empty():
                left = deadline - loop.time()
                if self._running == 0:  # the model is idle: waiting would only add latency
                    break
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), left)
                except asyncio.TimeoutError:
                    break
            else:
                item = self._queue.get_nowait()
            if item.future.done():
                continue
            items.append(item)
            rows += item.rows
        return items

    async def _loop(self) -> None:
        while True:
            await self._inflight.acquire()
            items = await self._collect()
            self._running += 1  # counted from dispatch, before the task first runs
            asyncio.get_running_loop().create_task(self._call(items))

    async def _call(self, items: List[_Item]) -> None:
        loop = asyncio.get_running_loop()
        items = [it for it in items if not it.future.done()]  # cancelled while it waited for batch-mates
        try:
            if not items:
                return
            if len(items) == 1:
                await self._settle(items[0], loop)
                return
            try:
                merged = merge([it.arrays for it in items], self._sig)
                out = await loop.run_in_executor(None, self._run, merged)
            except Exception:
                for it in items:
                    await self._settle(it, loop)
                return
            start = 0
            for it in items:
                if not it.future.done():
                    it.future.set_result({k: v[start:start + it.rows] for k, v in out.items()})
                start += it.rows
        finally:
            self._running -= 1
            self._inflight.release()

    async def _settle(self, item: _Item, loop) -> None:
        if item.future.done():
            return
        try:
            result = await loop.run_in_executor(None, self._run, item.arrays)
        except Exception as e:  # delivered to the request that caused it
            if not item.future.done():
                item.future.set_exception(e)
            return
        if not item.future.done():
            item.future.set_result(result)
