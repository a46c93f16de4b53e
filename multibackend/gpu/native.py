"""Launches described for the compiled front, so a repeated call of our kernels skips Python.

After a plan's first launches, a backend describes what a repeated call of the same plan runs
(:meth:`~multibackend.backends.base.Backend.native`) as a :class:`Native`: D's dtype and sizes
and one or more steps, each either

- a :class:`KernelStep`: one ``cuLaunchKernel`` of a loaded function with a fixed grid, block
  and dynamic shared memory, from a parameter buffer packed once, into which only the
  operands' pointers are written per call (:data:`A`, :data:`B`, :data:`D` at given offsets;
  with :data:`MAP` added, the address of a tensor map the buffer holds);
- an :class:`EntryStep`: one call of a kernel library's ``mb_gemm(shape, a, b, c, d, alpha,
  beta, stream)`` (CUTLASS), with the operand each pointer argument takes;
- a :class:`BlasStep`: one ``cublasGemmEx`` (cuBLAS for a CuPy caller, as ``cupy.matmul``
  calls it), its stream set first.

The compiled front (:mod:`multibackend.run.fastcall`) allocates D with ``at::empty`` and runs the
steps on torch's current stream, while the function's context is current on the thread
(anything else goes back to the Python path, which launches the same kernels). :func:`triton_step`
packs a compiled Triton kernel's parameters the way Triton's own launcher does.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from multibackend.gpu import tensormap

#: the operand a pointer argument is written from on each call
A, B, D = 0, 1, 2
#: added to a slot's operand: the parameter is a tensor map (128 bytes, at a multiple of 64 in
#: the buffer) whose address is replaced by that operand's (cuTensorMapReplaceAddress)
MAP = 4


@dataclass(frozen=True)
class KernelStep:
    """One kernel launch: ``params`` packed, ``offsets`` each parameter's place in it, ``slots``
    the (offset, operand) pairs written with the operands' pointers per call; ``stream`` the
    only stream it may run on (a launch whose scratch buffer belongs to one), None for any;
    ``unordered`` where the kernel adds floats in an order that varies from run to run
    (atomics): the front then leaves calls to the Python path while torch is asked for
    deterministic algorithms."""

    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    params: bytes
    offsets: tuple[int, ...]
    slots: tuple[tuple[int, int], ...]
    stream: int | None = None
    unordered: bool = False

    def wire(self) -> tuple:
        return (0, self.function, self.grid, self.block, self.smem, self.params, self.offsets,
                self.slots, self.unordered, *_pinned(self.stream))


@dataclass(frozen=True)
class EntryStep:
    """One call of ``mb_gemm`` at ``function`` (an address) with the shape array at
    ``shape``; ``operands`` the operand each of its a, b, c and d takes; ``stream`` the only
    stream it may run on (a plan whose workspace belongs to one), None for any."""

    function: int
    shape: int
    operands: tuple[int, int, int, int]
    alpha: float
    beta: float
    stream: int | None = None

    def wire(self) -> tuple:
        return (1, self.function, self.shape, self.operands, float(self.alpha), float(self.beta),
                *_pinned(self.stream))


@dataclass(frozen=True)
class BlasStep:
    """One cuBLAS GEMM: ``cublasSetStream_v2(handle, stream)``, then ``cublasGemmEx(handle,
    transa, transb, m, n, k, &alpha, A, a_type, lda, B, b_type, ldb, &beta, C, c_type, ldc,
    compute, algo)`` with ``ints`` those 13 integers in that order, ``operands`` the operand
    passed as its A, B and C, ``scalars`` alpha then beta as the compute type reads them
    (two floats or two doubles), at the addresses ``gemm`` and ``set_stream``."""

    gemm: int
    set_stream: int
    handle: int
    ints: tuple[int, ...]
    operands: tuple[int, int, int]
    scalars: bytes
    stream: int | None = None

    def wire(self) -> tuple:
        return (2, self.gemm, self.set_stream, self.handle, self.ints, self.operands,
                self.scalars, *_pinned(self.stream))


def _pinned(stream: int | None) -> tuple[bool, int]:
    """A step's stream as the front reads it: (whether it is bound to one, its raw handle;
    0 is a stream too, the legacy default one)."""
    return stream is not None, stream or 0


@dataclass(frozen=True)
class Native:
    """What a repeated call runs: D's dtype and sizes, the CUDA context the steps' functions
    belong to (0: host tensors, for tests), the steps, and what keeps their functions, buffers
    and shape arrays alive while the plan is held."""

    d_dtype: Any
    d_sizes: tuple[int, ...]
    context: int
    steps: tuple[KernelStep | EntryStep | BlasStep, ...]
    keep: tuple = ()


#: the code :func:`packed` takes for a tensor map's bytes, placed at a multiple of 64
TENSOR_MAP = "map"


def d_sizes(problem: Any) -> tuple[int, ...]:
    """The sizes of D the front makes for a matmul ``problem``: (M, N) for a product of two
    matrices (the calls handed over), (batch, M, N) for a batch."""
    if problem.batch == 1:
        return (problem.m, problem.n)
    return (problem.batch, problem.m, problem.n)


def packed(params: list[tuple[str, Any]]) -> tuple[bytes, tuple[int, ...]]:
    """(the values of ``params``, a list of (struct format code, value), each at its natural
    alignment, and each one's offset). A :data:`TENSOR_MAP` value is a tensor map's 128
    bytes, aligned as the driver replaces its address in place."""
    data = bytearray()
    offsets = []
    for code, value in params:
        if code == TENSOR_MAP:
            if len(value) != tensormap.SIZE:
                raise ValueError(f"packed: a tensor map of {len(value)} bytes: expected "
                                 f"{tensormap.SIZE}")
            raw, align = value, tensormap.ALIGN
        else:
            raw = struct.pack(code, value)
            align = len(raw)
        data += bytes(-len(data) % align)
        offsets.append(len(data))
        data += raw
    return bytes(data), tuple(offsets)


def launch_step(launch: Any, slots: dict[str, int], fixed: dict[str, int] | None = None,
                stream: int | None = None) -> KernelStep:
    """The step of a :class:`multibackend.gpu.driver.Launch`: its function, grid, block, shared
    memory and argument buffer as it holds them, each parameter named in ``slots`` written
    with that operand's pointer per call, each named in ``fixed`` set to its value here (a
    buffer the plan keeps, on ``stream``)."""
    args = launch.args
    layout = type(args.values)
    values = layout.from_buffer_copy(args.values)
    for name, value in (fixed or {}).items():
        setattr(values, name, value)
    return KernelStep(int(launch.function.handle), launch.grid, launch.block,
                      launch.dynamic_smem, bytes(values),
                      tuple(getattr(layout, name).offset for name, _ in args.params),
                      tuple((getattr(layout, name).offset, source)
                            for name, source in slots.items()), stream)


#: struct codes of Triton's scalar parameter types, as its launcher passes them (fp32 as a
#: 32-bit float, fp64 as a double; 16-bit floats are not passed here)
_TRITON_CODES = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B",
                 "u16": "H", "u32": "I", "u64": "Q", "fp32": "f", "f32": "f", "fp64": "d"}


def _hooked(hook: Any) -> bool:
    """Whether a Triton launch hook calls anything (a function, or a chain holding some)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def triton_step(compiled: Any, grid: tuple[int, int, int], args: tuple,
                sources: dict[int, int], fixed: dict[int, int] | None = None,
                stream: int | None = None, unordered: bool = False) -> KernelStep | None:
    """The launch of a compiled Triton kernel with ``args`` (every parameter of the kernel,
    constexprs included, in order) as Triton's launcher makes it: the non-constexpr
    parameters in order, a pointer per ``*`` type, a host tensor descriptor as its tensor map
    (:func:`multibackend.gpu.tensormap.triton_map`), its shape (32-bit) and its strides (64-bit),
    then the global and profile scratch pointers (null). ``sources`` maps the position of each
    pointer argument to the operand it takes, and of each descriptor to the operand (plus
    :data:`MAP`) whose address its map takes per call; ``fixed`` the position of each other
    pointer to the address it always takes (a buffer the plan keeps, on ``stream``; see
    :class:`KernelStep` for ``unordered``). None where that launcher does more than one plain
    launch (clusters, cooperative or programmatic launches, scratch memory, launch hooks,
    descriptors it passes as pointers, 16-bit float or tuple arguments) or the kernel is not
    loaded."""
    from triton import knobs

    meta = compiled.metadata
    if (compiled.function is None or getattr(meta, "num_ctas", 1) != 1
            or getattr(meta, "launch_cooperative_grid", False) or getattr(meta, "launch_pdl", False)
            or getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0)
            or _hooked(knobs.runtime.launch_enter_hook)
            or _hooked(knobs.runtime.launch_exit_hook)):
        return None
    types = list(compiled.src.signature.values())
    if len(types) != len(args):
        return None
    maps = iter(getattr(meta, "tensordesc_meta", None) or ())
    params: list[tuple[str, Any]] = []
    pointer_positions = []
    for position, (kind, value) in enumerate(zip(types, args)):
        if kind == "constexpr":
            continue
        if not isinstance(kind, str):
            return None
        if kind.startswith("tensordesc"):
            described = next(maps, None)
            source = sources.get(position)
            if described is None or described.get("fp4_padded") or source is None \
                    or not source & MAP:
                return None
            pointer_positions.append((len(params), source))
            params.append((TENSOR_MAP, tensormap.triton_map(described, value)))
            params += [("i", int(size)) for size in value.shape]
            params += [("q", int(step)) for step in value.strides]
        elif kind.startswith("*"):
            if position in sources:
                pointer_positions.append((len(params), sources[position]))
                params.append(("Q", 0))
            elif fixed and position in fixed:
                params.append(("Q", fixed[position]))
            else:
                return None
        elif kind in _TRITON_CODES:
            params.append((_TRITON_CODES[kind], value))
        else:
            return None
    params += [("Q", 0), ("Q", 0)]  # global and profile scratch: none
    data, offsets = packed(params)
    slots = tuple((offsets[index], source) for index, source in pointer_positions)
    return KernelStep(int(compiled.function), tuple(grid), (32 * meta.num_warps, 1, 1),
                      int(meta.shared), data, offsets, slots, stream, unordered)
