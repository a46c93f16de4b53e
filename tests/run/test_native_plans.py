"""CPU tier for native plans (multibackend/native.py): launches of our kernels described once
and run by the compiled front. Here a plan of host tensors (context 0, which dispatch never
makes) whose entry point is a C function made by ctypes stands in for a kernel library's
mb_gemm: it checks that the front passes each operand's pointer where the step says, the
shape array, alpha and beta, allocates D as the plan says, and that a refused launch, autograd
or a changed environment leave the call to the Python path. Triton's parameter packing is
checked against a compiled kernel's signature as Triton's launcher reads it, host tensor
descriptors included (their tensor maps encoded as Triton encodes them)."""
from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import multibackend as mb
from multibackend.gpu import native, tensormap
from multibackend.run import fastcall, plans

pytestmark = pytest.mark.skipif(fastcall.compiler() is None,
                                reason="no C++ compiler ($CXX, c++ or g++) to build the front")

#: mb_gemm's C signature
ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_double,
                         ctypes.c_void_p)


@pytest.fixture
def module():
    plans.front()
    module = plans._COMPILED[0]
    assert module is not None, fastcall.status()
    yield module
    module.forget()


def small_ints(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randint(-3, 4, shape, generator=g, dtype=torch.int32).to(torch.float32)


class HostEntry:
    """A stand-in mb_gemm: D = alpha * (A @ B), written through D's pointer, from the tensors
    whose pointers it is given; records each call's arguments; answers ``status``."""

    def __init__(self, tensors: dict[int, torch.Tensor], status: int = 0):
        self.tensors = tensors  # pointer -> tensor, A and B
        self.status = status
        self.calls: list[tuple] = []
        self.function = ENTRY(self._call)
        self.address = ctypes.cast(self.function, ctypes.c_void_p).value
        self.shape = (ctypes.c_int64 * 3)(0, 0, 0)

    def _call(self, shape, a, b, c, d, alpha, beta, stream):
        self.calls.append((shape, a, b, c, d, alpha, beta, stream))
        if self.status:
            return self.status
        product = alpha * (self.tensors[a] @ self.tensors[b])
        ctypes.memmove(d, product.data_ptr(), product.numel() * product.element_size())
        return 0


def host_plan(module, entry: HostEntry, a, b, sources, alpha=1.0, word=("backend", "auto"),
              sizes=None):
    step = native.EntryStep(entry.address, ctypes.addressof(entry.shape), sources, alpha, 0.0)
    sizes = (a.shape[0], b.shape[1]) if sizes is None else sizes
    launch = native.Native(torch.float32, sizes, 0, (step,), keep=(entry,))
    plans.hand_over_native(word, a, b, launch)


def test_a_native_plan_passes_each_operand_where_its_step_says(module):
    a, b = small_ints(5, 7), small_ints(7, 3, seed=1)
    entry = HostEntry({a.data_ptr(): a, b.data_ptr(): b})
    # D^T = B^T A^T, as a column-major library sees row-major operands: its a is our B
    host_plan(module, entry, a, b, (native.A, native.B, native.D, native.D), alpha=2.0)
    served = module.stats()[2]
    d = mb.matmul(a, b)
    assert module.stats()[2] == served + 1
    assert d.shape == (5, 3) and d.dtype == torch.float32
    assert torch.equal(d, 2 * (a @ b))
    shape, pa, pb, pc, pd, alpha, beta, stream = entry.calls[-1]
    assert (shape, pa, pb, pc, alpha, beta, stream) == (
        ctypes.addressof(entry.shape), a.data_ptr(), b.data_ptr(), d.data_ptr(), 2.0, 0.0, None)
    assert pd == d.data_ptr()


def test_a_refused_launch_leaves_the_call_to_the_python_path(module):
    a, b = small_ints(4, 6), small_ints(6, 2)
    entry = HostEntry({a.data_ptr(): a, b.data_ptr(): b}, status=7)
    host_plan(module, entry, a, b, (native.A, native.B, native.D, native.D))
    served = module.stats()[2]
    assert module.serve(a, b, None, "auto", None, {}) is plans.MISS
    assert len(entry.calls) == 1 and module.stats()[2] == served


def test_autograd_and_other_operands_are_not_served(module, monkeypatch):
    a, b = small_ints(4, 6), small_ints(6, 2)
    entry = HostEntry({a.data_ptr(): a, b.data_ptr(): b})
    host_plan(module, entry, a, b, (native.A, native.B, native.D, native.D))
    a.requires_grad_()
    assert module.serve(a, b, None, "auto", None, {}) is plans.MISS  # autograd records torch's op
    assert module.serve(a.detach()[:, :5], b[:5], None, "auto", None, {}) is plans.MISS
    assert module.serve(a, b, None, "triton", None, {}) is plans.MISS
    monkeypatch.setenv("MULTIBACKEND_BACKEND", "cutlass")
    assert module.serve(a, b, None, "auto", None, {}) is plans.MISS
    monkeypatch.delenv("MULTIBACKEND_BACKEND")
    assert entry.calls == []
    with torch.no_grad():
        assert torch.equal(module.serve(a, b, None, "auto", None, {}), a @ b)


def test_a_plan_keeps_what_it_launches_alive_until_forgotten(module):
    a, b = small_ints(3, 3), small_ints(3, 3)
    entry = HostEntry({a.data_ptr(): a, b.data_ptr(): b})
    before = sys.getrefcount(entry)
    host_plan(module, entry, a, b, (native.A, native.B, native.D, native.D))
    assert sys.getrefcount(entry) == before + 1
    for _ in range(100):
        module.serve(a, b, None, "auto", None, {})
    assert sys.getrefcount(entry) == before + 1
    module.forget()
    assert sys.getrefcount(entry) == before


#: a child: a native plan of host tensors handed to the front, whose entry point (a ctypes
#: function) and shape array only the plan keeps alive, served on the main thread or on a
#: thread of its own (argv[1]); prints "served N" and lets the interpreter exit
EXITING = r"""
import ctypes
import sys
import threading

import torch

import multibackend as mb
from multibackend.gpu import native
from multibackend.run import plans

ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 5, ctypes.c_double,
                         ctypes.c_double, ctypes.c_void_p)
failures = []


def work():
    try:
        a, b = torch.randn(5, 7), torch.randn(7, 3)

        def gemm(shape, pa, pb, pc, pd, alpha, beta, stream):
            product = a @ b
            ctypes.memmove(pd, product.data_ptr(), product.numel() * product.element_size())
            return 0

        function, shape = ENTRY(gemm), (ctypes.c_int64 * 3)()
        step = native.EntryStep(ctypes.cast(function, ctypes.c_void_p).value,
                                ctypes.addressof(shape), (native.A, native.B, native.D, native.D),
                                1.0, 0.0)
        plans.front()
        plans.hand_over_native(("backend", "auto"), a, b,
                               native.Native(torch.float32, (5, 3), 0, (step,),
                                             keep=(function, shape)))
        for _ in range(3):
            if not torch.equal(mb.matmul(a, b), a @ b):
                failures.append("a wrong product")
    except BaseException as exc:
        failures.append(repr(exc))


if sys.argv[1] == "main":
    work()
else:
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
print(f"served {plans._COMPILED[0].stats()[2]}", flush=True)
if failures:
    sys.exit("\n".join(failures))
"""


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_process_holding_native_plans_exits_cleanly(where):
    """The front drops its plans at interpreter exit, while what they keep can be released.
    Released instead by a C++ static destructor, after the interpreter had finalized, they
    aborted the process here (Python 3.11: "PyThreadState_Get: ... the current Python thread
    state is NULL", runtime state "finalizing"), or ended it with SIGSEGV (3.12)."""
    env = {k: v for k, v in os.environ.items() if k != fastcall.ENV}
    proc = subprocess.run([sys.executable, "-c", EXITING, where], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"exit status {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert proc.stdout.split() == ["served", "3"], proc.stdout


def test_wrong_native_plans_say_what_is_wrong(module):
    a = small_ints(2, 2)
    env, gen = (None,) * 3, 0
    kernel = native.KernelStep(1, (1, 1, 1), (32, 1, 1), 0, bytes(16), (0, 8),
                               ((0, native.A),)).wire()
    with pytest.raises(ValueError, match="a kernel step needs a CUDA context"):
        module.remember_native("backend", "auto", a, a, env, gen, torch.float32, (2, 2), 0,
                               (kernel,), None)
    entry = (1, 0, 8, (0, 1, 2, 2), 1.0, 0.0, False, 0)
    with pytest.raises(ValueError, match="null entry point"):
        module.remember_native("backend", "auto", a, a, env, gen, torch.float32, (2, 2), 0,
                               (entry,), None)
    entry = (1, 8, 8, (0, 1, 3, 2), 1.0, 0.0, False, 0)
    with pytest.raises(ValueError, match="source 3"):
        module.remember_native("backend", "auto", a, a, env, gen, torch.float32, (2, 2), 0,
                               (entry,), None)
    with pytest.raises(ValueError, match="no steps"):
        module.remember_native("backend", "auto", a, a, env, gen, torch.float32, (2, 2), 0, (),
                               None)
    gemm = native.BlasStep(1, 2, 3, (0,) * 13, (native.B, native.A, native.D), bytes(8))
    with pytest.raises(ValueError, match="a cuBLAS step needs a CUDA context"):
        module.remember_native("backend", "auto", a, a, env, gen, torch.float32, (2, 2), 0,
                               (gemm.wire(),), None)
    with pytest.raises(ValueError, match="expected a kernel"):
        module.remember_native("backend", "auto", a, a, env, gen, torch.float32, (2, 2), 0,
                               ((2, 1),), None)
    assert module.stats()[1] == 0


def test_kernel_steps_check_their_parameter_buffer(module):
    """A kernel step needs torch's stream getter (CUDA torch) and libcuda: refused without
    either, saying which; with both, its parameter buffer is checked."""
    a = small_ints(2, 2)
    env, gen = (None,) * 3, 0
    def kernel(params, offsets, slots):
        return native.KernelStep(1, (1, 1, 1), (32, 1, 1), 0, params, offsets, slots).wire()

    step = kernel(bytes(8), (0,), ())

    def remember(*steps):
        module.remember_native("backend", "auto", a, a, env, gen, torch.float32, (2, 2), 1,
                               steps, None)

    keys = (plans.BACKEND_KEY, plans.TUNING_KEY, plans.AUTOTUNE_KEY)
    module.bind(plans.served, plans.MISS, plans.ENVIRON, keys, plans.GENERATION, None)
    try:
        with pytest.raises(RuntimeError, match="bound with no stream getter"):
            remember(step)
        module.bind(plans.served, plans.MISS, plans.ENVIRON, keys, plans.GENERATION,
                    lambda device: 0)
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            with pytest.raises(RuntimeError, match="libcuda.so.1 did not load"):
                remember(step)
            return
        with pytest.raises(ValueError, match="an 8-byte pointer, .* within 8 bytes"):
            remember(kernel(bytes(8), (0,), ((4, native.A),)))
        # a tensor map: 128 bytes at a multiple of 64
        for offset, size in ((0, 64), (8, 256)):
            with pytest.raises(ValueError, match="a 128-byte tensor map at a multiple of 64"):
                remember(kernel(bytes(size), (0,), ((offset, native.A + native.MAP),)))
        with pytest.raises(ValueError, match="at most 4096 bytes"):
            remember(kernel(bytes(8192), (0,), ()))
        with pytest.raises(ValueError, match="offset 8 past 8 bytes"):
            remember(kernel(bytes(8), (8,), ()))
        gemm = native.BlasStep(1, 2, 3, (0,) * 13, (native.B, native.A, native.D), bytes(8))
        with pytest.raises(ValueError, match="13 ints"):
            remember(gemm.wire()[:4] + ((0,) * 12,) + gemm.wire()[5:])
        with pytest.raises(ValueError, match="at most 16 bytes"):
            remember(gemm.wire()[:6] + (bytes(24),) + gemm.wire()[7:])
        with pytest.raises(ValueError, match="past 32 bits"):
            remember(gemm.wire()[:4] + ((2 ** 31,) + (0,) * 12,) + gemm.wire()[5:])
        with pytest.raises(ValueError, match="source 3"):
            remember(gemm.wire()[:5] + ((0, 1, 3),) + gemm.wire()[6:])
    finally:
        plans.bind(module)
    assert module.stats()[1] == 0


# -- Triton's launch, packed as its launcher packs it ---------------------------------------

def compiled_kernel(signature: dict[str, str], **meta):
    fields = dict(num_warps=4, shared=1024, num_ctas=1, launch_cooperative_grid=False,
                  launch_pdl=False, global_scratch_size=0, profile_scratch_size=0)
    fields.update(meta)
    return SimpleNamespace(function=0xABC, metadata=SimpleNamespace(**fields),
                           src=SimpleNamespace(signature=signature))


SIGNATURE = {"a": "*fp16", "b": "*fp16", "d": "*fp16", "M": "i32", "K": "i64", "one": "constexpr",
             "alpha": "fp32", "BLOCK": "constexpr"}


def test_a_triton_launch_packs_its_parameters_as_tritons_launcher_does():
    kernel = compiled_kernel(SIGNATURE)
    args = ("A", "B", "D", 100, 2 ** 40, 1, 0.5, 64)
    step = native.triton_step(kernel, (3, 2, 1), args, {0: native.A, 1: native.B, 2: native.D})
    assert step is not None
    assert (step.function, step.grid, step.block, step.smem) == (0xABC, (3, 2, 1), (128, 1, 1),
                                                                 1024)
    # a, b, d (8 bytes each), M (4), K (8, aligned), alpha (4), the two scratch pointers
    assert step.offsets == (0, 8, 16, 24, 32, 40, 48, 56)
    assert step.slots == ((0, native.A), (8, native.B), (16, native.D))
    params = step.params
    assert struct.unpack_from("i", params, 24) == (100,)
    assert struct.unpack_from("q", params, 32) == (2 ** 40,)
    assert struct.unpack_from("f", params, 40) == (0.5,)
    assert params[48:64] == bytes(16)
    assert len(params) == 64


@pytest.mark.parametrize("meta", [dict(num_ctas=2), dict(launch_pdl=True),
                                  dict(launch_cooperative_grid=True),
                                  dict(global_scratch_size=64), dict(profile_scratch_size=8)])
def test_a_triton_launch_that_is_more_than_one_plain_launch_is_not_described(meta):
    kernel = compiled_kernel(SIGNATURE, **meta)
    args = ("A", "B", "D", 100, 7, 1, 0.5, 64)
    assert native.triton_step(kernel, (1, 1, 1), args, {0: 0, 1: 1, 2: 2}) is None


def test_a_triton_launch_with_an_unknown_pointer_or_type_is_not_described(monkeypatch):
    args = ("A", "B", "D", 100, 7, 1, 0.5, 64)
    assert native.triton_step(compiled_kernel(SIGNATURE), (1, 1, 1), args, {0: 0, 1: 1}) is None
    half = dict(SIGNATURE, alpha="fp16")
    assert native.triton_step(compiled_kernel(half), (1, 1, 1), args, {0: 0, 1: 1, 2: 2}) is None
    assert native.triton_step(compiled_kernel(SIGNATURE), (1, 1, 1), args[:-1],
                              {0: 0, 1: 1, 2: 2}) is None
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert native.triton_step(compiled_kernel(SIGNATURE), (1, 1, 1), args,
                              {0: 0, 1: 1, 2: 2}) is None


class FakeEncoder:
    """libcuda's cuTensorMapEncodeTiled as :func:`multibackend.gpu.tensormap.triton_map` calls it:
    each call recorded (data type, rank, address, dims, byte strides, box, element strides,
    interleave, swizzle, L2 promotion, fill), its map filled with a marker and the address."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, out, dtype, rank, address, dims, strides, box, steps, interleave,
                 swizzle, promotion, fill):
        assert out % tensormap.ALIGN == 0
        self.calls.append((dtype, rank, address, tuple(dims[:rank]), tuple(strides[:rank - 1]),
                           tuple(box[:rank]), tuple(steps[:rank]), interleave, swizzle,
                           promotion, fill))
        ctypes.memmove(out, struct.pack("<QQ", 0x7E45, address).ljust(tensormap.SIZE, b"\0"),
                       tensormap.SIZE)
        return 0


def descriptor(address, shape, strides, padding="zero"):
    """A host tensor descriptor as Triton's launcher reads it."""
    return SimpleNamespace(base=SimpleNamespace(data_ptr=lambda: address), shape=shape,
                           strides=strides, padding=padding)


#: a kernel's entry of ``tensordesc_meta``: bfloat16 (Triton's device-side type 9), the
#: 128-byte swizzle, boxes of 64 rows by 128 columns
MAP_META = dict(swizzle=3, elem_size=2, elem_type=9, block_size=[64, 128], fp4_padded=False)
MAP_SIGNATURE = {"a_desc": "tensordesc<bf16[64, 128]>", "d": "*bf16", "M": "i32",
                 "BLOCK": "constexpr"}


@pytest.fixture
def encoder(monkeypatch):
    fake = FakeEncoder()
    monkeypatch.setattr(tensormap, "_functions", lambda: (fake, None))
    return fake


def test_a_triton_descriptor_is_packed_as_its_tensor_map_shape_and_strides(encoder):
    """A tensor-descriptor parameter goes as Triton's launcher passes it: the tensor map (at
    a multiple of 64, its address re-pointed per call at the operand its slot names), the
    shape as 32-bit and the strides as 64-bit integers; the map encoded as Triton encodes it
    (dims and box innermost first, strides in bytes, Triton's type 9 as the driver's
    bfloat16 (8), L2 promotion by 128 bytes, zeros outside, or NaN where it pads so)."""
    kernel = compiled_kernel(MAP_SIGNATURE, tensordesc_meta=[MAP_META])
    args = (descriptor(0x1000, [300, 520], [528, 1]), "D", 300, 64)
    step = native.triton_step(kernel, (2, 1, 1), args, {0: native.A + native.MAP, 1: native.D},
                              stream=5, unordered=True)
    assert step is not None
    assert encoder.calls == [(8, 2, 0x1000, (520, 300), (1056,), (128, 64), (1, 1), 0, 3, 2, 0)]
    # the map (128), the shape (2 x 4), the strides (2 x 8), d, M, the two scratch pointers
    assert step.offsets == (0, 128, 132, 136, 144, 152, 160, 168, 176)
    assert step.slots == ((0, native.A + native.MAP), (152, native.D))
    params = step.params
    assert struct.unpack_from("<QQ", params, 0) == (0x7E45, 0x1000)
    assert struct.unpack_from("iiqq", params, 128) == (300, 520, 528, 1)
    assert struct.unpack_from("i", params, 160) == (300,)
    assert step.wire()[8:] == (True, True, 5)
    native.triton_step(kernel, (2, 1, 1), (descriptor(0x2000, [8, 64], [64, 1], "nan"),
                                           *args[1:]), {0: native.B + native.MAP, 1: native.D})
    assert encoder.calls[-1][2] == 0x2000 and encoder.calls[-1][-1] == 1


def test_a_triton_descriptor_that_cannot_be_re_pointed_is_not_described(encoder):
    """No tensor map where the kernel takes the descriptor as a pointer (no meta), holds
    fp4 padded, or its slot names no map source."""
    args = (descriptor(0x1000, [300, 520], [528, 1]), "D", 300, 64)
    sources = {0: native.A + native.MAP, 1: native.D}
    for meta in (None, [dict(MAP_META, fp4_padded=True)]):
        kernel = compiled_kernel(MAP_SIGNATURE, tensordesc_meta=meta)
        assert native.triton_step(kernel, (1, 1, 1), args, sources) is None
    kernel = compiled_kernel(MAP_SIGNATURE, tensordesc_meta=[MAP_META])
    assert native.triton_step(kernel, (1, 1, 1), args, {0: native.A, 1: native.D}) is None
    assert native.triton_step(kernel, (1, 1, 1), args, {1: native.D}) is None
    with pytest.raises(ValueError, match="a tensor map of 64 bytes"):
        native.packed([(native.TENSOR_MAP, bytes(64))])


# -- CuPy callers: the front reads an array's dtype, shape, strides and data pointer ---------

class HostArray:
    """An array as the front reads a CuPy array (``dtype``, ``shape``, ``strides`` in bytes,
    ``data.ptr``, ``data.device_id``), over a host tensor."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.dtype = plans._numpy_dtype(tensor.dtype)
        self.shape = tuple(tensor.shape)
        self.strides = tuple(s * tensor.element_size() for s in tensor.stride())
        self.data = SimpleNamespace(ptr=tensor.data_ptr(), device_id=-1)


def host_empty(shape, dtype):
    return HostArray(torch.empty(shape, dtype=getattr(torch, dtype.name)))


def array_plan(module, a, b) -> HostEntry:
    """Bind HostArray as the array library and hand the front a native plan of host arrays
    like ``a`` and ``b`` under ("backend", "triton"), D (6, 4) float32 made by a stand-in
    mb_gemm, which it returns."""
    module.bind_arrays(HostArray, host_empty, lambda: 0)
    entry = HostEntry({a.data_ptr(): a, b.data_ptr(): b})
    step = native.EntryStep(entry.address, ctypes.addressof(entry.shape),
                            (native.A, native.B, native.D, native.D), 1.0, 0.0)
    key = plans.array_key(("backend", "triton"), a, b)
    module.remember_arrays(key, plans._watched_environment(), plans.GENERATION[0], (6, 4),
                           plans._numpy_dtype(torch.float32), torch.float32, 0, (step.wire(),),
                           entry)
    return entry


def test_a_native_plan_of_arrays_is_keyed_as_plans_keys_it_and_makes_d(module):
    a, b = small_ints(6, 5), small_ints(5, 4, seed=2)
    array_plan(module, a, b)
    served = module.stats()[2]
    d = module.serve_arrays(HostArray(a), HostArray(b), None, "triton", None, {})
    assert isinstance(d, HostArray) and d.shape == (6, 4)
    assert torch.equal(d.tensor, a @ b) and module.stats()[2] == served + 1
    assert module.serve_arrays(HostArray(a), HostArray(b), None, "auto", None, {}) is plans.MISS
    assert module.serve_arrays(HostArray(a.t().contiguous().t()), HostArray(b), None,
                               "triton", None, {}) is plans.MISS  # other strides
    assert module.serve_arrays(a, b, None, "triton", None, {}) is plans.MISS  # not arrays
    module.forget()
    assert module.serve_arrays(HostArray(a), HostArray(b), None,
                               "triton", None, {}) is plans.MISS
    assert plans.array_key(("backend", "triton"), a.bfloat16(), b) is None


# -- dot, and steps pinned to a stream ---------------------------------------------------------

def test_a_dot_plan_serves_dot_only_and_makes_a_0d_result(module):
    x, y = small_ints(9), small_ints(9, seed=3)
    entry = HostEntry({x.data_ptr(): x, y.data_ptr(): y})
    host_plan(module, entry, x, y, (native.A, native.B, native.D, native.D),
              word=(plans.DOT_WORDS["backend"], "auto"), sizes=())
    served = module.stats()[2]
    d = mb.dot(x, y)
    assert module.stats()[2] == served + 1
    assert d.shape == () and d.dtype == torch.float32 and torch.equal(d, x @ y)
    assert module.serve(x, y, None, "auto", None, {}) is plans.MISS  # matmul's words are not dot's
    assert module.serve_dot(x, y, "triton", None, {}) is plans.MISS
    assert module.serve_dot(x, y, "auto", None, {"acc_dtype": "float32"}) is plans.MISS
    assert module.serve_dot(x, y, "auto", None, {}).shape == ()
    assert len(entry.calls) == 2


def test_a_dot_word_needs_a_native_plan(module):
    x = small_ints(4)
    with pytest.raises(ValueError, match="a dot's plan is a native one"):
        module.remember_exact("dot:backend", "auto", x, x, (None,) * 3, 0, "mm")
    with pytest.raises(ValueError, match="expected 'backend', 'autotune', 'config', 'dot:backend'"):
        module.remember_exact("dot", "auto", x, x, (None,) * 3, 0, "mm")


@pytest.mark.parametrize("pinned, served", [(None, True), (0, True), (7, False)])
def test_a_step_pinned_to_a_stream_runs_only_on_that_stream(module, pinned, served):
    """A plan of host tensors runs on stream 0: a step pinned to stream 0 (the legacy default
    stream, a stream like any other) is served there, one pinned to another is not."""
    a, b = small_ints(3, 4), small_ints(4, 2)
    entry = HostEntry({a.data_ptr(): a, b.data_ptr(): b})
    step = native.EntryStep(entry.address, ctypes.addressof(entry.shape),
                            (native.A, native.B, native.D, native.D), 1.0, 0.0, pinned)
    plans.hand_over_native(("backend", "auto"), a, b,
                           native.Native(torch.float32, (3, 2), 0, (step,), keep=(entry,)))
    d = module.serve(a, b, None, "auto", None, {})
    assert (d is not plans.MISS) == served
    assert len(entry.calls) == int(served)


def test_a_dot_plan_of_arrays_is_served_by_the_dot_entry(module):
    module.bind_arrays(HostArray, host_empty, lambda: 0)
    x, y = small_ints(7), small_ints(7, seed=5)
    entry = HostEntry({x.data_ptr(): x, y.data_ptr(): y})
    step = native.EntryStep(entry.address, ctypes.addressof(entry.shape),
                            (native.A, native.B, native.D, native.D), 1.0, 0.0)
    key = plans.array_key((plans.DOT_WORDS["backend"], "auto"), x, y)
    module.remember_arrays(key, plans._watched_environment(), plans.GENERATION[0], (),
                           plans._numpy_dtype(torch.float32), torch.float32, 0, (step.wire(),),
                           entry)
    d = module.serve_dot_arrays(HostArray(x), HostArray(y), "auto", None, {})
    assert isinstance(d, HostArray) and d.shape == () and torch.equal(d.tensor, x @ y)
    assert module.serve_arrays(HostArray(x), HostArray(y), None, "auto", None, {}) is plans.MISS


def test_a_launch_step_reads_the_prepared_buffer_and_fixes_what_the_plan_keeps():
    from multibackend.gpu import driver

    params = (("x", driver.POINTER), ("n", driver.INT64), ("partial", driver.POINTER),
              ("count", driver.INT32))
    args = driver.Arguments("k", params, {"x": 0, "n": 1000, "partial": 5, "count": 3})
    launch = SimpleNamespace(function=SimpleNamespace(handle=0x77), grid=(4, 1, 1),
                             block=(256, 1, 1), dynamic_smem=0, args=args)
    step = native.launch_step(launch, {"x": native.A}, {"partial": 0x1000}, stream=9)
    assert step.offsets == (0, 8, 16, 24) and step.slots == ((0, native.A),)
    assert struct.unpack_from("qqqi", step.params) == (0, 1000, 0x1000, 3)
    assert args.values.partial == 5  # the prepared buffer is left as it was
    assert (step.function, step.grid, step.stream) == (0x77, (4, 1, 1), 9)
    assert step.wire()[-2:] == (True, 9)


def test_a_triton_launch_packs_a_fixed_pointer_where_told():
    kernel = compiled_kernel(SIGNATURE)
    args = ("A", "B", "P", 100, 7, 1, 0.5, 64)
    step = native.triton_step(kernel, (1, 1, 1), args, {0: native.A, 1: native.B}, {2: 0xBEEF},
                              stream=0)
    assert step.slots == ((0, native.A), (8, native.B))
    assert struct.unpack_from("Q", step.params, 16) == (0xBEEF,)
    assert step.wire()[-2:] == (True, 0)


def test_a_call_plan_of_arrays_hands_the_arrays_to_its_producing_call(module, monkeypatch):
    module.bind_arrays(HostArray, host_empty, lambda: 0)
    a, b = small_ints(3, 5), small_ints(5, 2, seed=4)
    calls = []

    def produce(x, y):
        calls.append((x, y))
        return HostArray(x.tensor @ y.tensor)

    key = plans.array_key(("backend", "cublas"), a, b)
    module.remember_array_call(key, plans._watched_environment(), plans.GENERATION[0], produce)
    x, y = HostArray(a), HostArray(b)
    served = module.stats()[2]
    d = module.serve_arrays(x, y, None, "cublas", None, {})
    assert torch.equal(d.tensor, a @ b) and calls == [(x, y)] and module.stats()[2] == served + 1
    assert module.serve_arrays(x, y, None, "auto", None, {}) is plans.MISS
    monkeypatch.setenv("MULTIBACKEND_BACKEND", "triton")
    assert module.serve_arrays(x, y, None, "cublas", None, {}) is plans.MISS
    with pytest.raises(TypeError, match="not callable"):
        module.remember_array_call(key, plans._watched_environment(), 0, None)


def test_a_native_plan_writes_an_out_like_its_own_d_and_no_other(module):
    """With out=D as the plan would allocate it, the steps get D's pointer and the call answers
    D; an out of another dtype, size, layout or alignment is MISS with no step run."""
    a, b = small_ints(5, 7), small_ints(7, 4, seed=1)
    entry = HostEntry({a.data_ptr(): a, b.data_ptr(): b})
    host_plan(module, entry, a, b, (native.A, native.B, native.D, native.D), alpha=2.0)
    out = torch.full((5, 4), float("nan"))
    served = module.stats()[2]
    assert mb.matmul(a, b, out=out) is out
    assert module.stats()[2] == served + 1 and torch.equal(out, 2 * (a @ b))
    assert entry.calls[-1][4] == out.data_ptr()
    room = torch.full((5 * 4 + 1,), float("nan"))
    for out in [torch.full((5, 4), float("nan"), dtype=torch.float64),
                torch.full((4, 5), float("nan")).T, torch.full((5, 5), float("nan")),
                room[1:].view(5, 4)]:
        assert module.serve(a, b, None, "auto", None, {"out": out}) is plans.MISS
        assert out.isnan().all()
    assert len(entry.calls) == 1


def test_a_native_plan_of_arrays_writes_an_out_like_its_own_d_and_no_other(module):
    """serve_arrays with out=D: served where D is what the plan would allocate (dtype, shape,
    row-major contiguous, 16-byte aligned, on A's device) and shares no byte with A or B; the
    call answers D itself. Anything else is MISS with no step run."""
    room = torch.full((56,), float("nan"))
    a = room[:30].view(6, 5).copy_(small_ints(6, 5))  # A, then room for D after it
    b = small_ints(5, 4, seed=2)
    entry = array_plan(module, a, b)

    def serve(out):
        return module.serve_arrays(HostArray(a), HostArray(b), None, "triton", None,
                                   {"out": out})

    for d in [torch.full((6, 4), float("nan")), room[32:].view(6, 4)]:  # 8 bytes past A
        out = HostArray(d)
        assert serve(out) is out and torch.equal(d, a @ b)
    assert len(entry.calls) == 2
    skewed = torch.full((6 * 4 + 1,), float("nan"))
    for d in [torch.full((6, 4), float("nan"), dtype=torch.float64),
              torch.full((4, 6), float("nan")).T, torch.full((6, 5), float("nan")),
              torch.full((6, 5), float("nan"))[:, :4], skewed[1:].view(6, 4),
              room[28:52].view(6, 4)]:  # the last 8 bytes of A
        before = d.clone()
        assert serve(HostArray(d)) is plans.MISS
        assert bool(((d == before) | (d.isnan() & before.isnan())).all())
    assert serve(d.numpy()) is plans.MISS  # not an array of the bound library
    assert len(entry.calls) == 2


def test_arrays_no_plan_can_serve_are_a_miss_not_an_error(module):
    """A negatively strided array beside an out (never planned: torch views no negative
    stride), and an unhashable option, are left to the Python path, which words them."""
    a, b = small_ints(6, 5), small_ints(5, 4, seed=2)
    array_plan(module, a, b)
    reversed_a = HostArray(a)
    reversed_a.strides = (-20, 4)
    out = HostArray(torch.full((6, 4), float("nan")))
    for options in ({}, {"out": out}):
        assert module.serve_arrays(reversed_a, HostArray(b), None, "triton", None,
                                   options) is plans.MISS
    for config in (["not", "hashable"], {"BLOCK_M": 64}):
        assert module.serve_arrays(HostArray(a), HostArray(b), None, "triton", None,
                                   {"config": config}) is plans.MISS
    assert module.serve_arrays(HostArray(a), HostArray(b), None, ["triton"], None,
                               {}) is plans.MISS
    assert out.tensor.isnan().all()
