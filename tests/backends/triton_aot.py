"""Compile a Triton kernel ahead of time for sm_90 (no GPU needed) and print what its PTX
holds as JSON. Run in a child process by the CPU tests, because the interpreter switch that
the rest of the CPU tier uses must not be set when kernels are compiled for real.

    python tests/backends/triton_aot.py {pointer|tma|tma_pointer_d|tma_c_n8_unit|tma_c_n8_plain|tma_tiles|dot|
        pointer_{a|b}_{row|col}_8s_{unit|plain}} {float16|bfloat16}
    python tests/backends/triton_aot.py float32 {ieee|tf32|tf32x3}
    python tests/backends/triton_aot.py {scaled|scaled_tma} {epilogue|block}
    python tests/backends/triton_aot.py quantize {row|block}
"""
from __future__ import annotations

import json
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from multibackend.backends.triton import kernels
from multibackend.backends.triton.configs import TMA_TILES
from multibackend.backends.triton.operands import _tile_constexprs, d_by_tma
from multibackend.core.config import Config
from multibackend.core.problem import synthetic

TYPES = {"float16": "fp16", "bfloat16": "bf16"}


def _signature(names_types, constexprs):
    sig = dict(names_types)
    for name in constexprs:
        sig[name] = "constexpr"
    return sig


def compile_pointer(dtype: str, precision: str = "ieee"):
    """The pointer kernel for 16-bit operands, or for float32 ones (``dtype`` "float32") with
    the precision mode's constants as the backend sets them for a launch."""
    t = "*fp32" if dtype == "float32" else f"*{TYPES[dtype]}"
    args = [("a_ptr", t), ("b_ptr", t), ("c_ptr", t), ("d_ptr", t), ("M", "i32"), ("N", "i32"),
            ("K", "i32"), ("stride_ab", "i32"), ("stride_am", "i32"), ("stride_bb", "i32"),
            ("stride_bk", "i32"), ("stride_cb", "i32"), ("stride_cm", "i32"),
            ("stride_cn", "i32"), ("stride_db", "i32"), ("stride_dm", "i32"),
            ("alpha", "fp32"), ("beta", "fp32")]
    consts = dict(stride_ak=1, stride_bn=1, stride_dn=1, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64,
                  GROUP_M=8, ACC=tl.float32, INPUT_PRECISION="ieee", HAS_C=False, EVEN_K=True,
                  UPCAST=False, SCALE=False, D_UNIT=1, WIDE_K=False, A_UNIT=1, A_COL=False,
                  B_UNIT=1, B_COL=False)
    if dtype == "float32":
        problem = synthetic(256, 256, 256, "float32", precision=precision)
        tile = Config.of("f32", BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_warps=8, num_stages=3)
        launch = _tile_constexprs(problem, tile)
        consts.update(BLOCK_N=128, BLOCK_K=32, ACC=launch["ACC"],
                      INPUT_PRECISION=launch["INPUT_PRECISION"])
    src = triton.compiler.ASTSource(fn=kernels.matmul_kernel,
                                    signature=_signature(args, consts), constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 8, "num_stages": 3})


def compile_pointer_8s(dtype: str, operand: str, col: bool, unit: int):
    """The pointer kernel (masked K) as a launch on 16-byte-aligned arrays specializes it,
    where one operand's (``operand`` "a" or "b") contiguous extent and leading dimension are
    multiples of 8 but not of 16 (1000: Triton sees no divisibility of either) and every
    other integer is a multiple of 16; ``col``: that operand is column-major (the other is
    row-major); ``unit``: the unit it is told (A_UNIT or B_UNIT)."""
    fn = kernels.matmul_kernel
    t = f"*{TYPES[dtype]}"
    a_col, b_col = operand == "a" and col, operand == "b" and col
    unseen = {("a", False): ("K", "stride_am"), ("a", True): ("M", "stride_ak"),
              ("b", False): ("N", "stride_bk"), ("b", True): ("K", "stride_bn")}[operand, col]
    consts = {"stride_am" if a_col else "stride_ak": 1, "stride_bk" if b_col else "stride_bn": 1,
              "stride_dn": 1}
    consts.update(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, ACC=tl.float32,
                  INPUT_PRECISION="ieee", HAS_C=False, EVEN_K=False, UPCAST=False,
                  SCALE=False, D_UNIT=1, WIDE_K=False,
                  A_UNIT=unit if operand == "a" else 1, A_COL=a_col,
                  B_UNIT=unit if operand == "b" else 1, B_COL=b_col)
    args = [(name, t if name.endswith("_ptr") else "fp32" if name in ("alpha", "beta")
             else "i32") for name in fn.arg_names if name not in consts]
    aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name, kind in args
               if kind != "fp32" and name not in unseen}
    src = triton.compiler.ASTSource(fn=fn, signature=_signature(args, consts),
                                    constexprs=consts, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 8, "num_stages": 3})


def compile_tma(dtype: str, d_tma: bool = True, tile: tuple = TMA_TILES[0],
                has_c: bool = False, d_unit: int | None = None):
    """The persistent TMA kernel for ``tile`` (an entry of TMA_TILES) as a launch on
    16-byte-aligned C and D specializes it; ``d_tma`` False: D stored through pointers (a D
    whose rows are off the 16-byte grid, or a product with C). ``d_unit``: the rows of C and
    D are 8 elements apart but not 16 (N = 1000: Triton sees no divisibility of their
    strides), with that D_UNIT."""
    e = TYPES[dtype]
    bm, bn, bk, warps, stages, group, ws = tile
    args = [("a_desc", f"tensordesc<{e}[{bm}, {bk}]>"), ("b_desc", f"tensordesc<{e}[{bk}, {bn}]>"),
            ("c_ptr", f"*{e}"), ("d_ptr", f"*{e}"), ("M", "i32"), ("N", "i32"), ("K", "i32"),
            ("stride_cm", "i32"), ("stride_dm", "i32"), ("alpha", "fp32"), ("beta", "fp32")]
    consts = dict(stride_cn=1, stride_dn=1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group,
                  NUM_PROGRAMS=132, ACC=tl.float32, B_KMAJOR=False, HAS_C=has_c, SCALE=has_c,
                  D_TMA=d_tma, WARP_SPECIALIZE=ws, D_UNIT=d_unit or 1)
    if d_tma:
        args.insert(2, ("d_desc", f"tensordesc<{e}[{bm}, {bn}]>"))
    else:
        consts["d_desc"] = None
    fn = kernels.matmul_tma_persistent_kernel
    shown = ("c_ptr", "d_ptr") + (() if d_unit else ("stride_cm", "stride_dm"))
    aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in shown}
    src = triton.compiler.ASTSource(fn=fn, signature=_signature(args, consts),
                                    constexprs=consts, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def tma_tiles_shared(dtype: str) -> dict:
    """Each TMA tile's shared memory in bytes, without C and with it, D aligned: the epilogue
    :func:`~multibackend.backends.triton.backend.d_by_tma` picks for each."""
    return {"shared_by_tile": {
        "x".join(map(str, tile)): [compile_tma(dtype, d_by_tma(True, has_c), tile,
                                               has_c).metadata.shared
                                   for has_c in (False, True)]
        for tile in TMA_TILES}}


def compile_scaled(mode: str):
    """The scaled fp8 kernel (e4m3, A row-major, B column-major, D bfloat16) in the GPU's
    default scaled tile, its scales applied once per tile (``mode`` "epilogue": tensor- or
    row-wise) or to each K step's partial sums ("block")."""
    from multibackend.backends.triton import scaled

    fn = scaled.matmul_scaled_kernel
    consts = dict(stride_ak=1, stride_bk=1, stride_dn=1, BLOCK_M=128, BLOCK_N=256, BLOCK_K=128,
                  GROUP_M=8, ACC=tl.float32, INPUT_PRECISION="ieee", EVEN_K=True,
                  UPCAST=False, WIDE_K=False, HAS_C=False, SCALE=False,
                  PER_STEP=mode == "block", SB_COLUMNS=128 if mode == "block" else 1,
                  SCALE_BLOCK=128)
    types = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "d_ptr": "*bf16",
             "sa_ptr": "*fp32", "sb_ptr": "*fp32", "alpha": "fp32", "beta": "fp32"}
    args = [(name, types.get(name, "i32")) for name in fn.arg_names if name not in consts]
    aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name, kind in args
               if kind == "i32" or name in ("a_ptr", "b_ptr", "d_ptr")}
    src = triton.compiler.ASTSource(fn=fn, signature=_signature(args, consts),
                                    constexprs=consts, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 8, "num_stages": 3})


def compile_scaled_tma(mode: str):
    """The scaled fp8 persistent TMA kernel (e4m3, B read K-major, D bfloat16 stored by the
    TMA unit) in the tile the backend offers first for ``mode``: "epilogue" (tensor- or
    row-wise scales: 256x128x128) or "block" (block-wise: 128x256x128)."""
    from multibackend.backends.triton import scaled
    from multibackend.backends.triton.configs import SCALED_TMA_TILES

    bm, bn, bk, warps, stages, group, ws = SCALED_TMA_TILES[0 if mode == "epilogue" else 1]
    fn = scaled.matmul_scaled_tma_kernel
    consts = dict(stride_cn=1, stride_dn=1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                  GROUP_M=group, NUM_PROGRAMS=132, HAS_C=False, SCALE=False, D_TMA=True,
                  D_UNIT=1, PER_STEP=mode == "block",
                  SB_COLUMNS=128 if mode == "block" else 1, SCALE_BLOCK=128,
                  WARP_SPECIALIZE=ws)
    types = {"a_desc": f"tensordesc<fp8e4nv[{bm}, {bk}]>",
             "b_desc": f"tensordesc<fp8e4nv[{bn}, {bk}]>",
             "d_desc": f"tensordesc<bf16[{bm}, {bn}]>", "c_ptr": "*bf16", "d_ptr": "*bf16",
             "sa_ptr": "*fp32", "sb_ptr": "*fp32", "alpha": "fp32", "beta": "fp32"}
    args = [(name, types.get(name, "i32")) for name in fn.arg_names if name not in consts]
    aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]]
               for name in ("c_ptr", "d_ptr", "stride_cm", "stride_dm")}
    src = triton.compiler.ASTSource(fn=fn, signature=_signature(args, consts),
                                    constexprs=consts, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def compile_quantize(mode: str):
    """The one-kernel fp8 quantization (bfloat16 rows in, e4m3 out) row-wise (``mode``
    "row") or block-wise ("block"), contiguous rows."""
    import torch

    from multibackend.backends.triton import quantize

    fn = quantize.quantize_rows_kernel
    block = mode == "block"
    consts = dict(stride_xk=1, LARGEST=float(torch.finfo(torch.float8_e4m3fn).max),
                  BLOCK_ROWS=quantize.BLOCK_ROWS,
                  BLOCK_K=128 if block else quantize.ROW_STEP, PER_BLOCK=block)
    types = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32"}
    args = [(name, types.get(name, "i32")) for name in fn.arg_names if name not in consts]
    aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]]
               for name in ("x_ptr", "q_ptr", "s_ptr", "K", "stride_xm", "stride_qm")}
    src = triton.compiler.ASTSource(fn=fn, signature=_signature(args, consts),
                                    constexprs=consts, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def compile_dot(dtype: str):
    t = f"*{TYPES[dtype]}"
    args = [("x_ptr", t), ("y_ptr", t), ("partial_ptr", "*fp32"), ("n", "i32")]
    consts = dict(stride_x=1, stride_y=1, BLOCK=4096, ACC=tl.float32)
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    src = triton.compiler.ASTSource(fn=kernels.dot_partial_kernel,
                                    signature=_signature(args, consts), constexprs=consts,
                                    attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})


def main() -> None:
    kind, dtype = sys.argv[1], sys.argv[2]
    if kind == "tma_tiles":
        print(json.dumps(tma_tiles_shared(dtype)))
        return
    compiled = {"pointer": compile_pointer, "tma": compile_tma, "dot": compile_dot,
                "scaled": compile_scaled, "scaled_tma": compile_scaled_tma,
                "quantize": compile_quantize,
                "float32": lambda precision: compile_pointer("float32", precision),
                "tma_pointer_d": lambda d: compile_tma(d, d_tma=False),
                "tma_c_n8_unit": lambda d: compile_tma(d, False, TMA_TILES[2], True, 8),
                "tma_c_n8_plain": lambda d: compile_tma(d, False, TMA_TILES[2], True, 1),
                **{f"pointer_{operand}_{layout}_8s_{told}": (
                    lambda d, operand=operand, col=layout == "col",
                    unit=8 if told == "unit" else 1: compile_pointer_8s(d, operand, col, unit))
                   for operand in ("a", "b") for layout in ("row", "col")
                   for told in ("unit", "plain")},
                }[kind](dtype)
    ptx = compiled.asm["ptx"]
    print(json.dumps({
        "target": ".target sm_90a" in ptx or ".target sm_90" in ptx,
        "wgmma": ptx.count("wgmma.mma_async"),
        "wgmma_tf32": ptx.count(".tf32.tf32"),
        "wgmma_e4m3": ptx.count(".e4m3.e4m3"),
        "f32_adds": ptx.count("add.f32") + ptx.count("add.rn.f32") + ptx.count("fma.rn.f32"),
        "mma_sync": ptx.count("mma.sync"),
        "tma_load": ptx.count("cp.async.bulk.tensor.2d.shared"),
        "tma_store": ptx.count("cp.async.bulk.tensor.2d.global"),
        "global_stores": ptx.count("st.global"),
        "d_element_stores": ptx.count("st.global.b16"),
        "element_loads": ptx.count("ld.global.b16"),
        "vector_loads": ptx.count("ld.global.v4") + ptx.count("ld.global.nc.v4"),
        "async_copies": ptx.count("cp.async.cg.shared.global") + ptx.count(
            "cp.async.ca.shared.global"),
        "shared": compiled.metadata.shared,
        "div_rn": ptx.count("div.rn.f32"),
        "div_approx": ptx.count("div.full.f32") + ptx.count("div.approx.f32"),
        "cvt_e4m3_rn": ptx.count("cvt.rn.satfinite.e4m3x2.f32"),
    }))


if __name__ == "__main__":
    main()
