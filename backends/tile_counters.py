"""Zeroed int32 counters for kernels whose programs count their arrival on an output tile
(the fused split-K kernel: the last program of a tile to arrive reduces it), and zeroed
float32 sums for kernels whose programs add their partial tiles into one by atomics.

Such a kernel needs its counters (sums) at zero when it starts and sets each one back to
zero before it ends, so one buffer serves every later launch on the same stream (launches on
one stream run one after another). Launches on different streams may run at once, so each
stream gets its own buffer. A buffer is never allocated per call, and none is allocated
while a stream is being captured into a CUDA graph where that can be helped: the first use
on a device (not under capture) allocates and zeroes a pool of CHUNKS chunks of CHUNK
elements, synchronized once, and each stream met later takes the next chunk of it, already
zero, with no allocation or memset, so a graph captured on a new stream holds no extra node.
A stream that needs more than a chunk, or that comes when the pool is used up or before it
exists, gets a buffer of its own, zeroed on that stream (under capture: a memset node of
that graph); a buffer a stream outgrows is kept, not freed, as a graph may still use it.
"""
from __future__ import annotations

from typing import Any

#: counters per chunk (output tiles of one launch, over the batch), and chunks per pool
CHUNK = 4096
CHUNKS = 32


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

        cuda = device.type == "cuda"  # else Triton's interpreter, on the CPU
        index = (device.index if device.index is not None else torch.cuda.current_device()
                 ) if cuda else -1
        key = (index, stream)
        found = self._given.get(key)
        if found is not None and found.numel() >= count:
            return found
        if cuda and found is None and count <= self.chunk:
            carved = self._carve(index, device, torch.cuda.is_current_stream_capturing())
            if carved is not None:
                self._given[key] = carved
                return carved
        own = torch.zeros(max(count, self.chunk), dtype=getattr(torch, self.dtype),
                          device=device)
        if found is not None:
            self._outgrown.append(found)
        self._given[key] = own
        return own

    def _carve(self, index: int, device: Any, capturing: bool) -> Any | None:
        """The next unused chunk of the device's pool (made now unless capturing), or None."""
        import torch

        pool = self._pools.get(index)
        if pool is None:
            if capturing:
                return None
            buffer = torch.zeros(self.chunk * self.chunks, dtype=getattr(torch, self.dtype),
                                 device=device)
            torch.cuda.synchronize(device)  # zero before any stream uses it
            pool = self._pools[index] = (buffer, 0)
        buffer, used = pool
        if used == self.chunks:
            return None
        self._pools[index] = (buffer, used + 1)
        return buffer[used * self.chunk:(used + 1) * self.chunk]
