"""Staging: misaligned operands copied onto the 16-byte grid, so the fast kernels run.

TMA, vectorized loads and cuBLAS's fast kernels need every line of an operand (each row of a
row-major matrix, each column of a column-major one) to start on a 16-byte boundary. A K or
N that is not a multiple of 8 (16-bit types), a view sliced from a wider matrix or an offset
pointer breaks that, and cuBLAS falls to kernels at a fifth of its aligned speed. A *staged*
config copies each misaligned operand of A and B into a buffer whose lines start every
:data:`PAD` elements (one pass at copy bandwidth, inside the call, so every timing counts
it) and runs the backend's aligned kernel on the copies. D is written in place by the
kernel's own epilogue, whatever its alignment. The padding between lines is never read:
every kernel bounds its loads by the logical M, N and K (TMA zero-fills past them), so it
is not cleared.

The copy is our own kernel (``raw_wmma/stage.cu``: 16-byte stores, any source strides):
on an H100 it moved 2.2-2.9 TB/s (read plus written) on 24-134 MB matrices where torch's
strided ``copy_`` moved 1.3-1.6. Torch copies batches, and matrices where the driver
bindings or a CUDA compiler are missing (:func:`torch_copies_why`). Buffers come from
torch's caching allocator, which keeps a pool per device and stream: a repeated call is
served from it without a device allocation, inside a CUDA graph capture the buffer comes
from the graph's own pool (as any torch op's output does), and nothing grows beyond what
the allocator already bounds.

A repeated staged call that the compiled front launches (:mod:`multibackend.gpu.native`) runs
:func:`native_copies`' steps instead: the copy kernel writes each misaligned operand into a
buffer of the call's stream (:func:`arena`), and the backend's
kernel reads the copies there, with no Python and no allocation per call. Those buffers are
kept for the process's life (a captured graph or a plan may hold their addresses), one per
(device, stream, operand) in use at a time, each growing to the next power of two when a
larger copy needs it (the outgrown ones stay held: together less than the one in use), and
the steps are pinned to that stream, so work queued on it in order never overlaps.

A backend offers staged configs, named ``staged:<its config for the staged problem>``, next
to its own for a misaligned problem (:func:`offered`); the tuner, first-call autotuning and
the calibrated dispatch rule weigh them like any other config, since the copy costs more
than it saves on small problems.

*K-major* staging serves kernels that read A row-major and B column-major only (raw WMMA's
wgmma and mma.sync GEMMs, and its TMA GEMM but for f16 / bf16: their instructions take
K-contiguous operands): an operand in
the other orientation (or misaligned) is copied into that one, lines on the grid as above, by
a transposing copy (``rw_stage_t_*``: 32 x 32 tiles through shared memory, both sides moved
in whole sectors). Its configs carry ``kmajor=True`` (:func:`wrap`), and everything keyed by
the staged problem follows that flag (:func:`staged_problem`).
"""
from __future__ import annotations

import functools
import threading
from dataclasses import replace
from typing import Any, Callable

from multibackend.core.config import Config, Operands
from multibackend.core.errors import CompileError
from multibackend.core.problem import Operand, Problem, interned
from multibackend.gpu import driver, native, nvrtc
from multibackend.gpu.driver import INT32, INT64, POINTER, Param
from multibackend.raw_wmma import source_path

#: staged lines start every PAD elements (128 bytes for 16-bit types)
PAD = 64
PREFIX = "staged:"
#: how many of a backend's configs for the staged problem it offers as staged configs
OFFERED = 3
_STAGED: dict[tuple[Problem, bool], Problem] = {}
_LIMIT = 4096

#: the copy kernel of a repeated staged call (raw_wmma/stage.cu): its entry point by element
#: size in bytes, its parameters as its extern "C" signature declares them, its block size
STAGE_SOURCE = "stage.cu"
STAGE_KERNELS = {1: "rw_stage_b8", 2: "rw_stage_b16", 4: "rw_stage_b32", 8: "rw_stage_b64"}
#: the transposing copy (a source whose lines are its contiguous direction), by element size
TRANSPOSE_KERNELS = {size: name.replace("rw_stage_", "rw_stage_t_")
                     for size, name in STAGE_KERNELS.items()}
TRANSPOSE_TILE = 32
STAGE_PARAMS: tuple[Param, ...] = (("src", POINTER), ("dst", POINTER), ("lines", INT32),
                                   ("length", INT32), ("ld", INT64), ("src_line", INT64),
                                   ("src_pos", INT64))
STAGE_THREADS = 256
MAX_GRID_Y = 65535
#: (device, stream, operand) -> the buffers held for it, the one in use last
_ARENAS: dict[tuple, list] = {}
#: (device, entry point) -> the copy kernel loaded there
_FUNCTIONS: dict[tuple[int, str], driver.Function] = {}
#: (device, element size, source strides, staged layout) -> the copy's prepared launch
_LAUNCHES: dict[tuple, driver.Launch] = {}
_LOCK = threading.Lock()


def is_staged(config: Config | None) -> bool:
    return config is not None and bool(config.get("staged"))


def wrap(config: Config, kmajor: bool = False) -> Config:
    """The staged config running ``config`` (a config of the staged problem; ``kmajor``: of
    the K-major staged problem)."""
    flags = {"staged": True, **({"kmajor": True} if kmajor else {})}
    return Config.of(PREFIX + config.name, **flags, **dict(config.params))


def inner(config: Config) -> Config:
    """The config of the staged problem that staged config ``config`` runs."""
    params = {k: v for k, v in config.params if k not in ("staged", "kmajor")}
    return Config.of(config.name.removeprefix(PREFIX), **params)


def is_kmajor(config: Config) -> bool:
    """Whether staged config ``config`` runs on the K-major staged problem."""
    return bool(config.get("kmajor"))


def _round_up(n: int) -> int:
    return -(-max(n, 1) // PAD) * PAD


def _staged_operand(op: Operand, layout: str | None = None) -> Operand:
    """Where an operand lies once staged: in ``layout`` ("row" or "col"; None: its own
    orientation, a strided one row-major), lines every PAD elements; itself when it already
    lies so on the grid."""
    if op.rows_aligned and layout in (None, op.layout):
        return op
    layout = layout or ("col" if op.layout == "col" else "row")
    lines, length = (op.cols, op.rows) if layout == "col" else (op.rows, op.cols)
    ld = _round_up(length)
    strides = (ld, 1) if layout == "row" else (1, ld)
    return replace(op, layout=layout, ld=ld, strides=strides,
                   batch_stride=lines * ld if op.batch_stride else 0, align=256)


def staged_problem(problem: Problem, kmajor: bool = False) -> Problem:
    """The problem the backend's kernel sees once A and B are staged (``kmajor``: A
    row-major and B column-major; the same object for the same problem)."""
    key = (problem, kmajor)
    found = _STAGED.get(key)
    if found is None:
        a_layout, b_layout = ("row", "col") if kmajor else (None, None)
        found = interned(problem.with_(a=_staged_operand(problem.a, a_layout),
                                       b=_staged_operand(problem.b, b_layout)))
        if len(_STAGED) >= _LIMIT:
            _STAGED.clear()
        _STAGED[key] = found
    return found


def unwrap(problem: Problem, config: Config) -> tuple[Problem, Config]:
    """(the problem, the config) a kernel is built for: the staged problem and the inner
    config for a staged config, else the arguments themselves."""
    if is_staged(config):
        return staged_problem(problem, is_kmajor(config)), inner(config)
    return problem, config


def offered(backend: Any, problem: Problem, limit: int = OFFERED, *, kmajor: bool = False,
            keep: Callable[[Config], bool] = lambda config: True) -> list[Config]:
    """``backend``'s staged configs for ``problem``: its first ``limit`` configs for the
    staged problem that ``keep`` keeps, wrapped; none where nothing would be copied (nothing
    misaligned, or with ``kmajor`` nothing misaligned or in the other orientation), operands
    are packed, or the backend refuses the staged problem."""
    if problem.op != "matmul" or problem.packed:
        return []
    staged = staged_problem(problem, kmajor)
    if staged == problem or backend.supports(staged) is not None:
        return []
    return [wrap(c, kmajor) for c in backend.configs(staged)
            if c.name != "autotune" and not is_staged(c) and keep(c)][:limit]


def copy_function(device: int, arch: str, itemsize: int,
                  transpose: bool = False) -> driver.Function:
    """The copy kernel (``transpose``: the transposing one) for elements of ``itemsize``
    bytes, compiled for ``arch`` (cached on disk by :mod:`multibackend.gpu.nvrtc`) and loaded on
    ``device`` once per process."""
    name = (TRANSPOSE_KERNELS if transpose else STAGE_KERNELS)[itemsize]
    key = (device, name)
    found = _FUNCTIONS.get(key)
    if found is None:
        with _LOCK:
            found = _FUNCTIONS.get(key)
            if found is None:
                compiled = nvrtc.compile_cubin(source_path(STAGE_SOURCE), name, arch,
                                               [f"RW_ONLY={name}"])
                found = driver.load(compiled.path.read_bytes(), name, device)
                _FUNCTIONS[key] = found
    return found


def copy_launch(device: int, arch: str, strides: tuple[int, int], now: Operand, itemsize: int,
                dst: int = 0) -> driver.Launch:
    """The copy kernel's launch for a matrix of ``strides`` copied into the staged layout
    ``now`` at ``dst`` (0: written before each launch), its source pointer 0 (the same)."""
    values, grid, transpose = copy_plan(strides, now, itemsize)
    fn = copy_function(device, arch, itemsize, transpose)
    args = driver.Arguments(fn.name, STAGE_PARAMS, {"src": 0, "dst": dst, **values})
    return driver.Launch(fn, grid, (STAGE_THREADS, 1, 1), 0, args)


@functools.lru_cache(maxsize=None)
def torch_copies_why() -> str | None:
    """Why staging copies matrices with torch (at about half the copy kernel's bandwidth on
    an H100) instead of its kernel: the driver bindings or a CUDA compiler missing; None when
    the kernel is used."""
    try:
        driver.bindings()
        nvrtc.compiler_version()
    except (ImportError, CompileError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _kernel_copy(src: Any, dst: Any, now: Operand, stream: int) -> bool:
    """Queue the copy kernel copying the 2-D ``src`` into ``dst`` (laid out as ``now``) on
    ``stream``; False, with nothing queued, where it cannot (:func:`torch_copies_why`). The
    launch is prepared once per copy plan; a call writes its two pointers and launches."""
    if src.device.type != "cuda" or torch_copies_why() is not None:
        return False
    size = src.element_size()
    key = (src.device.index, size, src.stride(), now)
    with _LOCK:
        launch = _LAUNCHES.get(key)
    if launch is None:
        device = src.device.index
        launch = copy_launch(device, nvrtc.arch(device), src.stride(), now, size)
    with _LOCK:  # the pointers written and launched together (the driver copies them)
        if len(_LAUNCHES) >= _LIMIT:
            _LAUNCHES.clear()
        _LAUNCHES[key] = launch
        launch.args.values.src = src.data_ptr()
        launch.args.values.dst = dst.data_ptr()
        launch.launch(stream)
    return True


def _copy(src: Any, was: Operand, now: Operand, stream: int) -> Any:
    """``src`` (a 2-D matrix, or a 3-D batch whose entries lie as ``was`` says: batch
    stride 0 for one matrix broadcast over the batch) copied on ``stream`` into a fresh
    buffer laid out as ``now``, in the same shape: by the copy kernel for a matrix, by torch
    for a batch."""
    import torch

    broadcast = src.dim() == 3 and not was.batch_stride
    entries = src.shape[0] if src.dim() == 3 and not broadcast else 1
    lines = now.cols if now.layout == "col" else now.rows
    flat = torch.empty(entries * lines * now.ld, dtype=src.dtype, device=src.device)
    if src.dim() == 2:
        dst = flat.as_strided((now.rows, now.cols), now.strides)
        if not _kernel_copy(src, dst, now, stream):
            dst.copy_(src)
        return dst
    dst = flat.as_strided((entries, now.rows, now.cols), (lines * now.ld, *now.strides))
    dst.copy_(src[:1] if broadcast else src)
    if broadcast:
        return flat.as_strided(tuple(src.shape), (0, *now.strides))
    return dst


def stage(problem: Problem, staged: Problem, ops: Operands) -> Operands:
    """``ops`` with each misaligned A or B replaced by its staged copy (queued on the
    current stream, which the caller has made the call's)."""
    a = ops.a if staged.a == problem.a else _copy(ops.a, problem.a, staged.a, ops.stream)
    b = ops.b if staged.b == problem.b else _copy(ops.b, problem.b, staged.b, ops.stream)
    return replace(ops, a=a, b=b)


def run(problem: Problem, ops: Operands, config: Config,
        launch: Callable[[Problem, Operands, Config], None]) -> None:
    """Stage ``ops`` for the staged config ``config`` and ``launch`` the inner config on
    the copies."""
    staged = staged_problem(problem, is_kmajor(config))
    launch(staged, stage(problem, staged, ops), inner(config))


def copy_plan(strides: tuple[int, int], now: Operand, itemsize: int
              ) -> tuple[dict[str, int], tuple[int, int, int], bool]:
    """The copy kernel's integer arguments and grid for a matrix of ``strides`` (elements of
    ``itemsize`` bytes) copied into the staged layout ``now`` (a line is a row of a
    row-major copy, a column of a column-major one), and whether the transposing copy runs
    it (a source whose lines are its contiguous direction)."""
    if now.layout == "col":
        lines, length, src_line, src_pos = now.cols, now.rows, strides[1], strides[0]
    else:
        lines, length, src_line, src_pos = now.rows, now.cols, strides[0], strides[1]
    values = {"lines": lines, "length": length, "ld": now.ld, "src_line": src_line,
              "src_pos": src_pos}
    if src_line == 1 and src_pos != 1:
        tiles = -(-lines // TRANSPOSE_TILE)
        return values, (-(-length // TRANSPOSE_TILE), min(tiles, MAX_GRID_Y), 1), True
    per_block = STAGE_THREADS * 16 // itemsize
    return values, (-(-length // per_block), min(lines, MAX_GRID_Y), 1), False


def arena(like: Any, stream: int, role: str, nbytes: int) -> Any:
    """The byte buffer (a torch tensor on ``like``'s device) holding at least ``nbytes`` that
    the repeated staged calls on ``stream`` copy operand ``role`` ("a" or "b") into, or
    (``role`` "splitk") that raw WMMA's split-K plans of the compiled front on ``stream``
    write their partials to."""
    import torch

    key = (like.device, stream, role)
    with _LOCK:
        held = _ARENAS.setdefault(key, [])
        if not held or held[-1].numel() < nbytes:
            size = 1 << max(8, (nbytes - 1).bit_length())
            held.append(torch.empty(size, dtype=torch.uint8, device=like.device))
        return held[-1]


def native_copies(problem: Problem, ops: Operands, kmajor: bool = False
                  ) -> tuple[tuple, Operands, dict[str, int]] | None:
    """What a repeated call of a staged config launches before its kernel, for the compiled
    front: one copy step per misaligned A or B (:func:`copy_function`; the caller's pointer
    written per call, the copy into its
    :func:`arena` on the call's stream, to which the step is pinned), the operands with the
    copies in their place (to bind the kernel on), and each copy's address by the kernel
    parameter it goes to ("a", "b"). None for a batch. ``kmajor``: for a K-major staged
    config."""
    staged = staged_problem(problem, kmajor)
    steps, copies, fixed = [], {}, {}
    for role, source in (("a", native.A), ("b", native.B)):
        src, now = getattr(ops, role), getattr(staged, role)
        if now == getattr(problem, role):
            continue
        if src.dim() != 2:
            return None
        size = src.element_size()
        lines = now.cols if now.layout == "col" else now.rows
        buf = arena(src, ops.stream, role, lines * now.ld * size)
        device = problem.device_index
        launch = copy_launch(device, nvrtc.arch(device, problem.cc), src.stride(), now, size,
                             buf.data_ptr())
        steps.append(native.launch_step(launch, {"src": source}, stream=ops.stream))
        copies[role] = buf.view(src.dtype).as_strided((now.rows, now.cols), now.strides)
        fixed[role] = buf.data_ptr()
    return tuple(steps), replace(ops, **copies), fixed
