"""The CUTLASS backend: kernels emitted by nvidia-cutlass's generator, compiled by us, launched
through a thin C launcher with ctypes.

``multibackend.backends.cutlass.emit`` picks the CUTLASS kernels that fit a Problem and writes
their source; ``multibackend.backends.cutlass.build`` compiles, caches and loads them. This module
holds the capability table, turns kernels into Configs, and launches: per call it reads four
pointers, the scalars and the stream, and makes one ctypes call (everything else is computed once
per (problem, config)). The stock ``cutlass_cppgen`` runtime is not used: it needs cuda-python's
removed ``cuda.cuda`` modules, writes into the working directory and costs milliseconds a call.

Stream-K and split-K: a data-parallel tile scheduler gives each output tile to one CTA, so a
problem of fewer tiles than SMs (a decode-sized product, M of a few rows; a cube of 1000-2048)
leaves SMs idle. For 16-bit products that are skinny or have few tiles, :func:`stream_k_configs`
offers the cooperative TMA kernel built with CUTLASS's stream-K scheduler (``..._streamk``: CUTLASS
picks data-parallel, split-K or stream-K for the SM count), the same binary forced into split-K
(``..._splitk{S}``) and, where CUTLASS's heuristic would stay data-parallel, into stream-K
(``..._streamk_forced``). Their reduction is deterministic: see
:mod:`multibackend.backends.cutlass.emit`. The workspace they need is sized when a (problem,
config) is prepared and allocated at its first launch on each stream, never per call.

Choosing per shape: the default kernel (128x256 tiles for 16-bit types) is the best for large
products and builds alone. For 16-bit products the "autotune" config, offered right after it,
times a shortlist (:func:`autotune_shortlist`: the default, 256x128, 128x128 and 192x128
persistent tiles, the 128x128 ping-pong kernel, where the default leaves SMs idle 64x128 and
128x64 tiles in two-CTA clusters, two stream-K kernels forced into stream-K, and split-K) on
its first call for a shape, and runs the fastest from then on. Its first call on a machine
builds seven kernels, or nine (in parallel nvcc processes, then cached), which is why it is
not the default.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

from multibackend.backends.base import AutotunePicks, Backend
from multibackend.backends.cutlass import build as cutlass_build
from multibackend.backends.cutlass import emit as cutlass_emit
from multibackend.backends.cutlass import launcher
from multibackend.backends.cutlass.records import (
    DECOMPOSITIONS,
    RASTERS,
    KernelConfig,
    kernel_config,
)
from multibackend.core import dtypes
from multibackend.core.capability import Capability, DtypeRule, Reason, layout_words
from multibackend.core.config import Config, Operands
from multibackend.core.errors import InvalidArgument, KernelRefused
from multibackend.core.problem import Problem
from multibackend.gpu import driver, native, staging, toolchain

NAME = "cutlass"
LAYOUTS = ("row", "col")
TN = "A row-major and B column-major"
K_MAJOR_ONLY = ("int8", "uint8", "float8_e4m3fn", "float8_e5m2")

RULES = (
    DtypeRule("float16", accs=("float32", "float16"), outs=("float16", "float32"),
              min_cc=(7, 5), a_layouts=LAYOUTS, b_layouts=LAYOUTS,
              note="sm_90: 3.x TMA warp-specialized (sm_90a); 1-element alignment: 2.x sm_75"),
    DtypeRule("bfloat16", accs=("float32",), outs=("bfloat16", "float32"), min_cc=(8, 0),
              a_layouts=LAYOUTS, b_layouts=LAYOUTS,
              note="sm_90: 3.x TMA warp-specialized (sm_90a); 1-element alignment: sm_75-style "
                   "2.x kernels retyped to bf16 (sm_80+)"),
    DtypeRule("float32", accs=("float32",), outs=("float32",), min_cc=(8, 0),
              a_layouts=LAYOUTS, b_layouts=LAYOUTS, precisions=("tf32", "tf32x3", "ieee"),
              note="tf32: 3.x WGMMA on sm_90; tf32x3: 2.x 3xTF32; ieee: 2.x SIMT (slow)"),
    DtypeRule("float64", accs=("float64",), outs=("float64",), min_cc=(8, 0),
              a_layouts=LAYOUTS, b_layouts=LAYOUTS, note="2.x DMMA (sm_90: 16x8x4)"),
    DtypeRule("int8", accs=("int32",), outs=("int32",), min_cc=(8, 0), a_layouts=("row",),
              b_layouts=("col",), note="K-major only; K a multiple of 4 (sm_90) or 16"),
    DtypeRule("uint8", accs=("int32",), outs=("int32",), min_cc=(8, 0), a_layouts=("row",),
              b_layouts=("col",), note="K-major only; K a multiple of 4 (sm_90) or 16"),
    DtypeRule("float8_e4m3fn", accs=("float32",), outs=("float32", "float16", "bfloat16"),
              min_cc=(9, 0), a_layouts=("row",), b_layouts=("col",),
              note="3.x WGMMA, K-major only, K a multiple of 4"),
    DtypeRule("float8_e5m2", accs=("float32",), outs=("float32", "float16", "bfloat16"),
              min_cc=(9, 0), a_layouts=("row",), b_layouts=("col",),
              note="3.x WGMMA, K-major only, K a multiple of 4"),
)

#: dtypes the generator has kernels for that this backend does not take, and why
NOT_WIRED = {
    "int4": "the generator offers s4 x s4 -> s32 only as 2.x sm_80 TN kernels "
            "(GenerateSM80_TensorOp_16864_TN, 32-element alignment) and nothing for sm_90's "
            "WGMMA; not enabled here: the nibble order of multibackend's packed int4 is not "
            "checked against cutlass::int4b_t",
    "uint4": "the generator offers u4 x u4 -> s32 only as 2.x sm_80 TN kernels "
             "(GenerateSM80_TensorOp_16864_TN); not enabled here (nibble order unchecked)",
    "bit": "the generator offers b1 XOR/AND-popcount -> s32 only as 2.x sm_80 TN kernels "
           "(GenerateSM80_TensorOp_168256, 128-bit alignment); not enabled here: sm_90 has no "
           "native b1 MMA and the bit order of multibackend's packing is unchecked",
}


#: the most batch entries a 2.x kernel runs: one per grid z index (CUTLASS's
#: ``GemmUniversalBase::can_implement`` refuses more)
MAX_2X_BATCH = 65535


def _fits_generator(problem: Problem) -> tuple[str, str] | None:
    if problem.op != "matmul":
        return None
    if problem.has_c and problem.c is not None:
        if problem.c.layout != "row":
            broadcast = " (a bias broadcast over the rows, row stride 0, is one)" \
                if problem.c.strides[0] == 0 else ""
            return ("layout", f"C is {layout_words(problem.c.layout)}{broadcast}; C must be "
                              "row-major like D")
        if problem.c.dtype != problem.d_dtype:
            return ("output", f"C is {problem.c.dtype} but D is {problem.d_dtype}: "
                              "they must match")
    found = cutlass_emit.candidates(problem)
    if not found:
        return ("alignment", cutlass_emit.why_none(problem))
    if problem.batch > MAX_2X_BATCH and not found[0].is_3x:
        return ("batch", f"batch is {problem.batch}: the CUTLASS kernels that fit this problem "
                         f"are 2.x ones, whose grid takes at most {MAX_2X_BATCH} batch entries")
    return None


SWIZZLES = (2, 4, 8)  # CTA swizzles offered beside the default 1 (persistent 3.x kernels)
SWIZZLED_KERNELS = 4  # how many of the best 3.x TMA kernels get the scheduler variants
#: input types offered the stream-K kernels (where :func:`stream_k_fits`)
STREAM_K_TYPES = ("float16", "bfloat16")
#: SMs of the sm_90 parts the offer is planned for (H100 SXM, H200; an H100 PCIe has 114):
#: the launch itself plans for the device's own count
SM90_SMS = 132
#: a product is skinny when D has at most this many rows or columns
SKINNY = 256
#: CUTLASS's stream-K gives a CTA at least this many K tiles (min_iters_per_sk_unit_): a
#: problem of no more K tiles than this runs data-parallel whatever the decomposition
MIN_STREAM_K_ITERS = 8
#: split counts considered for split-K, and the fewest K tiles each split must get
SPLITS = (16, 8, 4, 2)
MIN_SPLIT_K_TILES = 4
SPLIT_K_CONFIGS = 2  # how many split counts are offered


def _config(candidate: cutlass_emit.Candidate, swizzle: int = 1, raster: str = "heuristic",
            decomposition: str = "heuristic", splits: int = 1) -> Config:
    """A Config running ``candidate`` with the tile scheduler's settings (runtime arguments
    of one compiled kernel, no extra build): its :class:`~.records.KernelConfig`'s."""
    return KernelConfig(candidate.name, candidate.params, swizzle, raster, decomposition,
                        splits).config()


def scheduler_variants(candidate: cutlass_emit.Candidate) -> list[Config]:
    """The runtime variants of one persistent 3.x kernel, its plain config excepted: wider CTA
    swizzles under the heuristic raster order, then each raster order forced at every swizzle.
    Empty for kernels without a persistent tile scheduler (2.x)."""
    if not candidate.is_3x:
        return []
    found = [_config(candidate, swizzle) for swizzle in SWIZZLES]
    found += [_config(candidate, swizzle, raster) for raster in ("m", "n")
              for swizzle in (1, *SWIZZLES)]
    return found


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _is_stream_k(candidate: cutlass_emit.Candidate) -> bool:
    return dict(candidate.params).get("scheduler") == "streamk"


def output_tiles(problem: Problem, candidate: cutlass_emit.Candidate) -> int:
    """How many output tiles of a 3.x ``candidate`` the grid covers for ``problem``: tiles
    along the rows and the columns of D, each rounded up to whole clusters (the scheduler
    launches those), times the batch."""
    params = dict(candidate.params)
    (rows, cols, _), (cluster_rows, cluster_cols, _) = params["tile"], params["cluster"]
    along_m = _ceil(_ceil(problem.m, rows), cluster_rows) * cluster_rows
    along_n = _ceil(_ceil(problem.n, cols), cluster_cols) * cluster_cols
    return along_m * along_n * max(problem.batch, 1)


def k_tiles(problem: Problem, candidate: cutlass_emit.Candidate) -> int:
    """How many K tiles of a 3.x ``candidate`` one output tile of ``problem`` takes."""
    return _ceil(problem.k, dict(candidate.params)["tile"][2])


def _tile_area(candidate: cutlass_emit.Candidate) -> int:
    rows, cols, _ = dict(candidate.params)["tile"]
    return rows * cols


def few_tiles(problem: Problem, default: cutlass_emit.Candidate) -> bool:
    """Whether a 16-bit ``problem`` whose default kernel is ``default`` (a 3.x one) leaves
    SMs idle in that kernel: fewer of its output tiles than SM90_SMS."""
    return (problem.in_dtype in STREAM_K_TYPES and default.is_3x
            and output_tiles(problem, default) < SM90_SMS)


def stream_k_fits(problem: Problem, default: cutlass_emit.Candidate) -> bool:
    """Whether a 16-bit ``problem`` whose default kernel is ``default`` (a 3.x one) is worth
    the stream-K kernels: skinny (D at most SKINNY rows or columns) or of :func:`few_tiles`,
    and with more K tiles than stream-K's minimum per CTA."""
    return (problem.in_dtype in STREAM_K_TYPES and default.is_3x
            and k_tiles(problem, default) > MIN_STREAM_K_ITERS
            and (min(problem.m, problem.n) <= SKINNY or few_tiles(problem, default)))


def split_counts(tiles: int, k_tile_count: int) -> list[int]:
    """The split-K counts offered for ``tiles`` output tiles of ``k_tile_count`` K tiles: the
    largest SPLIT_K_CONFIGS of SPLITS that keep tiles x splits within one wave of SM90_SMS
    CTAs and give every split at least MIN_SPLIT_K_TILES K tiles."""
    fit = [s for s in SPLITS
           if tiles * s <= SM90_SMS and k_tile_count >= s * MIN_SPLIT_K_TILES]
    return fit[:SPLIT_K_CONFIGS]


def stream_k_configs(problem: Problem,
                     found: list[cutlass_emit.Candidate] | None = None) -> list[Config]:
    """The stream-K configs offered for ``problem`` (its candidates ``found``, the default
    first), empty where :func:`stream_k_fits` does not hold. One kernel is built: of the
    stream-K TMA kernels, the one whose tiles and clusters pad ``problem`` least (the best
    ranked among equals). It is offered with CUTLASS's heuristic decomposition, in split-K
    mode with each of :func:`split_counts`, and forced into stream-K where its tiles fill
    half a wave or more (CUTLASS's heuristic keeps those data-parallel)."""
    found = cutlass_emit.candidates(problem) if found is None else found
    kernels = [c for c in found if c.family == "3x_tma" and _is_stream_k(c)]
    default = next((c for c in found if not _is_stream_k(c)), None)
    if not kernels or default is None or not stream_k_fits(problem, default):
        return []
    kernel = min(kernels, key=lambda c: output_tiles(problem, c) * _tile_area(c))
    tiles = output_tiles(problem, kernel)
    offered = [_config(kernel)]
    offered += [_config(kernel, decomposition="split_k", splits=s)
                for s in split_counts(tiles, k_tiles(problem, kernel))]
    if 2 * tiles >= SM90_SMS:
        offered.append(_config(kernel, decomposition="stream_k"))
    return offered


#: the config that times :func:`autotune_shortlist` on its first call and runs the fastest
AUTOTUNE = Config.of("autotune")
#: persistent kernels the "autotune" config times beside the default, in the caller's terms: the
#: 128x256 tile turned 256x128, the 128x128 tile cooperative and ping-pong (two warpgroups on two
#: tiles, one's epilogue under the other's mainloop), and 192x128 (see
#: :data:`multibackend.backends.cutlass.emit.NARROWED_TILES`). A 128x128 tile gives 2x more tiles
#: than 128x256, which fill a wave of SMs where the large tile leaves many idle (f16, graph, H100:
#: 512x4096x4096 at 0.97x torch.matmul against 0.67x for 128x256; 256x6144x4096 at 0.99x against
#: 0.76x)
AUTOTUNE_PERSISTENT = ("256x128x64_1x2x1_cooperative_tma", "128x128x64_1x1x1_cooperative_tma",
                       "128x128x64_1x1x1_pingpong_tma", "192x128x64_1x2x1_cooperative_tma")
#: kernels of half the 128x128 tile the "autotune" config also times where the default leaves
#: SMs idle (:func:`few_tiles`), each in a two-CTA cluster that multicasts one operand's tile
#: to both: 64 rows by 128 columns (cooperative) and 128 rows by 64 columns (ping-pong); see
#: :data:`multibackend.backends.cutlass.emit.NARROWED_TILES` for what they ran
AUTOTUNE_FEW_TILES = ("64x128x64_2x1x1_cooperative_tma", "128x64x64_2x1x1_pingpong_tma")
#: stream-K kernels the "autotune" config times forced into stream-K (where the problem has
#: more K tiles than stream-K's minimum), the last also in split-K at :func:`split_counts`:
#: 1.2 waves of 128x256 tiles (512x10240x8192) ran at 0.92x forced into stream-K against 0.69x
#: data-parallel; split in 2, 128x128 tiles ran 1024x1024x16384 at 0.98x against 0.69x
AUTOTUNE_STREAM_K = ("128x256x64_2x1x1_cooperative_tma_streamk",
                     "128x128x64_1x1x1_cooperative_tma_streamk")


def autotune_shortlist(problem: Problem,
                       found: list[cutlass_emit.Candidate] | None = None) -> list[Config]:
    """What the "autotune" config times for a 16-bit ``problem`` (its candidates ``found``):
    the default kernel first, then those of :data:`AUTOTUNE_PERSISTENT`, of
    :data:`AUTOTUNE_FEW_TILES` (where :func:`few_tiles`) and the stream-K and split-K configs
    of :data:`AUTOTUNE_STREAM_K` that can run it. Empty for other types, and where fewer
    than two are found (a misaligned problem's kernels are others)."""
    found = cutlass_emit.candidates(problem) if found is None else found
    if problem.in_dtype not in STREAM_K_TYPES:
        return []
    by_name = {c.name: c for c in found}
    default = next((c for c in found if not _is_stream_k(c)), None)
    if default is None:
        return []
    persistent = AUTOTUNE_PERSISTENT + (AUTOTUNE_FEW_TILES if few_tiles(problem, default) else ())
    offered = [_config(default)] + [_config(by_name[n]) for n in persistent
                                    if n in by_name and n != default.name]
    streamed = [by_name[n] for n in AUTOTUNE_STREAM_K if n in by_name]
    streamed = [c for c in streamed if k_tiles(problem, c) > MIN_STREAM_K_ITERS]
    offered += [_config(c, decomposition="stream_k") for c in streamed]
    if streamed:
        last = streamed[-1]
        offered += [_config(last, decomposition="split_k", splits=s)
                    for s in split_counts(output_tiles(problem, last), k_tiles(problem, last))]
    return offered if len(offered) > 1 else []


def kernel_jobs(problem: Problem, config: Config) -> list[tuple[Problem, Config]]:
    """The (problem, config) pairs of compiled kernels that running ``config`` needs: the
    shortlist for "autotune", else the pair itself."""
    if config.name == AUTOTUNE.name:
        return [(problem, c) for c in autotune_shortlist(problem)]
    return [(problem, config)]


#: input types whose misaligned products CUTLASS takes only through staged configs, where
#: no kernel of the generator reads their rows as they lie
STAGED_TYPES = ("float16", "bfloat16")


def _stages_onto_tma(problem: Problem) -> bool:
    """Whether staged configs are offered for ``problem``: where D's rows are 16-byte aligned
    (the staged kernels' 3.x epilogues refuse a D or C off the grid at run time) and the
    copies are read by the 3.x TMA kernels. A contiguous extent that is no multiple of 16
    bytes (K = 4095 of a row-major A) stays so on the copies, and only the kernels of the
    unstaged problem could read them (:func:`multibackend.backends.cutlass.emit.operand_alignment`)."""
    size = int(dtypes.get(problem.d_dtype).itemsize)
    if cutlass_emit.output_alignment(problem) * size != 16:
        return False
    found = cutlass_emit.candidates(staging.staged_problem(problem))
    return bool(found) and found[0].family == "3x_tma"


CAPABILITY = Capability(backend=NAME, rules=RULES, batched=True, extra_checks=(_fits_generator,))


#: where the launch array holds the workspace's address and size
WORKSPACE = launcher.SIZES + launcher.SETTINGS.index("workspace")
WORKSPACE_BYTES = launcher.SIZES + launcher.SETTINGS.index("workspace_bytes")


@functools.lru_cache(maxsize=None)
def device_sm_count(device: str) -> int:
    """The SM count of ``device`` ("cuda:0"...), which the 3.x tile schedulers plan for."""
    import torch

    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def allocate_workspace(device: str, nbytes: int) -> Any:
    """``nbytes`` of device memory on ``device`` from torch's caching allocator, on the
    current stream (a launch's own: the caller makes it current)."""
    import torch

    return torch.empty((nbytes,), dtype=torch.uint8, device=device)


class _Prepared:
    """What a launch needs, computed once per (problem, config): the entry point, the sizes
    and settings as a C array (its address passed on each call), the checks to make, and the
    bytes of workspace the kernel needs (stream-K and split-K kernels; 0 for the others).

    The workspace is allocated at the first launch on each stream and kept for every later
    one: launches on one stream run one after another and share it, launches on two streams
    may overlap and get one each. The first stream's goes into ``shape``; each other stream
    has its own copy of the array. Streams are given their workspace under a lock: first
    launches on two streams from two threads at once would otherwise both take ``shape``,
    and share one workspace."""

    __slots__ = ("library", "gemm", "shape", "shape_address", "integer", "d_align_mask",
                 "has_c", "device", "workspace_bytes", "stream", "workspace", "others",
                 "lock")

    def __init__(self, library: cutlass_build.Library, args: tuple[int, ...],
                 settings: tuple[int, ...], integer: bool, d_align_bytes: int, has_c: bool,
                 device: str):
        self.library = library
        self.gemm = library.gemm
        self.shape = (ctypes.c_int64 * (len(args) + len(settings)))(*args, *settings)
        self.shape_address = ctypes.addressof(self.shape)
        self.integer = integer
        self.d_align_mask = d_align_bytes - 1
        self.has_c = has_c
        self.device = device
        self.workspace_bytes = library.workspace_size(self.shape_address)
        self.stream: int | None = None  # the stream whose workspace ``shape`` holds
        self.workspace: Any = None
        self.others: dict[int, tuple[int, Any, Any]] = {}  # stream -> (address, array, buffer)
        self.lock = threading.Lock()

    def address_on(self, stream: int) -> int:
        """The address of the launch array whose workspace serves ``stream``, allocating
        that workspace at the stream's first launch."""
        found = self.others.get(stream)
        if found is not None:
            return found[0]
        with self.lock:
            if self.stream is None:
                self.workspace = self._attach(self.shape)
                self.stream = stream
            if stream == self.stream:
                return self.shape_address
            found = self.others.get(stream)
            if found is None:
                shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
                found = (ctypes.addressof(shape), shape, self._attach(shape))
                self.others[stream] = found
            return found[0]

    def _attach(self, shape: Any) -> Any:
        buffer = allocate_workspace(self.device, self.workspace_bytes)
        shape[WORKSPACE] = buffer.data_ptr()
        shape[WORKSPACE_BYTES] = self.workspace_bytes
        return buffer


class CutlassBackend(Backend):
    name = NAME
    parallel_builds = True
    takes_matrices = True  # run reads only the operands' pointers

    def __init__(self) -> None:
        self._prepared: dict[tuple[Problem, str], _Prepared] = {}
        self._last: tuple = (None, None, None)  # (problem, config, prepared) of the last run
        self._libraries: dict[cutlass_emit.Candidate, cutlass_build.Library] = {}
        self._picks = AutotunePicks()

    def available(self) -> Reason | None:
        try:
            import cutlass_library  # noqa: F401
        except ImportError as exc:
            return self.unavailable("import", f"nvidia-cutlass is not installed ({exc})")
        try:
            cutlass_build.cutlass_include_dirs()
        except FileNotFoundError as exc:
            return self.unavailable("headers", str(exc))
        if toolchain.find_nvcc() is None:
            return self.unavailable("nvcc", "nvcc not found (set CUDA_HOME or put nvcc on PATH)")
        try:
            import torch

            if not torch.cuda.is_available():
                return self.unavailable("gpu", "no CUDA GPU visible")
        except ImportError:
            return self.unavailable("gpu", "torch is not installed")
        return None

    @property
    def capability(self) -> Capability:
        return CAPABILITY

    def supports(self, problem: Problem) -> Reason | None:
        if problem.in_dtype in NOT_WIRED:
            return Reason(NAME, "dtype", NOT_WIRED[problem.in_dtype])
        reason = CAPABILITY.check(problem)
        if reason is not None and problem.misaligned and problem.in_dtype in STAGED_TYPES \
                and _stages_onto_tma(problem) \
                and CAPABILITY.check(staging.staged_problem(problem)) is None:
            return None  # its staged configs run it
        if reason is not None and reason.rule == "layout" and problem.in_dtype in K_MAJOR_ONLY:
            return Reason(NAME, "layout", f"{reason.message}: CUTLASS's 8-bit tensor-core "
                                          f"kernels read both operands K-major ({TN})")
        return reason

    def configs(self, problem: Problem) -> list[Config]:
        """Every kernel for ``problem`` (tile, cluster, schedule, epilogue) with the
        persistent tile scheduler, the default first; right after the default, for a 16-bit
        problem the "autotune" config (:func:`autotune_shortlist`), then, where they fit,
        the stream-K configs (:func:`stream_k_configs`); then the best few 3.x TMA
        kernels again with other CTA swizzles and raster orders (the same binary: runtime
        arguments of the tile scheduler); for a misaligned problem, its staged kernels after
        them (first where only staging lets CUTLASS run it). A stream-K kernel not offered
        still runs when a config names it."""
        found = cutlass_emit.candidates(problem)
        plain = [c for c in found if not _is_stream_k(c)]
        configs = [_config(c) for c in plain]
        tma = [c for c in plain if c.family == "3x_tma"][:SWIZZLED_KERNELS]
        autotune = [AUTOTUNE] if autotune_shortlist(problem, found) else []
        return (configs[:1] + autotune + stream_k_configs(problem, found) + configs[1:]
                + [v for c in tma for v in scheduler_variants(c)]
                + (staging.offered(self, problem) if _stages_onto_tma(problem) else []))

    def variants(self, problem: Problem, config: Config) -> list[Config]:
        """The runtime variants (swizzle, raster order) of the kernel ``config`` names, for
        any 3.x kernel, not only those :meth:`configs` lists them for (none for
        "autotune")."""
        if config.name == AUTOTUNE.name:
            return []
        if staging.is_staged(config):
            return [staging.wrap(v) for v in scheduler_variants(
                candidate_for(*staging.unwrap(problem, config)))]
        return scheduler_variants(candidate_for(problem, config))

    def versions(self) -> dict[str, str]:
        return {"nvidia-cutlass": cutlass_build.cutlass_version(),
                "nvcc": toolchain.nvcc_version() or "none"}

    def prepare_many(self, jobs: list[tuple[Problem, Config]],
                     max_workers: int | None = None) -> list[tuple[Problem, Config]]:
        """Every pair's kernels built at once (:func:`prepare_many`)."""
        return prepare_many(jobs, max_workers)

    def prepare(self, problem: Problem, config: Config) -> None:
        """Load (or build) the kernel ``config`` runs; for "autotune", its pick once made
        (a call that is not planned prepares on every call), else all it will time."""
        if config.name == AUTOTUNE.name:
            picked = self.autotuned(problem)
            if picked is None:
                prepare_many(kernel_jobs(problem, config))
                return
            config = picked
        problem, config = staging.unwrap(problem, config)
        last = self._last
        if last[0] is not problem or last[1] is not config:
            self._last = (problem, config, self._prepare(problem, config))

    def built(self, problem: Problem, config: Config) -> bool:
        """Whether the kernel's library is loaded or in the compile cache (nvcc takes tens
        of seconds per kernel); for "autotune", whether every kernel it times is."""
        if config.name == AUTOTUNE.name:
            return all(self.built(*job) for job in kernel_jobs(problem, config))
        candidate = candidate_for(*staging.unwrap(problem, config))
        if candidate in self._libraries:
            return True
        key = cutlass_build.artifact_key(cutlass_emit.emit(candidate), candidate.arch)
        return cutlass_build.cached_library(key) is not None

    def _prepare(self, problem: Problem, config: Config) -> _Prepared:
        key = (problem, config)
        found = self._prepared.get(key)
        if found is not None:
            return found
        candidate = candidate_for(problem, config)
        library = self._libraries.get(candidate)
        if library is None:
            source = cutlass_emit.emit(candidate)
            path = cutlass_build.build(source, candidate.arch, candidate.name)
            library = self._libraries[candidate] = cutlass_build.load(path, source)
        size = int(dtypes.get(problem.d_dtype).itemsize)
        # the 3.x TMA epilogue stores D through the TMA unit (16 bytes); the 3.x no-smem one
        # stores any D (run on an H200: rows 258 bytes apart, a D 2 bytes past the grid)
        if candidate.is_3x:
            d_align = 16 if dict(candidate.params).get("epilogue") == "tma" else size
        else:
            d_align = candidate.operation.D.alignment * size
        prepared = _Prepared(library, cutlass_emit.kernel_args(problem),
                             _settings(problem, config), candidate.integer_epilogue, d_align,
                             problem.has_c and problem.c is not None, problem.device)
        self._prepared[key] = prepared
        return prepared

    def autotuned(self, problem: Problem) -> Config | None:
        return self._picks.get(problem)

    def _autotuned(self, problem: Problem, operands: Operands) -> Config:
        """The fastest config of :func:`autotune_shortlist` for ``problem``, timed on
        ``operands`` at its first call in this process (its kernels built first, in parallel,
        where the cache lacks them) and remembered."""
        def choose() -> Config:
            from multibackend.gpu.timing import fastest

            shortlist = autotune_shortlist(problem)
            prepare_many([(problem, c) for c in shortlist])
            best = fastest(shortlist, lambda c: self.run(problem, operands, c))
            if best is None:
                raise KernelRefused(f"CUTLASS: no kernel of the autotune shortlist "
                                    f"({', '.join(c.name for c in shortlist)}) ran "
                                    f"{problem.describe()}")
            return best

        return self._picks.pick(problem, choose)

    def run(self, problem: Problem, operands: Operands, config: Config) -> None:
        if config.name == AUTOTUNE.name:
            config = self._autotuned(problem, operands)
        if staging.is_staged(config):
            staging.run(problem, operands, config, self.run)
            return
        last = self._last
        if last[0] is problem and last[1] is config:
            prepared = last[2]
        else:
            prepared = self._prepare(problem, config)
            self._last = (problem, config, prepared)
        alpha, beta = operands.alpha, operands.beta
        if prepared.integer and (alpha != int(alpha) or beta != int(beta)):
            raise InvalidArgument(f"alpha={alpha!r}, beta={beta!r}: a {problem.in_dtype} -> "
                                  f"{problem.d_dtype} CUTLASS kernel scales in int32, so alpha "
                                  "and beta must be integers")
        d = operands.d.data_ptr()
        if d & prepared.d_align_mask:
            raise InvalidArgument(f"out (D) starts at {d:#x}, not on a "
                                  f"{prepared.d_align_mask + 1}-byte boundary, as CUTLASS "
                                  f"kernel {prepared.library.kernel_name}'s epilogue needs")
        if prepared.has_c:
            c = operands.c.data_ptr()
        else:
            c, beta = d, 0
        address = prepared.shape_address
        if prepared.workspace_bytes and operands.stream != prepared.stream:
            address = prepared.address_on(operands.stream)
        # the kernel computes D^T = B^T A^T: its A is our B
        status = prepared.gemm(address, operands.b.data_ptr(), operands.a.data_ptr(), c, d,
                               alpha, beta, operands.stream)
        if status:
            library = prepared.library
            raise KernelRefused(f"CUTLASS kernel {library.kernel_name} refused "
                                f"{problem.describe()}: {library.status_string(status)} "
                                f"({library.cuda_error_string()})")

    def native(self, problem: Problem, config: Config,
               operands: Operands) -> native.Native | None:
        """The library's ``mb_gemm`` with the sizes and settings prepared for ``config``, for
        a product without C (a kernel with a workspace: on the stream that workspace serves)."""
        if problem.op != "matmul" or problem.has_c or staging.is_staged(config):
            return None
        if config.name == AUTOTUNE.name:
            config = self._autotuned(problem, operands)
        prepared = self._prepare(problem, config)
        if prepared.integer and operands.alpha != int(operands.alpha):
            return None
        stream = None
        if prepared.workspace_bytes:
            if prepared.stream is None:
                return None
            stream = prepared.stream
        entry = ctypes.cast(prepared.gemm, ctypes.c_void_p).value
        # the kernel computes D^T = B^T A^T: its A is our B; C is D, with beta 0
        step = native.EntryStep(entry, prepared.shape_address,
                                (native.B, native.A, native.D, native.D), operands.alpha, 0.0,
                                stream)
        return native.Native(dtypes.torch_dtype(problem.d_dtype), native.d_sizes(problem),
                             driver.primary_context(operands.d.get_device()), (step,),
                             keep=(prepared,))


def _settings(problem: Problem, config: Config) -> tuple[int, ...]:
    """The launcher's settings (:data:`~multibackend.backends.cutlass.launcher.SETTINGS`) for
    ``config`` on ``problem``'s device, the workspace left empty."""
    record = kernel_config(config)
    return (record.swizzle, RASTERS[record.raster], DECOMPOSITIONS[record.decomposition],
            record.splits, device_sm_count(problem.device), 0, 0)


def candidate_for(problem: Problem, config: Config) -> cutlass_emit.Candidate:
    """The kernel ``config`` names among those that can run ``problem``."""
    found = cutlass_emit.candidates(problem)
    kernel = kernel_config(config).kernel
    for candidate in found:
        if candidate.name == kernel:
            return candidate
    names = ", ".join(c.name for c in found[:8]) or "none"
    raise InvalidArgument(f"config {config.name!r} is not a CUTLASS kernel for "
                          f"{problem.describe()} (offered: {names}...)")


def prepare_many(jobs: list[tuple[Problem, Config]],
                 max_workers: int | None = None) -> list[tuple[Problem, Config]]:
    """Compile (or load from cache) the kernel of every (problem, config) at once, in
    parallel nvcc processes (at most ``max_workers``, by default as many as the cores and
    memory allow); returns the pairs that built ("autotune": where all the kernels it times
    did). Raises the first failure when none built."""
    expanded = [(job, kernel_jobs(*job)) for job in jobs]
    each = list(dict.fromkeys(pair for _, pairs in expanded for pair in pairs))
    built = set(_prepare_each(each, max_workers))
    return [job for job, pairs in expanded if pairs and all(pair in built for pair in pairs)]


def _prepare_each(jobs: list[tuple[Problem, Config]],
                  max_workers: int | None) -> list[tuple[Problem, Config]]:
    """:func:`prepare_many` for pairs that each name one kernel."""
    candidates = [candidate_for(*staging.unwrap(problem, config)) for problem, config in jobs]
    builds = [(cutlass_emit.emit(c), c.arch, c.name) for c in candidates]
    results = cutlass_build.build_many(builds, max_workers)
    built = [job for job, result in zip(jobs, results) if not isinstance(result, Exception)]
    if results and not built:
        raise results[0]
    return built


def create() -> Backend:
    return CutlassBackend()
