"""Which CUTLASS kernels can run a Problem, and their C++ source, from nvidia-cutlass's generator.

``cutlass_library`` knows which CUTLASS kernels exist: its ``GenerateSM90_*``/``GenerateSM80_*``
functions stamp out every tile shape, cluster shape, schedule and alignment NVIDIA builds, and its
emitters write each one's C++. This module runs those functions for an explicit architecture
(no GPU and no cuda-python needed), keeps the kernels that fit a Problem, and wraps the emitted
instance in a small launcher of ours (:mod:`multibackend.backends.cutlass.launcher`) exposing
``extern "C" int mb_gemm_<tag>(...)``.

Every kernel computes the transposed product: CUTLASS's generator writes C column-major, and a
row-major ``D = A @ B`` (M x N) is the column-major ``D^T = B^T @ A^T`` (N x M). So the kernel's
A is our B^T, its B is our A^T, its M is our N. Config names and tile shapes are given in the
caller's terms (rows of D, columns of D, K).

Families, best first: on sm_90 the 3.x TMA warp-specialized kernels (16-byte aligned operands),
then the 3.x cp.async warp-specialized kernels (smaller alignment), then the 2.x tensor-op
kernels (sm_80 multistage, sm_75 pipelined for 1-element f16, SIMT for f32 "ieee"). The 3.x
kernels come with the persistent tile scheduler and, for the cooperative schedule, also with
the stream-K one (``_streamk``); the launcher passes the scheduler's CTA swizzle, raster order,
decomposition mode (heuristic, data-parallel, split-K with its split count, stream-K) and SM
count at run time, so those need no build of their own.

The launcher never allocates: ``mb_workspace_size`` tells the caller how many bytes of device
workspace a (sizes, settings) array needs (host arithmetic, no GPU), the caller allocates it
once and writes its address into the array, and every launch's ``initialize`` clears the part
CUTLASS needs zeroed (the barriers of the split tiles) with a memset on the call's stream.

Determinism: the stream-K scheduler (``PersistentTileSchedulerSm90StreamK``) assigns work
statically, from the problem, tile, cluster, settings and SM count alone, and its reduction
runs in ``ReductionMode::Deterministic``: each split of a tile waits on a barrier for the splits
before it along K and adds its partial sum in that order. So a stream-K or split-K result is
the same bit for bit on every run of one problem with one config on GPUs of one SM count. It
may differ in the low bits from the data-parallel kernel's (another summation order over K)
and between GPUs of different SM counts (another division of K among the CTAs).
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

from multibackend.backends.cutlass import launcher
from multibackend.core import dtypes
from multibackend.core.problem import Operand, Problem, folded_batch

CUDA_VERSION = "13.0"  # what the generator is told: enables every kernel it knows
#: sm90_shapes.SM90_CLUSTER_SIZES level: 3 adds 2x2x1, 4x1x1 and 1x4x1 to 1x2x1, 2x1x1, 1x1x1
CLUSTER_LEVEL = 3

#: our dtype name -> cutlass_library DataType name
_ELEMENT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
            "int8": "s8", "uint8": "u8", "int32": "s32", "float8_e4m3fn": "e4m3",
            "float8_e5m2": "e5m2"}

#: generator functions per architecture family, in order of preference
_GEN_3X_TMA = {"f16": "GenerateSM90_TensorOp_16b_WGMMA_gemm",
               "bf16": "GenerateSM90_TensorOp_16b_WGMMA_gemm",
               "tf32": "GenerateSM90_TensorOp_tf32_WGMMA_gemm",
               "s8": "GenerateSM90_TensorOp_int8_WGMMA_gemm",
               "u8": "GenerateSM90_TensorOp_int8_WGMMA_gemm",
               "e4m3": "GenerateSM90_TensorOp_fp8_WGMMA_gemm",
               "e5m2": "GenerateSM90_TensorOp_fp8_WGMMA_gemm"}
_GEN_3X_CPASYNC = {"f16": "GenerateSM90_TensorOp_16b_WGMMA_alignx_gemm",
                   "bf16": "GenerateSM90_TensorOp_16b_WGMMA_alignx_gemm",
                   "tf32": "GenerateSM90_TensorOp_tf32_WGMMA_alignx_gemm",
                   "s8": "GenerateSM90_TensorOp_int8_WGMMA_alignx_gemm",
                   "u8": "GenerateSM90_TensorOp_int8_WGMMA_alignx_gemm",
                   "e4m3": "GenerateSM90_TensorOp_fp8_WGMMA_alignx_gemm",
                   "e5m2": "GenerateSM90_TensorOp_fp8_WGMMA_alignx_gemm"}
_GEN_2X = {"f16": ("GenerateSM80_TensorOp_16816", "GenerateSM75_TensorOp_1688"),
           "bf16": ("GenerateSM80_TensorOp_16816",),
           "tf32": ("GenerateSM80_TensorOp_1688",),
           "tf32x3": ("GenerateSM80_TensorOp_1688_fast_fp32_math",),
           "ieee": ("GenerateSM80_Simt_f32",),
           "f64": ("GenerateSM90_TensorOp_1684", "GenerateSM80_TensorOp_884"),
           "s8": ("GenerateSM80_TensorOp_16832_TN",),
           "u8": ("GenerateSM80_TensorOp_16832_TN",)}

#: kernels made by retyping another type's generator kernels: key -> (function, source type)
_RETYPED = {"bf16": ("GenerateSM75_TensorOp_1688", "f16")}

#: 3.x kernel schedule -> our short name, in order of preference for large problems
SCHEDULES_3X = {"TmaWarpSpecializedCooperative": "cooperative",
                "TmaWarpSpecializedPingpong": "pingpong",
                "TmaWarpSpecialized": "warpspecialized",
                "CpAsyncWarpSpecializedCooperative": "cpasync_cooperative",
                "CpAsyncWarpSpecialized": "cpasync"}
#: 3.x tile schedulers -> the suffix of their kernels' names ("" for the persistent one)
SCHEDULERS_3X = {"Default": "", "StreamK": "_streamk"}
_EPILOGUES_3X = {"TmaWarpSpecializedCooperative": "tma", "TmaWarpSpecialized": "tma",
                 "NoSmemWarpSpecialized": "nosmem", "EpilogueTransposed": "transposed"}


#: 3.x tiles (the kernel's M x N x K) made from a default tile of a generator function by
#: narrowing WGMMA's N, in its 16-bit TMA kernels. 128 x 192 is 192 rows of D by 128
#: columns: 1536 rows are eight such tiles, so a 1536^3 product has 96 of them (one wave on
#: 132 SMs) where 128x256 tiles leave 72 and 128x128 tiles 144 (f16, graph, H100: 0.82x
#: torch.matmul against 0.69x; 3000^3 0.89x against 0.85x). 64 x 128 (128 rows of D by 64
#: columns, ping-pong: one warpgroup per tile) and 128 x 64 (64 rows by 128 columns,
#: cooperative) give few-tile products twice the tiles of 128 x 128, and in a two-CTA
#: cluster one operand's tile is multicast to both (f16 / bf16, graph, H100: 1000^3 at
#: 0.96x / 0.94x torch.matmul in 128 x 64 cooperative tiles of a two-CTA cluster, where
#: CUTLASS's 128 x 128 tile ran 0.87x / 0.85x and Triton's best 0.91x / 0.90x;
#: 256x4096x14336 at 1.02x / 1.01x in 64 x 128 ping-pong tiles, against 0.98x / 0.97x).
#: The generator stamps 128 x 192 and 128 x 64 kernels only at its level of every WGMMA
#: shape (some 130,000 operations, seconds to make), 64 x 128 ones only unpruned as well;
#: its kernels with the tile changed are the same kernels (names and instance source),
#: since CUTLASS's collective builder picks the WGMMA atom from the tile.
NARROWED_TILES = {"GenerateSM90_TensorOp_16b_WGMMA_gemm": {(128, 256, 64): (128, 192, 64),
                                                         (64, 256, 64): (64, 128, 64),
                                                         (128, 128, 64): (128, 64, 64)}}
#: narrowed tiles made with the persistent tile scheduler only: their stream-K kernels, never
#: measured, would pad a skinny product least and so displace the stream-K kernel it is offered
PERSISTENT_ONLY = ((64, 128, 64), (128, 64, 64))


class Collector:
    """Stands in for cutlass_library's Manifest: the generator functions append their
    operations here. A non-empty kernel filter makes them stamp out every tile and alignment."""

    kernel_filter = "multibackend"
    selected_kernels: list = []

    def __init__(self, cc: int):
        self.compute_capabilities_baseline = [cc]
        self.compute_capabilities_feature_set = [f"{cc}a" if cc >= 90 else str(cc)]
        self.operations: list = []

    def get_instantiation_level(self, pruned_level: int = 0, default_level: int = 111,
                                exhaustive_level: int = 9992) -> int:
        """The generator's default level, with cluster shapes widened to include 1x1x1."""
        cluster_digit = default_level // 100 % 10
        return default_level + 100 * max(0, CLUSTER_LEVEL - cluster_digit)

    def append(self, operation) -> None:
        self.operations.append(operation)


@functools.lru_cache(maxsize=None)
def generated(function: str, cc: int) -> tuple:
    """Every GEMM operation one generator function stamps out for compute capability ``cc``,
    and its :data:`NARROWED_TILES`."""
    from cutlass_library import generator
    from cutlass_library.library import GemmKind

    collector = Collector(cc)
    getattr(generator, function)(collector, CUDA_VERSION)
    found = tuple(op for op in collector.operations
                  if getattr(op, "gemm_kind", None) in (GemmKind.Universal, GemmKind.Universal3x))
    return found + _narrowed(found, NARROWED_TILES.get(function, {}))


def _narrowed(ops: tuple, tiles: dict) -> tuple:
    """Copies of the ``ops`` whose tile is a key of ``tiles``, with the tile it maps to (those
    of the stream-K scheduler left out for :data:`PERSISTENT_ONLY` tiles)."""
    from cutlass_library.library import TileDescription

    made = []
    for op in ops:
        old = op.tile_description
        tile = tiles.get(tuple(old.threadblock_shape))
        if tile is None or (tile in PERSISTENT_ONLY and op.tile_scheduler.name != "Default"):
            continue
        narrow = copy.copy(op)
        narrow.tile_description = TileDescription(
            list(tile), old.stages, old.warp_count, old.math_instruction,
            old.minimum_compute_capability, old.maximum_compute_capability, old.cluster_shape,
            old.explicit_vector_sizes)
        made.append(narrow)
    return tuple(made)


@functools.lru_cache(maxsize=None)
def retyped(function: str, cc: int, key: str) -> tuple:
    """A generator's operations with their 16-bit operands changed to ``key``'s type.

    The generator stamps out 1-element-aligned 16-bit kernels only for f16 (sm_75's pipelined
    mma.sync m16n8k8 kernels, which load with plain loads; the sm_80 multistage kernels need
    cp.async's 4-byte minimum). The same 16x8x8 instruction exists for bf16 on sm_80+, so
    bf16 at 1-element alignment is those kernels retyped."""
    from cutlass_library.library import DataType

    source, target = getattr(DataType, _RETYPED[key][1]), getattr(DataType, key)
    found = []
    for op in generated(function, cc):
        if op.A.element != source or op.accumulator_type() != DataType.f32:
            continue
        op = copy.deepcopy(op)
        for tensor in (op.A, op.B, op.C, op.D):
            if tensor.element == source:
                tensor.element = target
        math = op.tile_description.math_instruction
        math.element_a = math.element_b = target
        op.__dict__.pop("_procedural_name", None)  # a cached property: name it anew
        found.append(op)
    return tuple(found)


def element_key(problem: Problem) -> str:
    """The generator's name for the problem's operand type ("tf32"/"tf32x3"/"ieee" for f32)."""
    if problem.in_dtype == "float32":
        return {"tf32": "tf32", "tf32x3": "tf32x3"}.get(problem.precision or "ieee", "ieee")
    return _ELEMENT.get(problem.in_dtype, problem.in_dtype)


def operand_alignment(operand: Operand, batch: int) -> int:
    """The most elements (16 bytes' worth at most) one vector access may move for this operand:
    its pointer, leading dimension and batch stride must all be multiples of it, and so must
    its extent along the contiguous direction (K of a row-major A): CUTLASS's
    ``can_implement`` checks the shape as well as the strides, and refuses at run time a
    kernel whose alignment does not divide it (a 7x11008x4095 product whose rows were copied
    onto the 16-byte grid)."""
    size = max(1, int(dtypes.get(operand.dtype).itemsize))
    extent = operand.rows if operand.layout == "col" else operand.cols
    align = 16 // size
    while align > 1:
        stride_ok = batch <= 1 or operand.batch_stride % align == 0
        if (operand.align % (align * size) == 0 and operand.ld % align == 0 and stride_ok
                and extent % align == 0):
            return align
        align //= 2
    return 1


def output_alignment(problem: Problem) -> int:
    """Alignment (elements) of D, row-major contiguous (batch, M, N), and of C when it takes
    part: what D's pointer, N and the batch stride allow (checked again at launch)."""
    size = max(1, int(dtypes.get(problem.d_dtype).itemsize))
    align = max(1, problem.d_align // size)
    while align > 1 and (problem.n % align or (problem.batch > 1 and problem.m * problem.n % align)):
        align //= 2
    if problem.has_c and problem.c is not None:
        align = min(align, operand_alignment(problem.c, problem.batch))
    return align


@dataclass(frozen=True, eq=False)
class Candidate:
    """One CUTLASS kernel that can run a family of Problems: the generator's operation with
    alignments set for the problem, where it comes from and how it is named as a Config.
    Compared by identity: two operations of one name may differ in their C alignment."""

    name: str
    params: tuple
    operation: object
    family: str  # "3x_tma", "3x_cpasync", "2x" or "2x_retyped"
    arch: str  # nvcc target, e.g. "90a" or "80"

    @property
    def is_3x(self) -> bool:
        return self.family.startswith("3x")

    @property
    def element_compute(self) -> str:
        from cutlass_library.library import DataTypeTag

        return DataTypeTag[self.operation.element_epilogue]

    @property
    def integer_epilogue(self) -> bool:
        from cutlass_library.library import DataTypeNames

        return DataTypeNames[self.operation.element_epilogue][0] in "su"


def _layout(name: str):
    from cutlass_library.library import LayoutType

    # our operand X becomes the kernel's X^T: row-major <-> column-major
    return {"row": LayoutType.ColumnMajor, "col": LayoutType.RowMajor}[name]


def _matches_types(op, key: str, d_dtype: str, acc_dtype: str) -> bool:
    from cutlass_library.library import DataTypeNames, MathOperation, OpcodeClass

    a, b = DataTypeNames[op.A.element], DataTypeNames[op.B.element]
    c, d = DataTypeNames[op.C.element], DataTypeNames[op.D.element]
    acc = DataTypeNames[op.accumulator_type()]
    math = op.tile_description.math_instruction
    wanted = {"tf32": ("f32", "tf32"), "tf32x3": ("f32",), "ieee": ("f32",)}.get(key, (key,))
    if a not in wanted or b != a:
        return False
    if key == "tf32x3" and math.math_operation != MathOperation.multiply_add_fast_f32:
        return False
    if key == "ieee" and math.opcode_class != OpcodeClass.Simt:
        return False
    if math.math_operation == MathOperation.multiply_add_fast_accum:
        return False
    out = _ELEMENT.get(d_dtype)
    return d == out and c == out and acc == _ELEMENT.get(acc_dtype)


def _schedule_names(op) -> tuple[str, str, str] | None:
    """(schedule, epilogue, scheduler) short names of a 3.x operation, None for kernels not
    taken (mixed input, grouped or unknown schedules). The stream-K tile scheduler is taken
    for the TMA cooperative kernels only."""
    if op.mixed_input_mode is not None:
        return None
    schedule = SCHEDULES_3X.get(op.kernel_schedule.name)
    epilogue = _EPILOGUES_3X.get(op.epilogue_schedule.name)
    scheduler = op.tile_scheduler.name
    if schedule is None or epilogue is None or scheduler not in SCHEDULERS_3X:
        return None
    if scheduler == "StreamK" and schedule != "cooperative":
        return None
    return schedule, epilogue, "streamk" if scheduler == "StreamK" else "persistent"


def _candidate(op, family: str, cc: tuple[int, int], out_align: int) -> Candidate | None:
    from cutlass_library.library import DataTypeSize

    tile = op.tile_description.threadblock_shape
    if family.startswith("2x"):
        if op.arch > cc[0] * 10 + cc[1]:
            return None
        op = copy.deepcopy(op)
        op.C.alignment = op.D.alignment = min(op.C.alignment, out_align)
        stages = op.tile_description.stages
        kind = "simt" if "simt" in op.procedural_name() else f"sm{op.arch}"
        name = f"{tile[1]}x{tile[0]}x{tile[2]}_s{stages}_{kind}"
        params = dict(tile=(tile[1], tile[0], tile[2]), stages=stages, schedule=kind,
                      family=family)
        arch = f"{cc[0]}{cc[1]}"
    else:
        names = _schedule_names(op)
        if names is None:
            return None
        schedule, epilogue, scheduler = names
        if epilogue == "tma" and out_align * DataTypeSize[op.D.element] < 128:
            return None
        cluster = op.tile_description.cluster_shape
        name = (f"{tile[1]}x{tile[0]}x{tile[2]}_{cluster[1]}x{cluster[0]}x{cluster[2]}_"
                f"{schedule}_{epilogue}{SCHEDULERS_3X[op.tile_scheduler.name]}")
        params = dict(tile=(tile[1], tile[0], tile[2]),
                      cluster=(cluster[1], cluster[0], cluster[2]),
                      schedule=schedule, epilogue=epilogue, scheduler=scheduler, family=family)
        arch = "90a"
    return Candidate(name, tuple(sorted(params.items())), op, family, arch)


def _rank_3x(c: Candidate) -> tuple:
    """Largest tile first (up to 128x256), TMA epilogue, cooperative, the persistent scheduler
    before stream-K, 2-CTA clusters, then 1, then 4; among 2-CTA clusters a 128x256 tile (rows
    x columns of D) in a 2x1x1 cluster first: the 256x256 footprint a cluster multicasts over
    measured best for large f16/bf16 squares on H200."""
    p = dict(c.params)
    tile, cluster = p["tile"], p["cluster"]
    area = tile[0] * tile[1]
    schedules = list(SCHEDULES_3X.values())
    wide = tile[1] >= tile[0]
    return (-min(area, 128 * 256), area, p["epilogue"] != "tma", schedules.index(p["schedule"]),
            p["scheduler"] != "persistent", {2: 0, 1: 1}.get(cluster[0] * cluster[1], 2),
            (cluster[0] != 2) if wide else (cluster[1] != 2), not wide, tile[2],
            cluster[0] * cluster[1] * cluster[2], cluster[0] < cluster[1])


def _families(key: str, cc: tuple[int, int]) -> list[tuple[str, tuple[str, ...]]]:
    found = []
    if cc >= (9, 0) and key in _GEN_3X_TMA:
        found.append(("3x_tma", (_GEN_3X_TMA[key],)))
        found.append(("3x_cpasync", (_GEN_3X_CPASYNC[key],)))
    if key in _GEN_2X:
        found.append(("2x", _GEN_2X[key]))
    if key in _RETYPED:
        found.append(("2x_retyped", (_RETYPED[key][0],)))
    return found


def candidates(problem: Problem) -> list[Candidate]:
    """The kernels that can run ``problem``, best family first, the default first; empty when
    none fits (see :func:`why_none`)."""
    if problem.op != "matmul" or problem.a.layout not in ("row", "col") \
            or problem.b.layout not in ("row", "col"):
        return []
    return list(_candidates(
        element_key(problem), problem.d_dtype, problem.acc, problem.a.layout, problem.b.layout,
        operand_alignment(problem.b, problem.batch), operand_alignment(problem.a, problem.batch),
        output_alignment(problem), problem.cc or (9, 0)))


@functools.lru_cache(maxsize=1024)
def _candidates(key: str, d_dtype: str, acc: str, a_layout: str, b_layout: str, avail_a: int,
                avail_b: int, out_align: int, cc: tuple[int, int]) -> tuple[Candidate, ...]:
    """Candidates in the kernel's terms: its A is our B^T (alignment ``avail_a``), its B our A^T."""
    layout_a, layout_b = _layout(b_layout), _layout(a_layout)
    for family, functions in _families(key, cc):
        chosen: dict[str, Candidate] = {}
        for function in functions:
            arch = cc[0] * 10 + cc[1] if family.startswith("2x") else 90
            ops = retyped(function, arch, key) if family == "2x_retyped" else \
                generated(function, arch)
            for op in ops:
                if op.A.layout != layout_a or op.B.layout != layout_b:
                    continue
                if op.A.alignment > avail_a or op.B.alignment > avail_b:
                    continue
                if not _matches_types(op, key, d_dtype, acc):
                    continue
                cand = _candidate(op, family, cc, out_align)
                if cand is None:
                    continue
                best = chosen.get(cand.name)
                if best is None or (op.A.alignment, op.B.alignment) > (
                        best.operation.A.alignment, best.operation.B.alignment):
                    chosen[cand.name] = cand
        if chosen:
            found = list(chosen.values())
            if not family.startswith("2x"):
                found.sort(key=_rank_3x)
            return tuple(found)
    return ()


def why_none(problem: Problem) -> str:
    """Words for why :func:`candidates` is empty."""
    key = element_key(problem)
    cc = problem.cc or (9, 0)
    if not _families(key, cc):
        return f"the generator has no GEMM kernels for {key} on sm_{cc[0]}{cc[1]}"
    align_a = operand_alignment(problem.a, problem.batch)
    align_b = operand_alignment(problem.b, problem.batch)
    return (f"no {key} kernel from the generator takes A {problem.a.layout}-major at "
            f"{align_a}-element alignment and B {problem.b.layout}-major at {align_b}-element "
            f"alignment, accumulating in {problem.acc} and writing {problem.d_dtype} "
            f"(at {output_alignment(problem)}-element alignment)")


def emit(candidate: Candidate) -> str:
    """The complete .cu source of ``candidate``: CUTLASS's emitted instance and our launcher
    (:mod:`multibackend.backends.cutlass.launcher`)."""
    from cutlass_library.gemm_operation import (
        EmitGemmUniversal3xInstance,
        EmitGemmUniversalInstance,
    )
    from cutlass_library.library import DataTypeTag

    op = candidate.operation
    emitter = EmitGemmUniversal3xInstance() if candidate.is_3x else EmitGemmUniversalInstance()
    types = "\n".join(f"using MbElement{x} = {DataTypeTag[getattr(op, x).element]};"
                      for x in "ABCD")
    return launcher.source(candidate.is_3x, list(emitter.includes), emitter.emit(op),
                           op.procedural_name(), candidate.element_compute, types,
                           launcher.stride_3x("a", op.A.layout),
                           launcher.stride_3x("b", op.B.layout))


def kernel_args(problem: Problem) -> tuple[int, ...]:
    """The launcher's sizes and strides for ``problem`` (the kernel's transposed view):
    (m, n, k, batch, lda, ldb, ldc, ldd, sa, sb, sc, sd), in elements; ``mb_gemm`` and
    ``mb_workspace_size`` take them, then the launcher's
    :data:`~multibackend.backends.cutlass.launcher.SETTINGS`, as one array. A batch over a
    broadcast B that :func:`~multibackend.core.problem.folded_batch` makes one product is given
    as that product (the launcher would otherwise run one launch per entry)."""
    problem = folded_batch(problem) or problem
    m, n = problem.n, problem.m
    ldd = max(problem.n, 1)
    sd = problem.m * problem.n if problem.batch > 1 else 0
    if problem.has_c and problem.c is not None:
        ldc, sc = problem.c.ld, problem.c.batch_stride if problem.batch > 1 else 0
    else:
        ldc, sc = ldd, sd
    sa = problem.b.batch_stride if problem.batch > 1 else 0
    sb = problem.a.batch_stride if problem.batch > 1 else 0
    return (m, n, problem.k, problem.batch, problem.b.ld, problem.a.ld, ldc, ldd,
            sa, sb, sc, sd)
