"""GPU tier of the raw WMMA backend: every dtype x layout x config through the public calls,
on fresh random ragged shapes, against float64; integer, sub-byte and b1 results exact;
outputs poisoned before every run so an element a kernel skipped fails.

Every kernel the module runs is compiled first, in parallel processes (NVRTC, cached on
disk), by one process of the session, so the tests themselves only load cubins.
"""
from __future__ import annotations

import fcntl
import itertools
import math
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import multibackend  # noqa: E402
from multibackend.backends.raw_wmma import backend as rw
from multibackend.backends.raw_wmma import kernels as rw_kernels
from multibackend.core import packing
from multibackend.core.problem import synthetic, synthetic_dot
from multibackend.gpu import cache, nvrtc
from multibackend.raw_wmma import SOURCE_DIR
from multibackend.verify import reference
from tests.helpers import poisoned, random_tensor  # noqa: E402

BACKEND = rw.create()
DEVICE = "cuda"
LAYOUTS = list(itertools.product(("row", "col"), repeat=2))
#: (dtype, output, accumulator, precision)
FLOAT_TYPES = [
    ("float16", "float16", "float32", None),
    ("float16", "float32", "float32", None),
    ("float16", "float16", "float16", None),
    ("bfloat16", "bfloat16", "float32", None),
    ("bfloat16", "float32", "float32", None),
    ("float32", "float32", "float32", "tf32"),
    ("float64", "float64", "float64", None),
]
INT_TYPES = [("int8", "int32", "int32", None), ("uint8", "int32", "int32", None)]
#: ragged (M, N, K) cases; each test takes a few of them in turn, all of them appear
SHAPES = [(1, 1, 1), (7, 17, 16), (16, 31, 17), (127, 129, 31), (1000, 7, 129),
          (17, 1000, 127), (129, 16, 1000), (33, 65, 4097), (31, 7, 7), (129, 127, 16)]


def _cc() -> tuple[int, int]:
    return torch.cuda.get_device_capability()


def _arch() -> str:
    major, minor = _cc()
    return f"sm_{major}{minor}"


def _torch_dtype(name: str):
    return getattr(torch, name)


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(hash(key) % (2**31))


def _matrix(batch, rows, cols, layout, dtype, gen, *, pad=1, small_int=False):
    """A (batch, rows, cols) view in ``layout`` whose leading dimension is rounded up to
    ``pad`` elements (the rest of each row is never read)."""
    if layout == "row":
        ld = -(-cols // pad) * pad
        base = random_tensor((batch, rows, ld), dtype, DEVICE, generator=gen, small_int=small_int)
        return base[:, :, :cols]
    ld = -(-rows // pad) * pad
    base = random_tensor((batch, cols, ld), dtype, DEVICE, generator=gen, small_int=small_int)
    return base[:, :, :rows].transpose(1, 2)


def _run_and_check(t, layouts, config, m, n, k, *, batch=1, with_c=False, pad=1):
    dtype, out, acc, precision = t
    gen = _gen(t, layouts, config, m, n, k, batch)
    is_int = dtype in ("int8", "uint8")
    tdt = _torch_dtype(dtype)
    a = _matrix(batch, m, k, layouts[0], tdt, gen, pad=pad)
    b = _matrix(batch, k, n, layouts[1], tdt, gen, pad=pad)
    odt = _torch_dtype(out)
    c = random_tensor((batch, m, n), odt, DEVICE, generator=gen) if with_c else None
    alpha, beta = ((2, -1) if is_int else (0.5, 2.0)) if with_c else (1, None)
    d = poisoned((batch, m, n), odt, DEVICE)
    multibackend.matmul(a, b, c, alpha=alpha, beta=beta, out=d, out_dtype=out, acc_dtype=acc,
                        precision=precision, backend="raw_wmma", config=config)
    ref = reference.reference_matmul(a, b, c, alpha, beta if with_c else 0)
    problem = synthetic(m, n, k, dtype, batch=batch, out_dtype=out, acc=acc,
                        precision=precision, has_c=with_c)
    cmp = reference.compare(problem, d, ref)
    assert cmp.ok, (f"{dtype}->{out} acc {acc} {layouts} {config} {batch}x{m}x{n}x{k}: "
                    f"{cmp.detail}")


def _problem(t, layouts, m=200, n=264, k=144):
    dtype, out, acc, precision = t
    return synthetic(m, n, k, dtype, a_layout=layouts[0], b_layout=layouts[1], out_dtype=out,
                     acc=acc, precision=precision, cc=None)


def _plan():
    """(type, layouts, config name) for every case below."""
    for t in FLOAT_TYPES + INT_TYPES:
        for layouts in LAYOUTS:
            for config in BACKEND.configs(_problem(t, layouts)):
                yield t, layouts, config.name


PLAN = list(_plan())


def _compile(source_and_name: tuple[str, str, str]) -> None:
    source, name, arch = source_and_name
    nvrtc.compile_cubin(SOURCE_DIR / source, name, arch, [f"RW_ONLY={name}"])


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    """Compile every kernel of the plan (and the sub-byte and dot kernels) in parallel."""
    arch = _arch()
    jobs = set()
    for t, layouts, name in PLAN:
        problem = _problem(t, layouts)
        config = next(c for c in BACKEND.configs(problem) if c.name == name)
        kernel = rw_kernels.kernel_for(problem, config)
        jobs.add((kernel.source, kernel.name, arch + kernel.arch_suffix))
    for kind in ("s4", "u4", "b1xor", "b1and"):
        jobs.add(("wmma_subbyte.cu", f"rw_gemm_{kind}_s32_8x8x{128 if kind[0] == 'b' else 32}",
                  arch))
    for short in ("f16", "bf16", "f32", "f64"):
        for form in ("vec", "strided"):
            jobs.add(("dot.cu", f"rw_dot_{short}_{form}", arch))
    jobs |= {("dot.cu", "rw_dot_f16_vec_hfma2", arch), ("dot.cu", "rw_dot_final_f32", arch),
             ("dot.cu", "rw_dot_final_f64", arch)}
    # one process of a pytest-xdist session compiles; the others wait, then find them cached
    with open(cache.cache_dir(nvrtc.CACHE_KIND) / "prebuild.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
                list(pool.map(_compile, sorted(jobs)))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.mark.parametrize("t,layouts,config", PLAN,
                         ids=[f"{t[0]}-{t[1]}-acc{t[2]}-{l[0][0]}{l[1][0]}-{c}"
                              for t, l, c in PLAN])
def test_matmul_every_dtype_layout_config(t, layouts, config):
    index = PLAN.index((t, layouts, config))
    shapes = [SHAPES[(index + i) % len(SHAPES)] for i in range(3)]
    # fast, mma, wgmma and tma configs need 16-byte aligned rows: keep ld a multiple of 16
    # bytes, the sizes ragged
    pad = 16 // _torch_dtype(t[0]).itemsize \
        if config.startswith(("fast_", "mma_", "wgmma_", "tma_")) else 1
    for m, n, k in shapes:
        _run_and_check(t, layouts, config, m, n, k, pad=pad)
    _run_and_check(t, layouts, config, 37, 45, 53, batch=3, with_c=True, pad=pad)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fast_kernel_on_large_ragged_shape(dtype):
    t = (dtype, dtype, "float32", None)
    _run_and_check(t, ("row", "row"), "fast_128x256x32_s3", 1000, 1031, 1029, pad=8)
    _run_and_check(t, ("col", "col"), "fast_128x128x32_s4", 257, 383, 4097, pad=8)


@pytest.mark.parametrize("t", [INT_TYPES[0], INT_TYPES[1], FLOAT_TYPES[0], FLOAT_TYPES[4],
                               FLOAT_TYPES[5], FLOAT_TYPES[6]],
                         ids=["int8", "uint8", "float16", "bfloat16-float32", "tf32", "float64"])
def test_ptx_mma_kernel_on_large_ragged_shapes(t):
    """The K-major mma.sync and (on sm_90a) wgmma and TMA-fed wgmma kernels over many
    k-tiles, ragged in M, N and K, with and without C; the first of them is the backend's
    default for A row-major and B column-major."""
    kind = rw_kernels.MMA_KINDS[t[0]]
    if kind in rw_kernels.MMA_SM90 and _cc() < (9, 0):
        pytest.skip(f"{kind} mma.sync needs sm_90")
    dtype, out, acc, precision = t
    problem = synthetic(200, 264, 144, dtype, b_layout="col", out_dtype=out, acc=acc,
                        precision=precision, cc=_cc())
    configs = [c.name for c in BACKEND.configs(problem)]
    wgmma = kind in rw_kernels.WGMMA_KINDS and _cc() == rw_kernels.WGMMA_CC
    tiles = [*(rw_kernels.TMA_TILES if wgmma else ()), *(rw_kernels.WGMMA_TILES if wgmma else ()),
             *rw_kernels.MMA_TILES[kind]]
    assert configs[0] == tiles[0] if wgmma or kind not in ("f16", "bf16") else \
        configs[0].startswith("fast_")
    pad = 16 // _torch_dtype(t[0]).itemsize
    for config in tiles:
        _run_and_check(t, ("row", "col"), config, 1000, 1031, 1029, pad=pad)
        _run_and_check(t, ("row", "col"), config, 257, 383, 4099, batch=2, with_c=True,
                       pad=pad)


@pytest.mark.parametrize("layouts", [("row", "row"), ("col", "col"), ("col", "row")],
                         ids=["rr", "cc", "cr"])
@pytest.mark.parametrize("t", [FLOAT_TYPES[0], FLOAT_TYPES[4]],
                         ids=["float16", "bfloat16-float32"])
def test_tma_kernel_on_mn_major_operands(t, layouts):
    """The TMA kernel reading an M-major A or an N-major B where it lies (wgmma's transpose
    bits), over many k-tiles, ragged in M, N and K, batched with C; it is the backend's default
    for those orders on sm_90a."""
    if _cc() != rw_kernels.WGMMA_CC:
        pytest.skip("the TMA kernel needs sm_90a")
    problem = synthetic(200, 264, 144, t[0], a_layout=layouts[0], b_layout=layouts[1],
                        out_dtype=t[1], cc=_cc())
    assert BACKEND.configs(problem)[0].name == next(iter(rw_kernels.TMA_TILES))
    for config in rw_kernels.TMA_TILES:
        _run_and_check(t, layouts, config, 1000, 1031, 1029, pad=8)
        _run_and_check(t, layouts, config, 257, 383, 4099, batch=2, with_c=True, pad=8)
        _run_and_check(t, layouts, config, 45, 40, 300, pad=8)  # M and N inside one box


@pytest.mark.parametrize("t,layouts,config", [
    (FLOAT_TYPES[0], ("row", "row"), "tma_64x256_c1_k4"),
    (FLOAT_TYPES[3], ("row", "col"), "tma_128x256_c1_k3"),
    (FLOAT_TYPES[1], ("col", "row"), "tma_128x256_c2_k5"),
    (FLOAT_TYPES[5], ("row", "col"), "tma_64x256_c1_k7"),
    (INT_TYPES[0], ("row", "col"), "tma_64x256_c1_k4"),
    (INT_TYPES[1], ("row", "col"), "tma_128x256_c1_k16"),
], ids=["f16-rr-64-k4", "bf16-rc-128-k3", "f16f32-cr-c2-k5", "tf32-rc-64-k7", "s8-rc-64-k4",
        "u8-rc-128-k16"])
def test_tma_split_k_sums_every_split_once(t, layouts, config):
    """Split-K: each split's partial written to the call's workspace and the second pass
    summing them with alpha, beta and C, on ragged shapes (K not a multiple of the splits'
    k-tiles, splits past the last k-tile summing zeros), batched; integers exact."""
    if _cc() != rw_kernels.WGMMA_CC:
        pytest.skip("the TMA kernel needs sm_90a")
    pad = 16 // _torch_dtype(t[0]).itemsize
    _run_and_check(t, layouts, config, 50, 1000, 4099, pad=pad)
    _run_and_check(t, layouts, config, 257, 383, 1029, batch=2, with_c=True, pad=pad)
    _run_and_check(t, layouts, config, 7, 300, 200, pad=pad)  # fewer k-tiles than splits


def test_tma_choice_runs_decode_shapes_split_and_graph_replays_them():
    """The backend's own choice for decode-sized products (64-row tiles, K split) is right in
    eager calls and when captured in a CUDA graph and replayed on new values."""
    if _cc() != rw_kernels.WGMMA_CC:
        pytest.skip("the TMA kernel needs sm_90a")
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    for m, n, k in ((1, 4096, 4096), (16, 1024, 5120)):
        a = torch.randint(-4, 5, (m, k), generator=gen, device=DEVICE).half()
        b = torch.randint(-4, 5, (k, n), generator=gen, device=DEVICE).half()
        assert "_k" in multibackend.explain(a, b, backend="raw_wmma").config.name
        exact = (a.double() @ b.double()).half()
        assert torch.equal(multibackend.matmul(a, b, backend="raw_wmma"), exact)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = multibackend.matmul(a, b, backend="raw_wmma")
        a.copy_(torch.randint(-4, 5, (m, k), generator=gen, device=DEVICE).half())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, (a.double() @ b.double()).half())


def test_misaligned_operands_take_the_generic_kernel():
    gen = _gen("misaligned")
    m, n, k = 129, 65, 77
    flat = random_tensor((m * k + 1,), torch.float16, DEVICE, generator=gen)
    a = flat[1:].view(m, k)  # pointer 2 bytes off, ld 77 halves
    b = random_tensor((k, n), torch.float16, DEVICE, generator=gen)
    explained = multibackend.explain(a, b, backend="raw_wmma")
    assert "16-byte aligned" in str(explained)
    d = poisoned((m, n), torch.float16, DEVICE)
    multibackend.matmul(a, b, out=d, backend="raw_wmma")
    cmp = reference.compare(synthetic(m, n, k), d, reference.reference_matmul(a, b))
    assert cmp.ok, cmp.detail


def test_strided_operand():
    gen = _gen("strided")
    base = random_tensor((3, 40, 50), torch.float16, DEVICE, generator=gen)
    a = base[:, ::2, ::3][0]  # neither row- nor column-major
    b = random_tensor((a.shape[1], 19), torch.float16, DEVICE, generator=gen)
    d = poisoned((a.shape[0], 19), torch.float16, DEVICE)
    multibackend.matmul(a, b, out=d, backend="raw_wmma")
    cmp = reference.compare(synthetic(a.shape[0], 19, a.shape[1]), d,
                            reference.reference_matmul(a, b))
    assert cmp.ok, cmp.detail


@pytest.mark.parametrize("acc", ["float32", "float16"])
def test_saturate(acc):
    m, n, k = 20, 24, 16
    a = torch.full((m, k), 300.0, dtype=torch.float16, device=DEVICE)
    b = torch.full((k, n), 300.0, dtype=torch.float16, device=DEVICE)
    a[3, 5] = float("nan")
    b[:, 7] = -300.0
    d = poisoned((m, n), torch.float16, DEVICE)
    multibackend.matmul(a, b, out=d, acc_dtype=acc, saturate=True, backend="raw_wmma")
    expect = torch.full((m, n), 65504.0, dtype=torch.float32, device=DEVICE)
    expect[:, 7] = -65504.0
    expect[3, :] = 0.0  # NaN -> +0
    assert torch.equal(d.float(), expect)
    plain = multibackend.matmul(a, b, acc_dtype=acc, backend="raw_wmma")
    assert torch.isinf(plain[0, 0])


PACKED = [("int4", None), ("uint4", None), ("bit", "xor"), ("bit", "and")]
PACKED_SHAPES = [(1, 1, 8), (7, 9, 30), (33, 65, 128), (129, 17, 250), (64, 130, 1000),
                 (5, 3, 4097)]


def _packed_operands(kind, m, n, k, layouts, gen, batch=1):
    if kind == "bit":
        a = torch.randint(0, 2, (batch, m, k), generator=gen)
        b = torch.randint(0, 2, (batch, k, n), generator=gen)
        ap, bp = packing.pack_bits(a, -1), packing.pack_bits(b, -2)
    else:
        lo, hi = (-8, 8) if kind == "int4" else (0, 16)
        a = torch.randint(lo, hi, (batch, m, k), generator=gen)
        b = torch.randint(lo, hi, (batch, k, n), generator=gen)
        signed = kind == "int4"
        ap, bp = packing.pack_int4(a, -1, signed=signed), packing.pack_int4(b, -2, signed=signed)
    ap, bp = ap.to(DEVICE), bp.to(DEVICE)
    if layouts[0] == "col":
        ap = ap.transpose(1, 2).contiguous().transpose(1, 2)
    if layouts[1] == "col":
        bp = bp.transpose(1, 2).contiguous().transpose(1, 2)
    return ap, bp


@pytest.mark.parametrize("kind,op", PACKED)
@pytest.mark.parametrize("layouts", LAYOUTS)
def test_packed_matmul_exact(kind, op, layouts):
    for i, (m, n, k) in enumerate(PACKED_SHAPES):
        batch = 2 if i == 2 else 1
        gen = _gen(kind, op, layouts, m, n, k)
        ap, bp = _packed_operands(kind, m, n, k, layouts, gen, batch)
        kp = ap.shape[-1] * packing.PER_BYTE[kind]
        d = poisoned((batch, m, n), torch.int32, DEVICE)
        if kind == "bit":
            multibackend.binary_matmul(ap, bp, op=op, out=d, backend="raw_wmma")
        else:
            multibackend.matmul(ap, bp, dtype=kind, out=d, backend="raw_wmma")
        ref = packing.reference_packed(synthetic(m, n, kp, kind, bitop=op, batch=batch), ap, bp)
        assert torch.equal(d.to(torch.int64), ref), f"{kind} {op} {layouts} {m}x{n}x{k}"


def test_packing_round_trips_on_the_device():
    gen = _gen("pack")
    v = torch.randint(-8, 8, (5, 37), generator=gen).to(DEVICE)
    assert torch.equal(packing.unpack_int4(packing.pack_int4(v), length=37).long(), v)
    bits = torch.randint(0, 2, (37, 5), generator=gen).to(DEVICE)
    assert torch.equal(packing.unpack_bits(packing.pack_bits(bits, 0), 0, length=37).long(), bits)


DOT_SIZES = [1, 7, 8, 9, 1000, 4097, (1 << 20) + 3]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("form", ["contiguous", "offset", "strided"])
@pytest.mark.parametrize("config", list(rw_kernels.DOT_CONFIGS))
def test_dot(dtype, form, config):
    tdt = _torch_dtype(dtype)
    for n in DOT_SIZES:
        gen = _gen("dot", dtype, form, n)
        span = {"contiguous": n, "offset": n + 1, "strided": 2 * n}[form]
        x_all = random_tensor((span,), tdt, DEVICE, generator=gen)
        y_all = random_tensor((span,), tdt, DEVICE, generator=gen)
        if form == "offset":
            x, y = x_all[1:], y_all[1:]
        elif form == "strided":
            x, y = x_all[::2], y_all[::2]
        else:
            x, y = x_all, y_all
        got = multibackend.dot(x, y, backend="raw_wmma", config=config)
        problem = synthetic_dot(n, dtype)
        cmp = reference.compare(problem, got.reshape(1), reference.reference_dot(x, y))
        assert cmp.ok, f"{dtype} {form} n={n}: {cmp.detail}"


def test_dot_f16_accumulator_uses_hfma2_within_its_bound():
    n = (1 << 22) + 5
    gen = _gen("hfma2")
    x = random_tensor((n,), torch.float16, DEVICE, generator=gen)
    y = random_tensor((n,), torch.float16, DEVICE, generator=gen)
    got = multibackend.dot(x, y, acc_dtype="float16", backend="raw_wmma")
    cmp = reference.compare(synthetic_dot(n, acc="float16"), got.reshape(1),
                            reference.reference_dot(x, y))
    assert cmp.ok, cmp.detail
    assert math.isfinite(float(got))


#: (M, N, K bytes, batch) for the PTX b1 kernel: ragged M and N, K ending inside a 16-byte
#: chunk and inside a 128-byte k-tile, a broadcast B
B1_SHAPES = [(1, 3, 16, 1), (130, 260, 144, 1), (257, 129, 1040, 2), (64, 8, 2064, 1),
             (300, 520, 100, 1)]


def _b1_operands(m, n, kbytes, batch, gen):
    """A row-major and B column-major, each row 16-byte aligned and sliced out of a wider
    random buffer: the bytes past K are not zero, so a kernel that read them would fail."""
    ld = -(-kbytes // 16) * 16 + 16
    a = torch.randint(0, 256, (batch, m, ld), generator=gen, dtype=torch.uint8).to(DEVICE)
    b = torch.randint(0, 256, (n, ld), generator=gen, dtype=torch.uint8).to(DEVICE)
    return a[..., :kbytes], b[:, :kbytes].T


@pytest.mark.parametrize("config", [*rw_kernels.MMA_TILES["b1and"], *rw_kernels.WGMMA_TILES, *rw_kernels.TMA_TILES])
def test_ptx_b1_kernel_exact_with_and_without_c(config):
    from multibackend.choose.dispatch import decide
    from multibackend.io.request import matmul_call
    from multibackend.run.execute import execute

    if (config in rw_kernels.WGMMA_TILES or config in rw_kernels.TMA_TILES) and _cc() != rw_kernels.WGMMA_CC:
        pytest.skip("wgmma needs sm_90a")
    gen = torch.Generator().manual_seed(len(config))
    for m, n, kbytes, batch in B1_SHAPES:
        a, b = _b1_operands(m, n, kbytes, batch, gen)
        problem = synthetic(m, n, kbytes * 8, "bit", bitop="and", batch=batch)
        ref = packing.reference_packed(problem, a, b)
        d = poisoned((batch, m, n), torch.int32, DEVICE)
        call = matmul_call(a, b, None, alpha=1, beta=0, out=d, out_dtype="int32",
                           acc_dtype="int32", packed="bit", bitop="and", op="binary_matmul")
        assert rw_kernels.mma_eligible(call.problem) is None, call.problem.describe()
        if config in rw_kernels.TMA_TILES and batch > 1:  # B is shared by the batch: refused
            assert "batch stride 0" in rw_kernels.tma_eligible(call.problem)
            continue
        chosen = next(c for c in BACKEND.configs(call.problem) if c.name == config)
        execute(call, decide(call.problem, "raw_wmma", chosen))
        assert torch.equal(d.to(torch.int64), ref), (config, m, n, kbytes, batch)
        c = torch.randint(-50, 50, (batch, m, n), generator=gen, dtype=torch.int32).to(DEVICE)
        call = matmul_call(a, b, c, alpha=3, beta=-2, out_dtype="int32", acc_dtype="int32",
                           packed="bit", bitop="and", op="binary_matmul")
        poisoned_d = call.operands.d.fill_(-7)
        execute(call, decide(call.problem, "raw_wmma", chosen))
        want = 3 * ref - 2 * c.to(torch.int64)
        assert torch.equal(poisoned_d.to(torch.int64), want), (config, "with C", m, n, kbytes)


def test_binary_matmul_and_takes_the_ptx_kernel_for_aligned_operands():
    """Aligned AND products default to the K-major kernel (TMA-fed wgmma on sm_90a), exact,
    and its paired stores are not taken for a D that is not 8-byte aligned."""
    from multibackend.io.request import matmul_call

    gen = torch.Generator().manual_seed(11)
    a, b = _b1_operands(200, 300, 512, 1, gen)
    a = a[0]
    call = matmul_call(a, b, None, alpha=1, beta=0, out_dtype="int32", acc_dtype="int32",
                       packed="bit", bitop="and", op="binary_matmul")
    chosen = multibackend.explain(call.problem, backend="raw_wmma").config
    first = rw_kernels.TMA_TILES if _cc() == rw_kernels.WGMMA_CC else rw_kernels.MMA_TILES["b1and"]
    assert chosen.name == next(iter(first))
    d = multibackend.binary_matmul(a, b, op="and", backend="raw_wmma")
    ref = packing.reference_packed(synthetic(200, 300, 4096, "bit", bitop="and"), a, b)
    assert torch.equal(d.to(torch.int64), ref[0])
    # D one int past an 8-byte boundary: the paired stores must not be taken
    store = torch.full((200 * 300 + 1,), -7, dtype=torch.int32, device=DEVICE)
    out = store[1:].view(200, 300)
    multibackend.binary_matmul(a, b, op="and", out=out, backend="raw_wmma")
    assert torch.equal(out.to(torch.int64), ref[0]) and store[0] == -7
