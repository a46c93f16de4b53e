"""Tensor maps for the TMA unit (sm_90+), encoded by the CUDA driver.

The warpgroup GEMM's TMA kernels (``raw_wmma/mma_kmajor.cu``, ``rw_tma_*``) read each
operand through a tensor map: the operand seen as rows of bytes along its contiguous
direction (K of a K-major operand, M or N of an MN-major one), then rows, then batch
entries, loaded in boxes of 128 bytes by ``box_rows`` rows in the 128-byte swizzle, L2
promotion by 256 bytes, zeros outside the operand. A :class:`TensorMap` is encoded once per
prepared launch by libcuda's ``cuTensorMapEncodeTiled`` (called through ctypes, in a 64-byte
aligned buffer of its own); a later call whose operand lies elsewhere rewrites only the
map's address (``cuTensorMapReplaceAddress``) and copies the 128 bytes into the kernel's
argument buffer: no Python objects are made per call.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

from multibackend.core.errors import InvalidArgument, KernelRefused

#: bytes of a tensor map (CUtensorMap), and the alignment the driver needs for it
SIZE = 128
ALIGN = 64
#: bytes of K per box row (the 128-byte swizzle's width)
BOX_BYTES = 128
#: the largest box extent along a dimension
MAX_BOX_ROWS = 256
#: CUtensorMapDataType UINT8, CUtensorMapInterleave NONE, CUtensorMapSwizzle 128B,
#: CUtensorMapL2promotion L2_256B, CUtensorMapFloatOOBfill NONE (zeros)
_UINT8, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_256B, _FILL_ZEROS = 0, 0, 3, 3, 0
#: CUtensorMapL2promotion L2_128B and CUtensorMapFloatOOBfill NAN_REQUEST_ZERO_FMA: what
#: Triton's launcher encodes its descriptors with (its padding "nan" asks for the latter)
_L2_128B, _FILL_NAN = 2, 1


@functools.cache
def _functions() -> tuple[Any, Any]:
    """libcuda's cuTensorMapEncodeTiled and cuTensorMapReplaceAddress, typed for ctypes."""
    lib = ctypes.CDLL("libcuda.so.1")
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    encode = lib.cuTensorMapEncodeTiled
    encode.restype = ctypes.c_int
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p,
                       u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    replace = lib.cuTensorMapReplaceAddress
    replace.restype = ctypes.c_int
    replace.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return encode, replace


def _aligned_buffer() -> tuple[Any, int]:
    """(a buffer, the address in it) of a tensor map's bytes, aligned as the driver needs."""
    raw = ctypes.create_string_buffer(SIZE + ALIGN)
    return raw, -(-ctypes.addressof(raw) // ALIGN) * ALIGN


def _failed(call: str, result: int) -> KernelRefused:
    from multibackend.gpu.driver import describe

    return KernelRefused(f"{call} failed: {describe(result)}")


class TensorMap:
    """The tensor map of one operand of ``rows`` rows of ``row_bytes`` bytes, ``ld`` bytes apart,
    ``batch`` entries ``batch_stride`` bytes apart (the strides are ignored for one row and one
    entry, which TMA never steps over), at ``address``,
    loaded in boxes of ``box_rows`` rows. Raises :class:`InvalidArgument` naming the rule a
    value breaks (TMA reads 16-byte aligned rows), :class:`KernelRefused` when the driver
    refuses the map."""

    def __init__(self, name: str, address: int, row_bytes: int, rows: int, ld: int, batch: int,
                 batch_stride: int, box_rows: int):
        if rows == 1:  # a stride no load steps over: any multiple of 16 will do
            ld = -(-row_bytes // 16) * 16
        if batch == 1:
            batch_stride = rows * ld
        for what, value in (("address", address), ("row stride", ld),
                            ("batch stride", batch_stride)):
            if value <= 0 or value % 16:
                raise InvalidArgument(f"tensor map of {name}: its {what} is {value} bytes: TMA "
                                      "needs a positive multiple of 16")
        if not 0 < box_rows <= MAX_BOX_ROWS or box_rows % 8:
            raise InvalidArgument(f"tensor map of {name}: box_rows is {box_rows}: TMA boxes "
                                  f"hold 8 .. {MAX_BOX_ROWS} rows, a multiple of 8 (one "
                                  "swizzle atom)")
        self.name = name
        self._raw, self._at = _aligned_buffer()
        self.address = address
        encode, _ = _functions()
        dims = (ctypes.c_uint64 * 3)(row_bytes, rows, batch)
        strides = (ctypes.c_uint64 * 2)(ld, batch_stride)
        box = (ctypes.c_uint32 * 3)(BOX_BYTES, box_rows, 1)
        steps = (ctypes.c_uint32 * 3)(1, 1, 1)
        result = encode(self._at, _UINT8, 3, address, dims, strides, box, steps,
                        _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_256B, _FILL_ZEROS)
        if result:
            raise _failed(f"cuTensorMapEncodeTiled of {name} (address {address:#x}, dims "
                          f"{row_bytes} x {rows} x {batch} bytes, strides {ld} / {batch_stride}, "
                          f"box {BOX_BYTES} x {box_rows})", result)

    def point_at(self, address: int) -> None:
        """The same map over an operand of the same sizes and strides at ``address``."""
        if address != self.address:
            if address % 16:
                raise InvalidArgument(f"tensor map of {self.name}: its address is {address:#x}: "
                                      "TMA needs a multiple of 16")
            result = _functions()[1](self._at, address)
            if result:
                raise _failed(f"cuTensorMapReplaceAddress of {self.name} ({address:#x})", result)
            self.address = address

    def write(self, destination: int) -> None:
        """Copy the map's 128 bytes to the address ``destination`` (a kernel argument)."""
        ctypes.memmove(destination, self._at, SIZE)

    def bytes(self) -> bytes:
        return ctypes.string_at(self._at, SIZE)


def triton_map(meta: dict, desc: Any) -> bytes:
    """The 128 bytes of the tensor map Triton's launcher encodes for the host tensor
    descriptor ``desc`` (``triton.tools.tensor_descriptor.TensorDescriptor``) of a kernel
    compiled with ``meta`` (its entry of the kernel's ``tensordesc_meta``): the same call of
    ``cuTensorMapEncodeTiled`` (data type, swizzle and box from ``meta``; the descriptor's
    shape, its strides in bytes and its base's address; L2 promotion by 128 bytes; zeros, or
    NaN where the descriptor pads with NaN, outside the tensor), so a launch that carries these
    bytes reads what Triton's launch of the same descriptor reads. Raises
    :class:`KernelRefused` when the driver refuses the map."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    shape, strides = list(desc.shape), list(desc.strides)
    rank, size = len(shape), int(meta["elem_size"])
    dims = (ctypes.c_uint64 * rank)(*reversed(shape))
    steps_bytes = (ctypes.c_uint64 * max(1, rank - 1))(*[size * s for s in reversed(strides[:-1])])
    box = (ctypes.c_uint32 * rank)(*reversed(list(meta["block_size"])))
    ones = (ctypes.c_uint32 * rank)(*[1] * rank)
    fill = _FILL_NAN if desc.padding == "nan" else _FILL_ZEROS
    raw, at = _aligned_buffer()
    address = desc.base.data_ptr()
    result = _functions()[0](at, TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]], rank, address,
                             dims, steps_bytes, box, ones, _INTERLEAVE_NONE,
                             int(meta["swizzle"]), _L2_128B, fill)
    if result:
        raise _failed(f"cuTensorMapEncodeTiled of a Triton descriptor (address {address:#x}, "
                      f"shape {shape}, strides {strides}, block {list(meta['block_size'])})",
                      result)
    return ctypes.string_at(at, SIZE)
