"""The Triton backend's split-K launches: the fused kernel (partial tiles summed by the last
program of each tile, counters per stream) and the TMA split-K kernel with its reduction,
as a mixin of :class:`~multibackend.backends.triton.backend.TritonBackend`, which owns the
launchers' state (``self._keep_statics``, the launch caches) these methods use."""
from __future__ import annotations

import math
from typing import Any

import triton

from multibackend.backends.triton.configs import (
    REDUCE_ELEMENTS,
    REDUCE_WARPS,
    SPLITK_GROUP_M,
    _exact_split,
    _SplitPlan,
    _tile_count,
    splitk_eligible,
    width_blocks,
)
from multibackend.backends.triton.launch import Launcher, aligned
from multibackend.backends.triton.operands import (
    _b_descriptor,
    _deterministic,
    _matrix,
    _operand_descriptors,
    _strides3,
    _tile_constexprs,
    d_unit,
    load_units,
    tma_reduction,
)
from multibackend.backends.triton.records import tile_of
from multibackend.core.config import Config, Operands
from multibackend.core.errors import InvalidArgument
from multibackend.core.problem import Problem


class SplitKLaunches:
    """The split-K launch paths of the Triton backend."""

    def _splitk_statics(self, problem: Problem, config: Config) -> _SplitPlan:
        """The split-K kernels' grids, workspace and constexprs for this problem and config,
        worked out once. The split actually run is the config's made exact for this K (no
        empty slice): the same as the config's for the problems it was offered for."""
        found = self._statics.get((problem, config))
        if found is not None:
            return found
        if not splitk_eligible(problem):
            raise InvalidArgument(f"triton: config is {config.name!r}: split-K runs matrix "
                                  f"products of float16, bfloat16 or float32 operands "
                                  f"accumulated in float32, not {problem.describe()}")
        m, n, batch = problem.m, problem.n, problem.batch
        tile = tile_of(config)
        bm, bn, bk = tile.block_m, tile.block_n, tile.block_k
        steps = triton.cdiv(problem.k, bk)
        splits = _exact_split(steps, tile.split_k)
        rbm = min(16, triton.next_power_of_2(m))
        rbn = min(REDUCE_ELEMENTS // rbm, triton.next_power_of_2(n))
        fused = tile.fused or tile.kind == "tma_splitk"
        tiles = _tile_count(problem, bm, bn)
        plan = _SplitPlan(
            grid=(tiles // batch, splits, batch),
            reduce_grid=(triton.cdiv(m, rbm) * triton.cdiv(n, rbn), batch, 1),
            workspace=(tiles, splits, bm, bn) if fused else (batch, splits, m, n),
            k_slice=triton.cdiv(steps, splits) * bk, splits=splits,
            constexprs=dict(_tile_constexprs(problem, config), GROUP_M=SPLITK_GROUP_M),
            reduce_constexprs=dict(BLOCK_M=rbm, BLOCK_N=rbn, num_warps=REDUCE_WARPS),
            fused=fused)
        return self._keep_statics(problem, config, plan)

    def _splitk_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(plan, the partial kernel's key and integer arguments, the reduction's key, its
        arguments after the workspace, its constexprs builder). The workspace, the stream's
        scratch, comes from torch's caching allocator, whose blocks are 512-byte aligned: it
        takes no part in the keys."""
        plan = self._splitk_statics(problem, config)
        a, b, c, d = ops.a, ops.b, ops.c, ops.d
        ints = (problem.m, problem.n, problem.k, plan.k_slice, *_strides3(a), *_strides3(b))
        c_arg = c if c is not None else d
        c_strides = _strides3(c) if c is not None else (0, 0, 0)
        rints = (problem.m, problem.n, plan.splits, *c_strides, *_strides3(d))
        scale = ops.alpha != 1
        partial_key = (problem, config, ints, aligned(a.data_ptr(), b.data_ptr()))
        reduce_key = (problem, config, scale, c is not None, rints,
                      aligned(c_arg.data_ptr(), d.data_ptr()))
        return (plan, partial_key, ints, reduce_key,
                (c_arg, d, *rints, ops.alpha, ops.beta),
                lambda: dict(plan.reduce_constexprs, HAS_C=c is not None, SCALE=scale,
                             D_UNIT=d_unit(problem, d, c)))

    def _fused_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(plan, the fused split-K kernel's key, its integer arguments, its constexprs
        builder); the workspace and counters take no part in the key (512-byte and chunk
        aligned)."""
        plan = self._splitk_statics(problem, config)
        a, b, c, d = ops.a, ops.b, ops.c, ops.d
        c_arg = c if c is not None else d
        c_strides = _strides3(c) if c is not None else (0, 0, 0)
        ints = (problem.m, problem.n, problem.k, plan.k_slice, *_strides3(a), *_strides3(b),
                *c_strides, *_strides3(d))
        scale = ops.alpha != 1
        key = (problem, config, scale, c is not None, ints,
               aligned(a.data_ptr(), b.data_ptr(), c_arg.data_ptr(), d.data_ptr()))
        return (plan, key, ints,
                lambda: dict(plan.constexprs, HAS_C=c is not None, SCALE=scale,
                             D_UNIT=d_unit(problem, d, c), **load_units(problem, a, b)))

    def _fused_launcher(self) -> Launcher:
        if self._fused_kept is None:
            from multibackend.backends.triton import kernels

            self._fused_kept = Launcher(kernels.matmul_splitk_fused_kernel)
        return self._fused_kept

    def _launch_splitk_fused(self, problem: Problem, ops: Operands, config: Config) -> None:
        """The fused split-K kernel on the stream's float32 scratch (each partial written
        before it is read) and tile counters."""
        plan, key, ints, constexprs = self._fused_launch(problem, ops, config)
        d = ops.d
        work = self._scratch.get(d.device, ops.stream, math.prod(plan.workspace))
        counters = self._counters.get(d.device, ops.stream, plan.workspace[0])
        c_arg = ops.c if ops.c is not None else d
        self._fused_launcher()(key, plan.grid, ops.stream,
                               (ops.a, ops.b, c_arg, d, work, counters, *ints, ops.alpha,
                                ops.beta), constexprs)

    def _bind_splitk_fused(self, problem: Problem, config: Config, ops: Operands):
        """The fused split-K kernel kept, with the integers, alpha and beta of these calls
        filled in, each call finding its stream's scratch and counters (None if not
        kept)."""
        plan, key, ints, _ = self._fused_launch(problem, ops, config)
        kept = self._fused_launcher().kept(key)
        if kept is None:
            return None
        runner, tail, counters, scratch = kept.runner, kept.tail, self._counters, self._scratch
        size, device, tiles = math.prod(plan.workspace), ops.d.device, plan.workspace[0]
        scalars = (ops.alpha, ops.beta)

        def launch(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            work = scratch.get(device, stream, size)
            runner(a, b, d if c is None else c, d, work, counters.get(device, stream, tiles),
                   *ints, *scalars, *tail, stream=stream)
        return launch

    def _tma_splitk_launcher(self) -> Launcher:
        if self._tma_splitk_kept is None:
            from multibackend.backends.triton import kernels

            self._tma_splitk_kept = Launcher(kernels.matmul_tma_splitk_kernel)
        return self._tma_splitk_kept

    def _launch_tma_splitk(self, problem: Problem, ops: Operands, config: Config) -> None:
        """The TMA split-K kernel: descriptors built per call and, where K is split, the
        stream's tile counters with, by :func:`tma_reduction`, the stream's float32 scratch
        for one partial per tile (two slices, paired) or for every slice's (in slice order),
        or its zeroed float32 sums (atomics); with one slice neither is touched (the
        counters stand in)."""
        key, grid, args, constexprs, _ = self._tma_splitk_launch(problem, ops, config)
        self._tma_splitk_launcher()(key, grid, ops.stream, args, constexprs)

    def _tma_splitk_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(the launcher's key, grid, the kernel's arguments, a constexprs builder, whether
        its slices are summed by atomics, in no fixed order) of the TMA split-K kernel on
        these operands."""
        plan = self._splitk_statics(problem, config)
        tile = tile_of(config)
        bm, bn, bk = tile.block_m, tile.block_n, tile.block_k
        block, extra = width_blocks(bn)
        if extra and plan.splits > 1:
            raise InvalidArgument(f"triton: config is {config.name!r}: a tile {bn} wide (two "
                                  f"column blocks) runs unsplit, not in {plan.splits} slices")
        a, b, d = _matrix(ops.a), _matrix(ops.b), _matrix(ops.d)
        b_kmajor, a_desc, b_desc = _operand_descriptors(problem, a, b, bm, block, bk)
        bx_desc = _b_descriptor(problem, b, extra, bk) if extra else b_desc
        has_c, scale = ops.c is not None, ops.alpha != 1
        c = _matrix(ops.c) if has_c else d
        tiles = plan.workspace[0]
        counters = self._counters.get(d.device, ops.stream, tiles)
        reduce = tma_reduction(plan.splits, _deterministic())
        if reduce == "atomic":
            work = self._sums.get(d.device, ops.stream, tiles * bm * bn)
        elif plan.splits > 1:
            size = tiles * bm * bn if reduce == "pair" else math.prod(plan.workspace)
            work = self._scratch.get(d.device, ops.stream, size)
        else:
            work = counters
        ints = (problem.m, problem.n, problem.k, plan.k_slice, c.stride(0), c.stride(1),
                d.stride(0), d.stride(1))
        key = (problem, config, has_c, scale, reduce, ints,
               aligned(a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr()))

        def constexprs() -> dict[str, Any]:
            return dict(BLOCK_M=bm, BLOCK_N=block, EXTRA_N=extra, BLOCK_K=bk,
                        GROUP_M=SPLITK_GROUP_M, B_KMAJOR=b_kmajor, HAS_C=has_c, SCALE=scale,
                        REDUCE=reduce, D_UNIT=d_unit(problem, d, c if has_c else None),
                        num_warps=tile.warps, num_stages=tile.stages)

        return (key, plan.grid[:2] + (1,),
                (a_desc, b_desc, bx_desc, c, d, work, counters, *ints, ops.alpha, ops.beta),
                constexprs, reduce == "atomic")

    def _splitk_launchers(self) -> tuple[Launcher, Launcher]:
        if self._splitk_pair is None:
            from multibackend.backends.triton import kernels

            self._splitk_pair = (Launcher(kernels.matmul_splitk_kernel),
                                 Launcher(kernels.splitk_reduce_kernel))
        return self._splitk_pair

    def _launch_splitk(self, problem: Problem, ops: Operands, config: Config) -> None:
        """Both split-K passes on the stream's float32 scratch, which the first fully
        writes."""
        plan, partial_key, ints, reduce_key, rest, reduce_constexprs = self._splitk_launch(
            problem, ops, config)
        work = self._scratch.get(ops.d.device, ops.stream, math.prod(plan.workspace))
        partial, finish = self._splitk_launchers()
        partial(partial_key, plan.grid, ops.stream, (ops.a, ops.b, work, *ints),
                lambda: dict(plan.constexprs, **load_units(problem, ops.a, ops.b)))
        finish(reduce_key, plan.reduce_grid, ops.stream, (work, *rest), reduce_constexprs)

    def _bind_splitk(self, problem: Problem, config: Config, ops: Operands):
        """Both split-K passes' kept kernels with the integers, alpha and beta of these
        calls filled in, each call finding its stream's scratch (None if a kernel is not
        kept)."""
        plan, partial_key, ints, reduce_key, rest, _ = self._splitk_launch(problem, ops, config)
        partial, finish = self._splitk_launchers()
        kept_partial, kept_finish = partial.kept(partial_key), finish.kept(reduce_key)
        if kept_partial is None or kept_finish is None:
            return None
        first, first_tail = kept_partial.runner, kept_partial.tail
        second, second_tail = kept_finish.runner, kept_finish.tail
        size, device, scratch = math.prod(plan.workspace), ops.d.device, self._scratch
        middle = rest[2:]  # the reduction's integers, alpha and beta

        def launch(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            work = scratch.get(device, stream, size)
            first(a, b, work, *ints, *first_tail, stream=stream)
            second(work, d if c is None else c, d, *middle, *second_tail, stream=stream)
        return launch
