"""The raw WMMA backend: CUDA C++ of our own against ``nvcuda::wmma`` (``raw_wmma/*.cu``),
compiled at run time by :mod:`multibackend.gpu.nvrtc` and launched through the CUDA driver API
(:mod:`multibackend.gpu.driver`).

Kernel families (one templated body each, one ``extern "C"`` entry point per instance):

- ``wmma_fast.cu``: the fast f16/bf16 GEMM (f32 accumulation): cp.async multi-stage pipeline,
  several fragments per warp, padded shared tiles, vectorized epilogue. Configs ``fast_*``.
  It needs 16-byte aligned operand rows; other problems take the generic kernel.
- ``wmma_generic.cu``: every byte-or-wider fragment type of the CUDA guide (f16 with f32 or f16
  accumulation, bf16, tf32, f64, s8, u8) in every shape, A and B row- or column-major (strided
  operands too), any alignment: tiles are staged element by element through aligned shared
  memory. Configs ``wmma_<m>x<n>x<k>``.
- ``wmma_subbyte.cu``: s4 / u4 (8x8x32) and b1 XOR / AND (8x8x128) on operands packed along K
  (see :mod:`multibackend.core.packing`).
- ``mma_kmajor.cu``: the PTX mma.sync GEMM on K-contiguous operands (A row-major, B
  column-major, 16-byte aligned rows), register fragments loaded by ldmatrix from a cp.async
  pipeline, two steps' fragments in registers: b1 AND (``m16n8k256`` or ``m16n8k128``), s8 and
  u8 (``m16n8k32``, int32 out), f16 and bf16 (``m16n8k16``, float32 accumulation), tf32
  (``m16n8k8``, float32 out) and, on sm_90, f64 (``m16n8k4``, fragments read with 8-byte
  shared loads). Configs ``mma_*``. On sm_90a the same pipeline feeds warpgroups' ``wgmma``
  (b1 AND, s8, u8, f16, bf16, tf32), which read both operands from the swizzled stages
  through shared memory descriptors (configs ``wgmma_*``), and the same wgmma GEMM is fed by
  the TMA unit: a producer warpgroup loads the stages through tensor maps
  (:mod:`multibackend.gpu.tensormap`) under mbarriers, optionally in 2-CTA clusters multicasting
  B (configs ``tma_*``, the default there). The TMA kernel reads f16 and bf16 operands in
  either major order as they lie (an M-major A or N-major B through wgmma's transpose bit), so
  plain ``A @ B`` and its transposes run on it with no copy. Products of the other types in
  other layouts reach these kernels on K-major staged copies (``staged:tma_*``,
  ``staged:mma_*``: see :mod:`multibackend.gpu.staging`), offered ahead of the WMMA kernels
  (after the fast one for f16 / bf16).
- ``dot.cu``: two-pass vector dot products for f16, bf16, f32 and f64.

Each kernel is compiled alone (``-DRW_ONLY=<entry>``) the first time it is needed and its
cubin cached on disk; ``prepare`` does it (and loads the cubin) ahead of a timed run.

Launching: the first call of a kind (problem, config, operand strides and alignment, alpha
and beta) builds its :class:`~multibackend.gpu.driver.Launch`: the loaded function, grid, block,
dynamic shared memory and an argument buffer laid out as the kernel's parameter list
(:data:`GEMM_PARAMS`, :data:`DOT_PARAMS`, :data:`DOT_FINAL_PARAMS`, kept in step with the
``extern "C"`` signatures, which a CPU test parses). Every later call of that kind, through
``run`` or the function ``bind`` returns, writes only the array pointers into the buffer and
calls ``cuLaunchKernel`` with the caller's raw stream handle: no allocation, no
synchronization, nothing CuPy or torch does per launch. The dot's scratch buffer for the
block partials is allocated once per (device, stream).
"""
from __future__ import annotations

import functools
import threading
from typing import Any, NamedTuple

from multibackend.backends.base import Backend
from multibackend.backends.raw_wmma.arguments import (
    BoundLaunch,
    DotLaunch,
    dot_arguments,
    dot_plan,
    gemm_arguments,
    gemm_c,
    gemm_grid,
    reduce_launch,
    tensor_maps,
    workspace_bytes,
)
from multibackend.backends.raw_wmma.kernels import (
    DOT_CONFIGS,
    DOT_FINAL_PARAMS,
    DOT_PARAMS,
    FAST_TILES,
    FRAGS,
    KMAJOR_OFFERED,
    KMAJOR_PREFIXES,
    MIN_CC,
    MMA_TILES,
    REDUCE_PARAMS,
    REDUCE_THREADS,
    TMA_TILES,
    WGMMA_TILES,
    Kernel,
    _wide_dot,
    dot_final_name,
    dot_kernel_name,
    fast_eligible,
    fragment,
    kernel_for,
    mma_eligible,
    mma_kind,
    reduce_kernel,
    tma_choice,
    tma_eligible,
    tma_tile,
    wgmma_eligible,
)
from multibackend.core import dtypes
from multibackend.core.capability import Capability, DtypeRule, Reason
from multibackend.core.config import Config, Operands
from multibackend.core.environment import package_version
from multibackend.core.problem import Problem
from multibackend.gpu import driver, native, nvrtc, staging
from multibackend.gpu.driver import TENSOR_MAP
from multibackend.raw_wmma import source_path

#: prepared launches kept for ``run`` (cleared when full)
LAUNCH_CACHE_LIMIT = 1024

_SATF_NOTE = ("saturate=True applies WMMA's satf in the epilogue (the f16 mma_sync of CUDA 13 "
              "takes no satf flag): +-inf -> +-65504, NaN -> +0")


def _saturate_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.saturate and (problem.in_dtype != "float16" or problem.d_dtype != "float16"):
        return ("saturate", f"saturate=True (satf) is offered for float16 inputs with a "
                            f"float16 output, not {problem.in_dtype} -> {problem.d_dtype}")
    return None


def _grid_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.op != "matmul":
        return None
    tiles = -(-problem.m // 32) * -(-problem.n // 32)
    if tiles > 2**31 - 1:
        return ("size", f"M={problem.m} x N={problem.n} needs {tiles} blocks of 32 x 32: more "
                        "than a grid holds (2**31 - 1)")
    return None


def _capability() -> Capability:
    i32 = ("int32",)
    rules = (
        DtypeRule("float16", accs=("float32", "float16"), outs=("float16", "float32"),
                  min_cc=MIN_CC),
        DtypeRule("bfloat16", accs=("float32",), outs=("bfloat16", "float32"), min_cc=MIN_CC),
        DtypeRule("float32", accs=("float32",), outs=("float32",), min_cc=MIN_CC,
                  precisions=("tf32",),
                  note="float32 operands are rounded to tf32 (__float_to_tf32) in the WMMA "
                       "and mma.sync fragments; the wgmma kernel's tensor cores ignore their "
                       "low 13 bits (truncation)"),
        DtypeRule("float64", accs=("float64",), outs=("float64",), min_cc=MIN_CC),
        DtypeRule("int8", accs=i32, outs=i32, min_cc=MIN_CC),
        DtypeRule("uint8", accs=i32, outs=i32, min_cc=MIN_CC),
        DtypeRule("int4", accs=i32, outs=i32, min_cc=MIN_CC,
                  note="s4 WMMA is emulated on sm_90 (a called IMMA.8816 routine): correct, "
                       "not fast", note_cc=((9, 0),)),
        DtypeRule("uint4", accs=i32, outs=i32, min_cc=MIN_CC,
                  note="u4 WMMA is emulated on sm_90 (a called IMMA.8816 routine): correct, "
                       "not fast", note_cc=((9, 0),)),
        DtypeRule("bit", accs=i32, outs=i32, min_cc=MIN_CC),
        DtypeRule("float16", accs=("float32", "float16"), outs=("float32", "float16"),
                  min_cc=MIN_CC, ops=("dot",)),
        DtypeRule("bfloat16", accs=("float32",), outs=("float32",), min_cc=MIN_CC, ops=("dot",)),
        DtypeRule("float32", accs=("float32",), outs=("float32",), min_cc=MIN_CC, ops=("dot",)),
        DtypeRule("float64", accs=("float64",), outs=("float64",), min_cc=MIN_CC, ops=("dot",)),
    )
    return Capability("raw_wmma", rules, batched=True, saturate=True,
                      extra_checks=(_saturate_rule, _grid_rule))


# ---- kernel choice (pure: from the Problem and Config alone) -----------------------------

class SplitLaunch(NamedTuple):
    """A split-K call as :meth:`RawWmmaBackend.bind` prepared it: the TMA kernel writing the
    partials, the second pass summing them, and the bytes of the partials."""

    gemm: driver.Launch
    reduce: driver.Launch
    nbytes: int


class RawWmmaBackend(Backend):
    name = "raw_wmma"
    takes_matrices = True  # the kernels read 2-D operands as batch-1 ones

    def __init__(self) -> None:
        self._capability = _capability()
        self._functions: dict[tuple[int, str], driver.Function] = {}
        self._scratch: dict[tuple[int, int, bool], tuple[Any, int]] = {}
        self._launches: dict[tuple, BoundLaunch] = {}
        self._prepared: dict[tuple, driver.Launch] = {}  # the bound gemms' launches
        self._lock = threading.Lock()

    @property
    def capability(self) -> Capability:
        return self._capability

    def available(self) -> Reason | None:
        try:
            import cuda.bindings.driver  # noqa: F401
            import torch
        except Exception as exc:  # noqa: BLE001 - recorded, never raised
            return self.unavailable("import", f"torch/cuda.bindings not importable: {exc}")
        try:
            if not torch.cuda.is_available():
                return self.unavailable("environment", "no CUDA GPU visible")
            nvrtc.compiler_version()
            nvrtc.include_dir()
        except Exception as exc:  # noqa: BLE001
            return self.unavailable("environment", str(exc))
        return None

    def versions(self) -> dict[str, str]:
        return {"compiler": nvrtc.compiler_version(),
                "cuda-bindings": package_version("cuda-bindings") or "none"}

    def note(self, problem: Problem) -> str | None:
        notes = [self.capability.note(problem)]
        if problem.op == "matmul":
            if problem.packed:
                if problem.a.layout != "row":
                    notes.append(f"A is {problem.a.layout}-major but sub-byte WMMA takes A "
                                 "row-major: it is transposed while staged into shared memory")
                if problem.b.layout != "col":
                    notes.append(f"B is {problem.b.layout}-major but sub-byte WMMA takes B "
                                 "column-major: it is transposed while staged into shared memory")
                if problem.bitop == "xor" and problem.cc == (9, 0):
                    notes.append("b1 XOR has no tensor-core instruction on sm_90: bmma_sync "
                                 "XOR is emulated from AND (correct, not fast)")

            if (mma_kind(problem) and fast_eligible(problem) and tma_eligible(problem)
                    and (why := mma_eligible(problem))):
                notes.append(f"WMMA kernel, not the PTX mma.sync one ({why})")
            if problem.saturate:
                notes.append(_SATF_NOTE)
            for name, op in (("A", problem.a), ("B", problem.b)):
                if op.layout == "strided":
                    notes.append(f"{name} is strided: staged element by element into shared "
                                 "memory")
            if (problem.in_dtype in ("float16", "bfloat16") and problem.acc == "float32"
                    and not problem.saturate):
                why = fast_eligible(problem)
                if why:
                    notes.append(f"generic kernel ({why}): operands staged element by element "
                                 "through aligned shared memory")
        return "; ".join(n for n in notes if n) or None

    def configs(self, problem: Problem) -> list[Config]:
        if problem.op == "dot":
            return [dot.config() for dot in DOT_CONFIGS.values()]
        out = []
        if tma_eligible(problem) is None:  # the backend's own choice of tile and splits first
            chosen = tma_choice(problem)
            out += [chosen.config()] + [tile.config() for tile in TMA_TILES.values()
                                        if tile != chosen]
        if wgmma_eligible(problem) is None:
            out += [tile.config() for tile in WGMMA_TILES.values()]
        # the K-major kernels on copies of A row-major and B column-major (staging.py): ahead
        # of the WMMA kernels, after the fast f16 / bf16 one (no copy, no stream pinning);
        # not for f16 / bf16 where the TMA kernel reads copies in their own order
        sixteen_bit = problem.in_dtype in ("float16", "bfloat16")
        kmajor = (staging.offered(self, problem, KMAJOR_OFFERED, kmajor=True,
                                  keep=lambda c: c.name.startswith(KMAJOR_PREFIXES))
                  if mma_kind(problem) and mma_eligible(problem) is not None
                  and not (sixteen_bit and tma_eligible(staging.staged_problem(problem)) is None)
                  else [])
        if not sixteen_bit:
            out += kmajor
        fast = fast_eligible(problem)
        if fast is not None and sixteen_bit:
            # the kernels on staged copies (see :mod:`multibackend.gpu.staging`) come first:
            # on sm_90a the TMA kernel's choice and tiles, then every fast tile
            if fast_eligible(staging.staged_problem(problem)) is None:
                out += staging.offered(self, problem, len(FAST_TILES) + len(TMA_TILES) + 1)
        if fast is None:
            out += [tile.config() for tile in FAST_TILES.values()]
        if sixteen_bit:
            out += kmajor
        if mma_eligible(problem) is None:
            out += [tile.config() for tile in MMA_TILES[mma_kind(problem)].values()]
        out += [fragment(frag).config() for frag in FRAGS.get(problem.in_dtype, ())]
        return out

    def config_named(self, problem: Problem, name: str) -> Config | None:
        """A TMA config the list leaves out: any tile of TMA_TILES with K in any number of
        splits up to MAX_SPLIT (``tma_<tile>_k<splits>``), or staged as the list stages the
        TMA kernel for this problem (``staged:tma_...``)."""
        inner = name.removeprefix(staging.PREFIX)
        tile = tma_tile(inner)
        if tile is None:
            return None
        if inner == name:
            return tile.config() if tma_eligible(problem) is None else None
        for offered in self.configs(problem):
            if staging.is_staged(offered) and tma_tile(staging.inner(offered).name):
                return staging.wrap(tile.config(), staging.is_kmajor(offered))
        return None

    # -- compile and load --

    def _function(self, problem: Problem, source: str, name: str, smem: int = 0,
                  arch_suffix: str = "") -> driver.Function:
        device = problem.device_index
        key = (device, name)
        fn = self._functions.get(key)
        if fn is None:
            with self._lock:
                fn = self._functions.get(key)
                if fn is None:
                    compiled = nvrtc.compile_cubin(source_path(source), name,
                                                   nvrtc.arch(device, problem.cc) + arch_suffix,
                                                   [f"RW_ONLY={name}"])
                    fn = driver.load(compiled.path.read_bytes(), name, device, smem)
                    self._functions[key] = fn
        return fn

    def prepare(self, problem: Problem, config: Config) -> None:
        problem, config = staging.unwrap(problem, config)
        kernel = kernel_for(problem, config)
        if problem.op == "dot":
            for vec in (True, False):
                self._function(problem, kernel.source, dot_kernel_name(problem, vec))
            self._function(problem, kernel.source, dot_final_name(problem))
        else:
            self._function(problem, kernel.source, kernel.name, kernel.smem, kernel.arch_suffix)
            if kernel.splits > 1:
                self._function(problem, kernel.source, reduce_kernel(problem))

    # -- launch --

    def run(self, problem: Problem, operands: Operands, config: Config) -> None:
        if staging.is_staged(config):
            staging.run(problem, operands, config, self.run)
            return
        self.bind(problem, config, operands)(operands.a, operands.b, operands.c, operands.d,
                                             operands.stream)

    def bind(self, problem: Problem, config: Config,
             operands: Operands) -> BoundLaunch | None:
        """The launch of ``problem`` under ``config`` for operands like ``operands``, prepared
        once and kept (keyed by what its argument buffer holds besides the array pointers);
        None for a staged config, whose copies :meth:`run` makes on every call."""
        if staging.is_staged(config):
            return None
        key = self._launch_key(problem, config, operands)
        bound = self._launches.get(key)
        if bound is None:
            kernel = kernel_for(problem, config)
            if problem.op == "dot":
                bound, prepared = self._bind_dot(problem, config, kernel, operands)
            else:
                bound, prepared = self._bind_gemm(problem, kernel, operands)
            with self._lock:
                if len(self._launches) >= LAUNCH_CACHE_LIMIT:
                    self._launches.clear()
                    self._prepared.clear()
                self._launches[key] = bound
                self._prepared[key] = prepared
        return bound

    def native(self, problem: Problem, config: Config,
               operands: Operands) -> native.Native | None:
        """The kernel's launch as :meth:`bind` prepared it, for a product without C — for a
        staged config, after the copies of :func:`staging.native_copies`, its kernel reading
        them where they lie (the plan runs on the caller's stream only); split-K's two passes
        with the partials of the caller's stream (the same); the dot's two passes with the
        block partials of the caller's stream (the same)."""
        if problem.op == "dot":
            return self._dot_native(problem, config, operands)
        if problem.batch != 1 or gemm_c(problem, operands) is not None:
            return None
        tile = tma_tile(staging.unwrap(problem, config)[1].name)
        copies, fixed, stream = (), {}, None
        if staging.is_staged(config):
            found = staging.native_copies(problem, operands, staging.is_kmajor(config))
            if found is None:
                return None
            copies, operands, fixed = found
            problem, config = staging.unwrap(problem, config)
            stream = operands.stream
            self.bind(problem, config, operands)
        prepared = self._prepared.get(self._launch_key(problem, config, operands))
        if prepared is None:
            return None
        split = prepared if isinstance(prepared, SplitLaunch) else None
        if split is not None:
            prepared = split.gemm
        # a TMA kernel reads A and B through tensor maps: their addresses are replaced per
        # call, a staged copy's map made once over its buffer
        tma = tile is not None
        slots = {(f"{role}_map" if tma else role): source + (native.MAP if tma else 0)
                 for role, source in (("a", native.A), ("b", native.B)) if role not in fixed}
        slots["d"] = native.D
        if tma and fixed:
            maps = dict(zip("ab", tensor_maps(problem, operands,
                                              kernel_for(problem, config))))
            fixed = {f"{role}_map": TENSOR_MAP.from_buffer_copy(maps[role].bytes())
                     for role in fixed}
        steps = [*copies]
        if split is not None:
            # split-K: both passes on partials held for the caller's stream, pinned to it (the
            # front queues a plan's steps together, holding the GIL: another call's steps
            # come before or after them)
            stream = operands.stream
            at = {"ws": staging.arena(operands.d, stream, "splitk", split.nbytes).data_ptr()}
            steps += [native.launch_step(prepared, slots, {**fixed, **at}, stream),
                      native.launch_step(split.reduce, {"d": native.D}, at, stream)]
        else:
            steps.append(native.launch_step(prepared, slots, fixed, stream))
        return native.Native(dtypes.torch_dtype(problem.d_dtype), (problem.m, problem.n),
                             prepared.function.context, tuple(steps),
                             keep=(prepared,) if split is None else (prepared, split.reduce))

    def _dot_native(self, problem: Problem, config: Config,
                    operands: Operands) -> native.Native | None:
        prepared = self._prepared.get(self._launch_key(problem, config, operands))
        if prepared is None:
            return None
        first, final, partial = prepared.first, prepared.final, prepared.partial
        stream, at = operands.stream, {"partial": partial(operands.stream)}
        steps = (native.launch_step(first, {"x": native.A, "y": native.B}, at, stream),
                 native.launch_step(final, {"out": native.D}, at, stream))
        return native.Native(dtypes.torch_dtype(problem.d_dtype), (), first.function.context,
                             steps, keep=(prepared,))

    @staticmethod
    def _launch_key(problem: Problem, config: Config, ops: Operands) -> tuple:
        """Everything a prepared launch holds that the arrays' pointers do not give: the
        problem, the config, the operands' strides and the alignments the kernels test."""
        a, b = ops.a, ops.b
        if problem.op == "dot":
            return (problem, config.name, a.stride(), b.stride(), a.data_ptr() % 16 == 0,
                    b.data_ptr() % 16 == 0)
        c = gemm_c(problem, ops)
        return (problem, config.name, a.stride(), b.stride(), a.shape[-1],
                c.stride() if c is not None else None, ops.d.data_ptr() % 16 == 0,
                ops.alpha, ops.beta)

    def _bind_gemm(self, problem: Problem, kernel: Kernel,
                   ops: Operands) -> tuple[BoundLaunch, driver.Launch | SplitLaunch]:
        """The bound launch, and its :class:`~multibackend.gpu.driver.Launch` (with split-K,
        its :class:`SplitLaunch`)."""
        fn = self._function(problem, kernel.source, kernel.name, kernel.smem, kernel.arch_suffix)
        values = gemm_arguments(problem, ops, kernel)
        if kernel.tma_boxes:
            maps = tensor_maps(problem, ops, kernel)
            values.update(a_map=maps[0].bytes(), b_map=maps[1].bytes())
        args = driver.Arguments(kernel.name, kernel.params, values)
        prepared = driver.Launch(fn, gemm_grid(problem, kernel), (kernel.threads, 1, 1),
                                 kernel.smem, args)
        launch = prepared.launch
        slots, with_c, lock = args.values, gemm_c(problem, ops) is not None, threading.Lock()
        if kernel.tma_boxes:
            import torch

            fields = (args.field_address("a_map"), args.field_address("b_map"))
            second = self._reduce(problem, ops, kernel) if kernel.splits > 1 else None
            if second is not None:
                prepared = SplitLaunch(prepared, *second)

            def bound_tma(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
                with lock:  # the maps and slots are shared: one launch at a time
                    for tmap, array, field in zip(maps, (a, b), fields):
                        if array.data_ptr() != tmap.address:
                            tmap.point_at(array.data_ptr())
                            tmap.write(field)
                    if with_c:
                        slots.c = c.data_ptr()
                    slots.d = d.data_ptr()
                    if second is None:
                        launch(stream)
                        return
                    reduce, nbytes = second
                    # this call's own partials, from torch's allocator on the call's stream
                    # (current here): no other call, on any thread, writes them before this
                    # call's second pass has read them
                    ws = torch.empty(nbytes, dtype=torch.uint8, device=d.device)
                    slots.ws = reduce.args.values.ws = ws.data_ptr()
                    if with_c:
                        reduce.args.values.c = slots.c
                    reduce.args.values.d = slots.d
                    launch(stream)
                    reduce.launch(stream)
            return bound_tma, prepared

        def bound(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            with lock:  # the slots are shared: one launch at a time writes and reads them
                slots.a = a.data_ptr()
                slots.b = b.data_ptr()
                if with_c:
                    slots.c = c.data_ptr()
                slots.d = d.data_ptr()
                launch(stream)
        return bound, prepared

    def _reduce(self, problem: Problem, ops: Operands,
                kernel: Kernel) -> tuple[driver.Launch, int]:
        """Split-K's second pass for a TMA kernel of ``kernel.splits`` splits, and the bytes
        of the partials it reads (what :class:`SplitLaunch` holds beside the first)."""
        name = reduce_kernel(problem)
        fn = self._function(problem, kernel.source, name)
        values, grid = reduce_launch(problem, ops, kernel)
        args = driver.Arguments(name, REDUCE_PARAMS, values)
        return (driver.Launch(fn, grid, (REDUCE_THREADS, 1, 1), 0, args),
                workspace_bytes(problem, kernel))

    def _bind_dot(self, problem: Problem, config: Config, kernel: Kernel,
                  ops: Operands) -> tuple[BoundLaunch, DotLaunch]:
        """The bound launch of the dot's two passes, and their :class:`DotLaunch`."""
        import torch

        device = problem.device_index
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        vec, blocks = dot_plan(problem, ops, config, sms)
        wide = _wide_dot(problem)
        first_fn = self._function(problem, kernel.source, dot_kernel_name(problem, vec))
        final_fn = self._function(problem, kernel.source, dot_final_name(problem))
        first_values, final_values = dot_arguments(
            problem, ops, self._partials(device, ops.stream, sms, wide), blocks)
        first_args = driver.Arguments(first_fn.name, DOT_PARAMS, first_values)
        final_args = driver.Arguments(final_fn.name, DOT_FINAL_PARAMS, final_values)
        block = (kernel.threads, 1, 1)
        prepared = DotLaunch(driver.Launch(first_fn, (blocks, 1, 1), block, 0, first_args),
                             driver.Launch(final_fn, (1, 1, 1), block, 0, final_args),
                             functools.partial(self._partials, device, sms=sms, wide=wide))
        first, final, partials = prepared.first.launch, prepared.final.launch, prepared.partial
        first_slots, final_slots, lock = first_args.values, final_args.values, threading.Lock()

        def bound(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            partial = partials(stream)
            with lock:  # the slots are shared: one launch at a time writes and reads them
                first_slots.x = a.data_ptr()
                first_slots.y = b.data_ptr()
                first_slots.partial = final_slots.partial = partial
                final_slots.out = d.data_ptr()
                first(stream)
                final(stream)
        return bound, prepared

    def _partials(self, device: int, stream: int, sms: int, wide: bool) -> int:
        """The address of a per-(device, stream) buffer for the dot's block partials (float64
        when ``wide``, else float32), kept for the backend's life (so no allocator can hand it
        to other work while a kernel on ``stream`` reads it)."""
        key = (device, stream, wide)
        found = self._scratch.get(key)
        if found is None:
            import torch

            with self._lock:
                found = self._scratch.get(key)
                if found is None:
                    buf = torch.empty(max(d.blocks_per_sm for d in DOT_CONFIGS.values()) * sms,
                                      dtype=torch.float64 if wide else torch.float32,
                                      device=f"cuda:{device}")
                    found = self._scratch[key] = (buf, buf.data_ptr())
        return found[1]


def create() -> Backend:
    return RawWmmaBackend()
