"""Per-stream device buffers of the split-K kernels, kept from launch to launch so that no
call allocates one: zeroed int32 counters for kernels whose programs count their arrival on
an output tile (the last program of a tile to arrive reduces it), zeroed float32 sums for
kernels whose programs add their partial tiles into one by atomics (:class:`TileCounters`),
and float32 scratch for partials a launch writes before it reads them
(:class:`StreamScratch`).

A kernel using counters (sums) needs them at zero when it starts and sets each one back to
zero before it ends, so one buffer serves every later launch on the same stream (launches on
one stream run one after another). Launches on different streams may run at once, so each
stream gets its own buffer. A CUDA graph holds the buffers of the stream it was captured on,
so two graphs captured on one stream must not be replayed at once on two streams (the README
says so). A buffer per capture would lift that, at a cost: each capture would draw its own
chunks of the pool, and once a process had captured a few dozen graphs (a benchmark captures
one per product timed) every later one would hold a memset node of its own. A buffer is
never allocated per call, and none is allocated while a stream is being captured into a CUDA
graph where that can be helped: the first use on a device (not under capture: a product's
first call plans it, and is never captured) allocates and zeroes a pool of CHUNKS chunks of
CHUNK elements, synchronized once, and each stream met later takes the next chunks of it, as
many as its launch needs, already zero, with no allocation or memset, so a graph captured on
a new stream holds no extra node. A stream
that outgrows its share takes a larger one the same way, at least twice as large where the
pool has that left. Only a need beyond what the pool has left gets a buffer of its own,
zeroed on that stream (under capture: a memset node of that graph, replayed with it on every
run); a share or buffer a stream outgrows is kept, not freed, as a graph may still use it.
On an H100 (graph mode, f16, x torch.matmul in the same run), the TMA split-K kernel in two
slices of 128x128 tiles (64 tiles of float32 sums: four chunks of the sums' pool) ran
1024x1024x16384 at 0.948x where its graph held the memset of a capture stream's own 4 MiB
of sums, against 0.997x for the same kernel where that stream had them already (with the
shares carved from the pool, 0.996x captured first in another run).

Scratch is neither zeroed nor filled: where torch is asked for deterministic algorithms it
fills every new tensor with NaN (``torch.utils.deterministic.fill_uninitialized_memory``),
and a workspace made per call paid that fill on every call, a kernel of its own, captured
into CUDA graphs too. On an H100 (graph mode, f16, x torch.matmul in the same run), the TMA
split-K kernel adding two slices of 128x128x64 tiles in order ran 1024x1024x16384 at
0.89-0.91x on a workspace made per call (0.97-0.99x adding them by atomics) and 0.96x on the
kept scratch (0.94x by atomics, in that run). A stream's scratch grows by at least doubling;
one larger than SCRATCH_KEEP_BYTES is made per call, unfilled.
"""
from __future__ import annotations

from typing import Any

#: counters per chunk (output tiles of one launch, over the batch), and chunks per pool
CHUNK = 4096
CHUNKS = 32
#: the largest scratch kept for a stream (bytes); a launch needing more gets its own
SCRATCH_KEEP_BYTES = 64 << 20


def _stream_key(device: Any, stream: int) -> tuple[int, int]:
    """(the device's index, -1 for Triton's interpreter on the CPU; the stream handle)."""
    import torch

    if device.type != "cuda":
        return -1, stream
    return (device.index if device.index is not None else torch.cuda.current_device()), stream


class TileCounters:
    """Per (device, stream) zeroed buffers of ``dtype`` (a torch dtype's name), carved from
    one zeroed pool per device."""

    def __init__(self, chunk: int = CHUNK, chunks: int = CHUNKS, dtype: str = "int32") -> None:
        self.chunk, self.chunks, self.dtype = chunk, chunks, dtype
        self._pools: dict[int, tuple[Any, int]] = {}  # device -> (pool, chunks handed out)
        self._given: dict[tuple[int, int], Any] = {}
        # buffers outgrown by their stream: kept, since a CUDA graph captured earlier may
        # still address them
        self._outgrown: list[Any] = []

    def get(self, device: Any, stream: int, count: int) -> Any:
        """At least ``count`` elements, zero between launches, for launches on
        ``stream`` (a CUDA stream handle) of torch device ``device``."""
        import torch

        key = _stream_key(device, stream)
        found = self._given.get(key)
        if found is not None and found.numel() >= count:
            return found
        chunks = -(-count // self.chunk)
        given = None
        if found is not None:  # grown by at least doubling, where the pool has that left
            doubled = 2 * -(-found.numel() // self.chunk)
            given = self._carve(key[0], device, max(chunks, doubled))
        if given is None:
            given = self._carve(key[0], device, chunks)
        if given is None:
            given = torch.zeros(max(count, self.chunk), dtype=getattr(torch, self.dtype),
                                device=device)
        if found is not None:
            self._outgrown.append(found)
        self._given[key] = given
        return given

    def _carve(self, index: int, device: Any, chunks: int) -> Any | None:
        """The next ``chunks`` unused chunks of the device's pool, in one piece (the pool
        made now unless a stream of the device is being captured), or None where the pool
        has fewer left."""
        import torch

        pool = self._pools.get(index)
        if pool is None:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return None
            buffer = torch.zeros(self.chunk * self.chunks, dtype=getattr(torch, self.dtype),
                                 device=device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # zero before any stream uses it
            pool = self._pools[index] = (buffer, 0)
        buffer, used = pool
        if used + chunks > self.chunks:
            return None
        self._pools[index] = (buffer, used + chunks)
        return buffer[used * self.chunk:(used + chunks) * self.chunk]


class StreamScratch:
    """Per (device, stream) float32 buffers a launch writes before it reads them, neither
    zeroed nor filled (see the module's docstring)."""

    def __init__(self, keep_bytes: int = SCRATCH_KEEP_BYTES) -> None:
        self.keep = keep_bytes // 4
        self._given: dict[tuple[int, int], Any] = {}
        self._outgrown: list[Any] = []  # kept: a CUDA graph captured earlier may use them

    def get(self, device: Any, stream: int, count: int) -> Any:
        """At least ``count`` float32 elements, of unspecified value, for launches on
        ``stream`` (a CUDA stream handle) of torch device ``device``."""
        key = _stream_key(device, stream)
        found = self._given.get(key)
        if found is not None and found.numel() >= count:
            return found
        if count > self.keep:
            return _unfilled(count, device)
        own = _unfilled(count if found is None else min(max(count, 2 * found.numel()),
                                                        self.keep), device)
        if found is not None:
            self._outgrown.append(found)
        self._given[key] = own
        return own


def _unfilled(count: int, device: Any) -> Any:
    """``count`` float32 elements on ``device`` that torch leaves as they are, where it is
    asked for deterministic algorithms too."""
    import torch

    settings = torch.utils.deterministic
    fill = settings.fill_uninitialized_memory
    settings.fill_uninitialized_memory = False
    try:
        return torch.empty((count,), dtype=torch.float32, device=device)
    finally:
        settings.fill_uninitialized_memory = fill
