"""The Triton backend: our ``tl.dot`` kernels (see :mod:`.triton_kernels`) behind the
backend interface.

Dtypes: f16 and bf16 (float32 accumulation, float16 accumulation for f16 on request), float32
in the three precision modes (tf32, tf32x3, ieee), int8 -> int32, fp8 e4m3/e5m2 on sm_89+,
float64; any strides for A and B, batched operands, alpha/beta/C fused in the epilogue. Dot
for f16, bf16, f32 and f64.

Configs: "autotune" (the default on a GPU) times the Hopper-sized candidates below on the
first call for each shape and keeps the fastest; each candidate is also a config of its own so
the tuner can choose one directly. Skinny and few-tile products of 16-bit or float32 operands
are also offered split-K configs (``splitk_...``, see :func:`split_k`): K cut into slices
that separate programs multiply, added up by a second kernel or, with at most
FUSED_MAX_SPLITS slices (``splitk_fused_...``), by the last program of each tile to finish
(in slice order: deterministic). Aligned 16-bit ones on sm_90 are offered, first, the TMA
split-K configs (``tma_splitk_...``, see :func:`tma_splitk_configs`): small tiles fetched
by the TMA unit (some of them two column blocks wide, 192 or 320, where that gives a fuller
single wave), about one wave of programs, up to TMA_SPLITK_MAX_SPLITS slices: two are
added by the program finishing last, in registers (bit-identical run to run); more into a
float32 sum per tile by atomics, so the low bits of their results vary run to run; with
``torch.use_deterministic_algorithms(True)`` the same configs add those in slice order
instead (bit-identical run to run, slower with many slices). Under
``TRITON_INTERPRET=1`` (no GPU) one small config (and one small split-K config) runs and bf16
operands are upcast before ``tl.dot``, which the interpreter computes wrongly otherwise; the
interpreter also ignores tf32 rounding (its results are more accurate than the GPU's), which
the tests take into account.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from typing import Any

import triton

from multibackend.backends.base import AutotunePicks, Backend
from multibackend.backends.triton.buffers import StreamScratch, TileCounters
from multibackend.backends.triton.configs import (
    _FLOATS_OUT,
    DOT_BLOCK,
    DOT_PROGRAMS_PER_SM,
    DOT_WARPS,
    INTERPRETER_SPLITK,
    INTERPRETER_TILE,
    MAX_GRID_Y,
    POINTER_TILES,
    SPLITK_SHORTLIST,
    SUMS_CHUNK,
    SUMS_CHUNKS,
    TMA_MIN_WAVE_USE,
    TMA_SHORTLIST,
    TMA_SPLITK_SHORTLIST,
    TMA_TILES,
    WAVE_USE_STEP,
    _tile_count,
    _wave_use,
    config_fault,
    interpreting,
    pointer_tile,
    scaled_tma_tiles,
    splitk_configs,
    splitk_eligible,
    splitk_tile,
    tma_eligible,
    tma_operands,
    tma_splitk_configs,
    tma_tile,
    width_blocks,
)
from multibackend.backends.triton.launch import LIMIT as LAUNCH_LIMIT
from multibackend.backends.triton.launch import Launcher, aligned
from multibackend.backends.triton.operands import (
    _descriptor,
    _matrix,
    _operand_descriptors,
    _operands_ready,
    _strides3,
    _tile_constexprs,
    _tma_ready,
    d_by_tma,
    d_unit,
    load_units,
)
from multibackend.backends.triton.records import DotConfig, dot_of, tile_of
from multibackend.backends.triton.splitk import SplitKLaunches
from multibackend.core import dtypes
from multibackend.core.capability import Capability, DtypeRule, Reason
from multibackend.core.config import Config, Operands, folded_operands
from multibackend.core.problem import Problem, folded_batch
from multibackend.gpu import driver, native, staging


def _capability() -> Capability:
    f32_out = ("float32",)
    rules = (
        DtypeRule("float16", accs=("float32", "float16"), outs=_FLOATS_OUT),
        DtypeRule("bfloat16", accs=("float32",), outs=_FLOATS_OUT, min_cc=(8, 0)),
        DtypeRule("float32", accs=("float32",), outs=f32_out,
                  precisions=("ieee", "tf32", "tf32x3")),
        DtypeRule("float64", accs=("float64",), outs=("float64",), min_cc=(8, 0)),
        DtypeRule("int8", accs=("int32",), outs=("int32",), min_cc=(8, 0)),
        DtypeRule("float8_e4m3fn", accs=("float32",), outs=_FLOATS_OUT, min_cc=(8, 9)),
        DtypeRule("float8_e5m2", accs=("float32",), outs=_FLOATS_OUT, min_cc=(8, 9)),
        DtypeRule("float16", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("bfloat16", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("float32", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("float64", accs=("float64",), outs=("float64",), ops=("dot",)),
    )
    every = ("tensor", "row", "block")
    return Capability("triton", rules, batched=True, saturate=False,
                      extra_checks=(_accumulator_rule, _batch_rule),
                      scales=tuple((a, b) for a in every for b in every))


def _accumulator_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.acc == "float16" and problem.d_dtype != "float16":
        return ("accumulator", "float16 accumulation writes a float16 D only")
    return None


def _batch_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.batch > MAX_GRID_Y:
        return ("batch", f"batch is {problem.batch}: the batch is the grid's second axis, "
                         f"at most {MAX_GRID_Y}")
    return None


def usable_cache() -> None:
    """Triton compiles into its cache folder (``$TRITON_CACHE_DIR``, else ``~/.triton/cache``);
    where that folder cannot be made or written (a read-only home), every compile fails and no
    tile would run. A private temporary folder then stands in for this process; a folder the
    user named is left as it is."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return
    folder = triton.knobs.cache.dir
    try:
        os.makedirs(folder, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        writable = False
    if not writable:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="multibackend-triton-")


class TritonBackend(SplitKLaunches, Backend):
    name = "triton"
    takes_matrices = True

    def __init__(self) -> None:
        usable_cache()
        self._capability = _capability()
        self._picks = AutotunePicks()
        self._matmul_launcher: Launcher | None = None
        self._tma_kept: Launcher | None = None
        self._dot_pair: tuple[Launcher, Launcher] | None = None
        self._splitk_pair: tuple[Launcher, Launcher] | None = None
        self._fused_kept: Launcher | None = None
        self._tma_splitk_kept: Launcher | None = None
        self._counters = TileCounters()
        self._sums = TileCounters(SUMS_CHUNK, SUMS_CHUNKS, "float32")
        self._scratch = StreamScratch()
        self._sms: dict[int, int] = {}
        self._statics: dict[tuple[Problem, str], tuple] = {}

    @property
    def capability(self) -> Capability:
        return self._capability

    def available(self) -> Reason | None:
        if interpreting():
            return None
        import torch

        if not torch.cuda.is_available():
            return self.unavailable("environment", "no CUDA GPU visible (set TRITON_INTERPRET=1 "
                                                   "to run the kernels in Triton's interpreter)")
        return None

    def supports(self, problem: Problem) -> Reason | None:
        if interpreting() and problem.cc is None:
            problem = problem.with_(cc=(9, 0))
        return super().supports(problem)

    def versions(self) -> dict[str, str]:
        return {"triton": triton.__version__}

    def configs(self, problem: Problem) -> list[Config]:
        """The candidates for ``problem``, the default first; a batch that
        :func:`~multibackend.core.problem.folded_batch` makes one product gets that product's
        (its TMA tiles among them), and runs as it."""
        folded = folded_batch(problem)
        if folded is not None:
            return self.configs(folded)
        if problem.op == "dot":
            return [DotConfig(DOT_BLOCK, DOT_WARPS).config()]
        if problem.scales is not None:  # the scaled kernel: the pointer tiles that fit it
            from multibackend.backends.triton import scaled

            if interpreting():
                return [pointer_tile(INTERPRETER_TILE)]
            offered = scaled_tma_tiles(problem) + [pointer_tile(t) for t in POINTER_TILES[1]]
            return [c for c in offered if scaled.config_fault(problem, c) is None]
        if interpreting():
            split = ([splitk_tile(*INTERPRETER_SPLITK, fused=True),
                      splitk_tile(*INTERPRETER_SPLITK)] if splitk_eligible(problem) else [])
            return [pointer_tile(INTERPRETER_TILE)] + split + staging.offered(self, problem)
        width = int(dtypes.get(problem.in_dtype).itemsize)
        tma = [tma_tile(t) for t in TMA_TILES] if tma_eligible(problem) else []
        # split-K after TMA: a misaligned product's staged configs stay its TMA tiles
        tiles = (tma_splitk_configs(problem) + tma + splitk_configs(problem)
                 + [pointer_tile(t) for t in POINTER_TILES[width]])
        if min(problem.m, problem.n) <= 64:
            # a skinny product wastes most of a 128-wide tile: narrow tiles first
            tiles.sort(key=lambda c: min(tile_of(c).block_m, tile_of(c).block_n) > 64)
        # a misaligned product: its staged TMA tiles (see :mod:`multibackend.gpu.staging`) first
        return ([Config.of("autotune")]
                + staging.offered(self, problem,
                                  keep=lambda c: tile_of(c).kind != "tma_splitk")
                + tiles)

    def check_config(self, problem: Problem, config: Config) -> str | None:
        """A handed-in config's parameters against the rules every kernel of its kind needs
        to cover D whole (see :func:`config_fault`), for the problem its kernel runs (a
        staged config's staged one, a folded batch's one product)."""
        if config.name == "autotune" and not config.params:
            return None
        problem, config = staging.unwrap(problem, config)
        problem = folded_batch(problem) or problem
        if interpreting() and problem.cc is None:
            problem = problem.with_(cc=(9, 0))
        if problem.scales is not None:
            from multibackend.backends.triton import scaled

            return config_fault(problem, config) or scaled.config_fault(problem, config)
        return config_fault(problem, config)

    # -- matmul -------------------------------------------------------------------------
    def _keep_statics(self, problem: Problem, config: Config, statics: Any) -> Any:
        """``statics`` kept for this problem and config (the table emptied when full)."""
        if len(self._statics) >= LAUNCH_LIMIT:
            self._statics.clear()
        self._statics[(problem, config)] = statics
        return statics

    def _matmul_statics(self, problem: Problem, config: Config) -> tuple:
        """(grid, constexprs and launch options) of the pointer kernel for this problem and
        config, worked out once."""
        found = self._statics.get((problem, config))
        if found is not None:
            return found
        tile = tile_of(config)
        grid = (-(-problem.m // tile.block_m) * -(-problem.n // tile.block_n), problem.batch, 1)
        constexprs = dict(_tile_constexprs(problem, config), GROUP_M=tile.group_m)
        return self._keep_statics(problem, config, (grid, constexprs))

    def _matmul_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(the launcher's key, grid, the kernel's arguments, a constexprs builder) of the
        pointer kernel on these operands."""
        grid, constexprs = self._matmul_statics(problem, config)
        a, b, c, d = ops.a, ops.b, ops.c, ops.d
        c_arg = c if c is not None else d
        c_strides = _strides3(c) if c is not None else (0, 0, 0)
        ints = (problem.m, problem.n, problem.k, *_strides3(a), *_strides3(b), *c_strides,
                *_strides3(d))
        scale = ops.alpha != 1
        key = (problem, config, scale, c is not None, ints,
               aligned(a.data_ptr(), b.data_ptr(), c_arg.data_ptr(), d.data_ptr()))
        return (key, grid, (a, b, c_arg, d, *ints, ops.alpha, ops.beta),
                lambda: dict(constexprs, HAS_C=c is not None, SCALE=scale,
                             D_UNIT=d_unit(problem, d, c), **load_units(problem, a, b)))

    def _launcher(self) -> Launcher:
        if self._matmul_launcher is None:
            from multibackend.backends.triton import kernels

            self._matmul_launcher = Launcher(kernels.matmul_kernel)
        return self._matmul_launcher

    def _launch_matmul(self, problem: Problem, ops: Operands, config: Config) -> None:
        key, grid, args, constexprs = self._matmul_launch(problem, ops, config)
        self._launcher()(key, grid, ops.stream, args, constexprs)

    def _launch_tma(self, problem: Problem, ops: Operands, config: Config) -> None:
        """The persistent TMA kernel through a kept launcher (Triton's binding of its
        arguments, each call, cost more host time than the kernel's launch): the descriptors
        are built per call, everything Triton specializes on is in the key."""
        key, grid, args, constexprs = self._tma_launch(problem, ops, config)
        self._tma_launcher()(key, grid, ops.stream, args, constexprs)

    def _tma_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(the launcher's key, grid, the kernel's arguments, a constexprs builder) of the
        persistent TMA kernel on these operands."""
        import triton.language as tl

        tile = tile_of(config)
        bm, bn, bk = tile.block_m, tile.block_n, tile.block_k
        a, b, d = _matrix(ops.a), _matrix(ops.b), _matrix(ops.d)
        b_kmajor, a_desc, b_desc = _operand_descriptors(problem, a, b, bm, bn, bk)
        has_c, scale = ops.c is not None, ops.alpha != 1
        d_tma = d_by_tma(_tma_ready(d), has_c)
        d_desc = _descriptor(d, [bm, bn]) if d_tma else None
        c = _matrix(ops.c) if has_c else d
        programs = min(self._sm_count(a), triton.cdiv(problem.m, bm) * triton.cdiv(problem.n, bn))
        ints = (problem.m, problem.n, problem.k, c.stride(0), c.stride(1), d.stride(0),
                d.stride(1))
        key = (problem, config, has_c, scale, d_tma, programs, ints,
               aligned(a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr()))

        def constexprs() -> dict[str, Any]:
            return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=tile.group_m,
                        NUM_PROGRAMS=programs,
                        ACC=tl.float32 if problem.acc == "float32" else tl.float16,
                        B_KMAJOR=b_kmajor, HAS_C=has_c, SCALE=scale, D_TMA=d_tma,
                        WARP_SPECIALIZE=tile.warp_specialize,
                        D_UNIT=1 if d_tma else d_unit(problem, d, c if has_c else None),
                        num_warps=tile.warps, num_stages=tile.stages)

        return (key, (programs, 1, 1),
                (a_desc, b_desc, d_desc, c, d, *ints, ops.alpha, ops.beta), constexprs)

    def _tma_launcher(self) -> Launcher:
        if self._tma_kept is None:
            from multibackend.backends.triton import kernels

            self._tma_kept = Launcher(kernels.matmul_tma_persistent_kernel)
        return self._tma_kept

    # -- split-K ----------------------------------------------------------------------------
    def _launch(self, problem: Problem, ops: Operands, config: Config) -> None:
        tile = tile_of(config)
        if problem.scales is not None:
            from multibackend.backends.triton import scaled

            scaled.launch(problem, ops, config, lambda: self._sm_count(_matrix(ops.a)))
        elif staging.is_staged(config):
            staging.run(problem, ops, config, self._launch)
        elif tile.kind == "splitk" and tile.fused:
            self._launch_splitk_fused(problem, ops, config)
        elif tile.kind == "tma_splitk":
            sm90 = problem.with_(cc=(9, 0)) if interpreting() else problem
            if tma_operands(sm90) and _operands_ready(problem, ops):
                self._launch_tma_splitk(problem, ops, config)
            else:  # operands the TMA unit cannot fetch (a batch, a column-major A, arrays
                # off the 16-byte grid): the same split through plain loads, in tiles of
                # the config's first column block
                self._launch_splitk_fused(problem, ops, replace(
                    tile, kind="splitk", fused=True,
                    block_n=width_blocks(tile.block_n)[0]).config())
        elif tile.kind == "splitk":
            self._launch_splitk(problem, ops, config)
        elif tile.kind != "tma":
            self._launch_matmul(problem, ops, config)
        elif _operands_ready(problem, ops):
            self._launch_tma(problem, ops, config)
        else:  # arrays off the 16-byte grid: the same tile through plain loads
            self._launch_matmul(problem, ops, pointer_tile(POINTER_TILES[2][0]))

    def _shortlist(self, problem: Problem, sms: int) -> list[Config]:
        """The first TMA_SPLITK_SHORTLIST TMA split-K candidates (skinny and few-tile
        products), TMA_SHORTLIST TMA candidates (staged ones for a misaligned product) that
        fill at least TMA_MIN_WAVE_USE of the last wave on the ``sms`` multiprocessors: the
        first offered and those that fill it fullest, the first SPLITK_SHORTLIST
        split-K candidates on the caller's operands (skinny and few-tile products), the
        first two pointer candidates, and the largest pointer tile that still gives every
        multiprocessor a tile (small problems)."""
        tiles = [c for c in self.configs(problem) if c.name != "autotune"]
        pointer = [c for c in tiles if tile_of(c).kind == "pointer"]
        tma_splits = [c for c in tiles if tile_of(c).kind == "tma_splitk"][:TMA_SPLITK_SHORTLIST]
        split = [c for c in tiles
                 if tile_of(c).kind == "splitk" and not staging.is_staged(c)][:SPLITK_SHORTLIST]

        def count(c: Config) -> int:
            return _tile_count(problem, tile_of(c).block_m, tile_of(c).block_n)

        def area(c: Config) -> int:
            return tile_of(c).block_m * tile_of(c).block_n

        def use(c: Config) -> int:
            return round(_wave_use(count(c), sms) / WAVE_USE_STEP)

        # the first TMA tile offered (the largest: the most work per byte loaded, which can
        # outweigh an emptier last wave over several waves) and those whose last wave is
        # fullest, in the order offered on a tie
        tma = [c for c in tiles if tile_of(c).kind == "tma"
               and use(c) >= TMA_MIN_WAVE_USE / WAVE_USE_STEP]
        fullest = tma[:1] + sorted(tma[1:], key=lambda c: -use(c))[:TMA_SHORTLIST - 1]
        tma = [c for c in tma if c in fullest]

        filling = [c for c in pointer if count(c) >= sms]
        fill = max(filling, key=area) if filling else min(pointer, key=area)
        picked = tma_splits + tma + split + pointer[:2]
        return picked + ([fill] if fill not in picked else [])

    def autotuned(self, problem: Problem) -> Config | None:
        return self._picks.get(folded_batch(problem) or problem)

    def _autotuned(self, problem: Problem, ops: Operands) -> Config:
        """The fastest of the shortlisted candidates for this problem
        (:func:`multibackend.gpu.timing.fastest`), timed once per process (the tuner,
        :func:`multibackend.tune`, times them all)."""
        def choose() -> Config:
            from multibackend.gpu.timing import fastest

            best = fastest(self._shortlist(problem, self._sm_count(ops.d)),
                           lambda candidate: self._launch(problem, ops, candidate))
            if best is None:
                raise RuntimeError(f"triton: no tile compiled for {problem.describe()}")
            return best

        return self._picks.pick(problem, choose)

    # -- dot ------------------------------------------------------------------------------
    def _launch_dot(self, problem: Problem, ops: Operands, config: Config) -> None:
        """The two-pass dot through kept launchers: the integers and alignment of a dot are
        its Problem's, so the Problem and config key each kernel's specialization."""
        import torch
        import triton.language as tl

        block, warps = dot_of(config).block, dot_of(config).warps
        acc = tl.float64 if problem.acc == "float64" else tl.float32
        programs = self._dot_programs(problem, block, ops.a)
        # the stream's float32 scratch (two words per float64 partial): written, then read
        words = 2 if ops.d.dtype == torch.float64 else 1
        partial = self._scratch.get(ops.d.device, ops.stream, words * programs)[
            :words * programs].view(ops.d.dtype)
        first, finish = self._dot_launchers()
        x, y = ops.a, ops.b
        first((problem, config), (programs, 1, 1), ops.stream,
              (x, y, partial, problem.k, x.stride(0), y.stride(0)),
              lambda: {"BLOCK": block, "ACC": acc, "num_warps": warps})
        finish((problem.acc, programs), (1, 1, 1), ops.stream, (partial, ops.d, programs),
               lambda: {"BLOCK": 1024, "ACC": acc, "num_warps": 4})

    def _dot_native(self, problem: Problem, config: Config,
                    ops: Operands) -> native.Native | None:
        import torch

        programs = self._dot_programs(problem, dot_of(config).block, ops.a)
        first, finish = self._dot_launchers()
        kept, last = first.kept((problem, config)), finish.kept((problem.acc, programs))
        if kept is None or last is None:
            return None
        partial = torch.empty((programs,), dtype=ops.d.dtype, device=ops.d.device)
        at, x, y = partial.data_ptr(), ops.a, ops.b
        steps = (native.triton_step(kept.compiled, kept.grid,
                                    (x, y, partial, problem.k, x.stride(0), y.stride(0),
                                     *kept.tail), {0: native.A, 1: native.B}, {2: at},
                                    ops.stream),
                 native.triton_step(last.compiled, last.grid, (partial, ops.d, programs,
                                                                *last.tail),
                                    {1: native.D}, {0: at}, ops.stream))
        if None in steps:
            return None
        return native.Native(dtypes.torch_dtype(problem.d_dtype), (),
                             driver.primary_context(ops.d.get_device()), steps,
                             keep=(kept, last, partial))

    def _dot_programs(self, problem: Problem, block: int, x: Any) -> int:
        """Programs of the dot's first pass: enough blocks to fill the GPU, no more than
        there are chunks (the device's multiprocessor count asked once)."""
        sms = self._sm_count(x) if x.is_cuda else 2
        return max(1, min(triton.cdiv(problem.k, block), sms * DOT_PROGRAMS_PER_SM))

    def _sm_count(self, t: Any) -> int:
        """The multiprocessors of ``t``'s device (asked once per device)."""
        index = t.device.index or 0
        sms = self._sms.get(index)
        if sms is None:
            import torch

            sms = self._sms[index] = torch.cuda.get_device_properties(
                index).multi_processor_count
        return sms

    def _dot_launchers(self) -> tuple[Launcher, Launcher]:
        if self._dot_pair is None:
            from multibackend.backends.triton import kernels

            self._dot_pair = (Launcher(kernels.dot_partial_kernel),
                              Launcher(kernels.dot_finish_kernel))
        return self._dot_pair

    def run(self, problem: Problem, operands: Operands, config: Config) -> None:
        if problem.op == "dot":
            self._launch_dot(problem, operands, config)
            return
        folded = folded_batch(problem)
        if folded is not None:
            problem, operands = folded, folded_operands(operands, folded)
        if config.name == "autotune":
            config = self._autotuned(problem, operands)
        if interpreting():
            self._interpreted(problem, operands, config)
            return
        self._launch(problem, operands, config)

    def _interpreted(self, problem: Problem, ops: Operands, config: Config) -> None:
        """A launch in Triton's interpreter, which misreads some values the GPU reads right:
        fp8's Inf and NaN encodings (e5m2's Inf as 65536, e4m3's NaN as 480) and bfloat16's
        subnormals, and which rounds to bfloat16 wrongly in the subnormal range. Operands
        holding such values are handed over as float32 (torch converts them exactly; the
        products are exact in float32 either way), and a bfloat16 D with an element below the
        normal range (zero included) is made again in float32 and rounded once by torch.
        Operands without them run the kernels' own fp8 and bfloat16 paths."""
        import torch

        def misread(t: Any) -> bool:
            if t is None or t.dtype not in (torch.bfloat16, torch.float8_e4m3fn,
                                            torch.float8_e5m2):
                return False
            if t.dtype != torch.bfloat16:
                return not bool(torch.isfinite(t.float()).all())
            wide = t.float().abs()
            return bool(((wide > 0) & (wide < torch.finfo(torch.bfloat16).tiny)).any())

        if misread(ops.a) or misread(ops.b) or misread(ops.c):
            c = ops.c
            ops = replace(ops, a=ops.a.float(), b=ops.b.float(),
                          c=None if c is None else c.float())
        self._launch(problem, ops, config)
        tiny = torch.finfo(torch.bfloat16).tiny  # a D rounded into zero counts too
        if problem.d_dtype == "bfloat16" and bool((ops.d.float().abs() < tiny).any()):
            wide = ops.d.float()
            self._launch(problem.with_(d_dtype="float32"),
                         replace(ops, d=wide, c=None if ops.c is None else ops.c.float()),
                         config)
            ops.d.copy_(wide)

    def bind(self, problem: Problem, config: Config, operands: Operands):
        """The pointer kernel's (or both split-K kernels') kept launcher with the integer
        arguments, alpha and beta of these calls filled in (None for dot, TMA tiles and
        anything Triton did not keep)."""
        if problem.op != "matmul":
            return None
        if config.name == "autotune":
            config = self._autotuned(problem, operands)
        tile = tile_of(config)
        if tile.kind in ("tma", "tma_splitk") or staging.is_staged(config):
            return None
        if tile.kind == "splitk" and tile.fused:
            return self._bind_splitk_fused(problem, config, operands)
        if tile.kind == "splitk":
            return self._bind_splitk(problem, config, operands)
        key, _, args, _ = self._matmul_launch(problem, operands, config)
        kept = self._launcher().kept(key)
        if kept is None:
            return None
        runner, tail = kept.runner, kept.tail
        middle = args[4:]  # the integers, alpha and beta

        def launch(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            runner(a, b, d if c is None else c, d, *middle, *tail, stream=stream)
        return launch

    def native(self, problem: Problem, config: Config,
               operands: Operands) -> native.Native | None:
        """For a product without C: the pointer kernel's kept launch with this call's
        integers, alpha and beta; a TMA kernel's, its descriptors' tensor maps encoded once
        and pointed at each call's operands, and, where the TMA split-K kernel splits K, the
        tile counters of the caller's stream with its float32 sums (slices added by atomics)
        or its float32 scratch (two slices paired, or more added in order where torch asks
        for deterministic algorithms): the plan runs on that stream only. The dot's two
        passes with block partials the plan keeps, on the caller's stream. Split-K through
        pointers and staged configs: not described. A batch that
        :func:`~multibackend.core.problem.folded_batch` makes one product: that product's launch,
        D of the batch's sizes."""
        if problem.op == "dot":
            return self._dot_native(problem, config, operands)
        if operands.c is not None:
            return None
        sizes = native.d_sizes(problem)
        folded = folded_batch(problem)
        if folded is not None:
            problem, operands = folded, folded_operands(operands, folded)
        if config.name == "autotune":
            config = self._autotuned(problem, operands)
        kind = tile_of(config).kind
        if kind == "splitk" or staging.is_staged(config):
            return None
        maps = {0: native.A + native.MAP, 1: native.B + native.MAP}
        fixed, buffers, stream, atomic = {}, (), None, False
        if kind == "tma":
            key, _, args, _ = self._tma_launch(problem, operands, config)
            kept = self._tma_launcher().kept(key)
            sources = {**maps, 2: native.D + native.MAP, 3: native.D, 4: native.D}
        elif kind == "tma_splitk":
            key, _, args, _, atomic = self._tma_splitk_launch(problem, operands, config)
            kept = self._tma_splitk_launcher().kept(key)
            sources = {**maps, 2: native.B + native.MAP, 3: native.D, 4: native.D}
            split = self._splitk_statics(problem, config).splits > 1
            buffers, stream = args[5:7], operands.stream if split else None
            fixed = {5: buffers[0].data_ptr(), 6: buffers[1].data_ptr()}
        else:
            key, _, args, _ = self._matmul_launch(problem, operands, config)
            kept = self._launcher().kept(key)
            sources = {0: native.A, 1: native.B, 2: native.D, 3: native.D}
        if kept is None:
            return None
        step = native.triton_step(kept.compiled, kept.grid, (*args, *kept.tail), sources, fixed,
                                  stream, atomic)
        if step is None:
            return None
        device = operands.d.get_device()
        return native.Native(dtypes.torch_dtype(problem.d_dtype), sizes,
                             driver.primary_context(device), (step,), keep=(kept, *buffers))


def create() -> Backend:
    return TritonBackend()
