"""CPU tier for the compiled front of a repeated matmul (multibackend/fastcall.cpp): it is
built by the C++ compiler against the installed torch, and serves exactly the calls its family
and exact plans cover, on tensors of the host (plans made here for device -1, which dispatch
itself never makes: it computes host tensors on the GPU); everything else is answered MISS, or
for a call with C handed to the Python front. Its build takes the C++ standard and ABI torch
names, and is recorded with them; its failure is recorded, not retried."""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch

import multibackend as mb
from multibackend.core.config import Config
from multibackend.core.names import ENV_BACKEND
from multibackend.run import fastcall, plans

INF = float("inf")

pytestmark = pytest.mark.skipif(fastcall.compiler() is None,
                                reason="no C++ compiler ($CXX, c++ or g++) to build the front")


@pytest.fixture
def front():
    """The compiled module bound to plans' families (none of them the host's), and the
    function serving (A, B, C, options); every family is dropped afterwards."""
    serve = plans.front()
    module = plans._COMPILED[0]
    assert module is not None, fastcall.status()
    assert serve is module.serve
    yield module, serve
    module.forget()


def host_family(module, op="mm", bounds=(INF,) * 5, backend="auto", dtype=torch.float32,
                ranks=(2, 2)):
    """Hand the module a family of host tensors, made under the current environment."""
    get = plans.ENVIRON.get
    environment = (get(plans.BACKEND_KEY), get(plans.TUNING_KEY), get(plans.AUTOTUNE_KEY))
    module.remember(backend, dtype, dtype, *ranks, -1, environment, plans.GENERATION[0], op,
                    bounds)


def small_ints(*shape, dtype=torch.float32):
    return torch.randint(-3, 4, shape, generator=torch.Generator().manual_seed(sum(shape)),
                         dtype=torch.int32).to(dtype).add_(0.5)


def served_count(module) -> int:
    return module.stats()[2]


def test_it_builds_and_loads_into_the_user_cache():
    module = fastcall.load()
    assert module is not None, fastcall.status()
    assert fastcall.status().startswith("compiled (")
    library = fastcall._paths(fastcall.library_key())[0]
    assert library.is_file() and library.parent.parent == fastcall.cache.cache_root()


def test_the_build_uses_the_standard_torchs_cpp_extension_builds_with(tmp_path):
    """The -std= of the build is the one torch.utils.cpp_extension writes for a JIT build of a
    C++ source (its load()), and the libstdc++ ABI is torch's own."""
    cpp_extension = pytest.importorskip("torch.utils.cpp_extension")
    writer = cpp_extension._write_ninja_file_to_build_library
    given = {"path": str(tmp_path / "build.ninja"), "name": "probe",
             "sources": [str(fastcall.SOURCE)], "extra_cflags": [], "extra_cuda_cflags": [],
             "extra_sycl_cflags": [], "extra_ldflags": [], "extra_include_paths": [],
             "with_cuda": False, "with_sycl": False, "is_standalone": False}
    parameters = inspect.signature(writer).parameters
    unknown = [name for name, p in parameters.items() if p.default is p.empty and name not in given]
    if unknown:
        pytest.skip(f"torch {torch.__version__}'s ninja writer takes {unknown}, unknown here")
    writer(**{name: value for name, value in given.items() if name in parameters})
    cflags = next(line for line in (tmp_path / "build.ninja").read_text().splitlines()
                  if line.startswith("cflags = "))
    standards = [flag for flag in cflags.split() if flag.startswith("-std=")]
    flags = fastcall.torch_flags()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert flags == (standards[-1], f"-D_GLIBCXX_USE_CXX11_ABI={abi}")
    line = fastcall.command("c++", tmp_path / "front.so", flags)
    assert [flag for flag in line if flag.startswith(("-std=", "-D_GLIBCXX"))] == list(flags)


@pytest.mark.parametrize("version, standard", [(201703, "c++17"), (202002, "c++20"),
                                               (202100, "c++20"), (202302, "c++23"),
                                               (201402, None)])
def test_the_standard_is_read_from_torchs_configuration(version, standard):
    config = f"PyTorch built with:\n  - GCC 13.3\n  - C++ Version: {version}\n  - OpenMP 201511\n"
    assert fastcall.cxx_standard(config) == standard
    assert fastcall.cxx_standard("PyTorch built with:\n  - GCC 13.3\n") is None


def _counting_compiler(tmp_path, monkeypatch, says: str):
    """A C++ compiler standing in for the real one (``$CXX``), in an empty cache: it counts its
    runs in the file it returns, runs ``says`` and fails."""
    counter = tmp_path / "runs"
    compiler = tmp_path / "counting-cxx"
    compiler.write_text(f"#!/bin/sh\necho run >> {counter}\n{says}\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(compiler))
    return counter


def test_a_torch_naming_no_standard_is_not_built(monkeypatch, tmp_path):
    counter = _counting_compiler(tmp_path, monkeypatch, "")
    monkeypatch.setattr(fastcall, "torch_flags", lambda: None)
    monkeypatch.setattr(fastcall, "_loaded", {})
    assert fastcall.load() is None
    assert "names no C++ standard" in fastcall.status()
    assert not counter.exists()


def test_the_torch_version_compiler_and_flags_of_the_build_are_recorded():
    assert fastcall.load() is not None, fastcall.status()
    record = fastcall.build_record()
    flags = [*fastcall.torch_flags(), *fastcall.OPTIONS]
    library = fastcall._paths(fastcall.library_key())[0]
    assert record == {"torch": torch.__version__, "compiler": fastcall.compiler(), "flags": flags,
                      "digest": fastcall.cache.digest(library.read_bytes())}
    assert fastcall.status().endswith(f", built against torch {torch.__version__} by "
                                      f"{record['compiler']} with {' '.join(flags)}")


def test_a_served_call_is_torchs_op_exactly(front):
    module, serve = front
    host_family(module)
    a, b = small_ints(37, 19), small_ints(19, 23)
    before = served_count(module)
    d = serve(a, b, None, "auto", None, {})
    assert served_count(module) == before + 1
    assert torch.equal(d, torch.mm(a, b))
    assert torch.equal(mb.matmul(a, b), torch.mm(a, b))  # the public call through the front
    assert served_count(module) == before + 2


def test_a_batched_family_runs_torch_matmul(front):
    module, serve = front
    host_family(module, op="matmul", ranks=(3, 2))
    a, b = small_ints(3, 9, 5), small_ints(5, 4)
    assert torch.equal(serve(a, b, None, "auto", None, {}), torch.matmul(a, b))
    # rank 2: another family
    assert serve(small_ints(9, 5), b, None, "auto", None, {}) is plans.MISS


def test_sizes_past_every_bound_are_not_served(front):
    module, serve = front
    host_family(module, bounds=(100, 100, 10, 10, 10))
    # M < 10
    assert serve(small_ints(9, 20), small_ints(20, 20), None, "auto", None, {}) is not plans.MISS
    # 25 < 100
    assert serve(small_ints(5, 5), small_ints(5, 30), None, "auto", None, {}) is not plans.MISS
    assert serve(small_ints(20, 20), small_ints(20, 20), None, "auto", None, {}) is plans.MISS


def test_a_fractional_bound_is_compared_as_the_python_front_compares_it(front):
    module, serve = front
    host_family(module, bounds=(0.0, 0.0, 10.5, 0, 0))
    # 10 < 10.5
    assert serve(small_ints(10, 3), small_ints(3, 3), None, "auto", None, {}) is not plans.MISS
    assert serve(small_ints(11, 3), small_ints(3, 3), None, "auto", None, {}) is plans.MISS
    host_family(module, bounds=(0, 0, 2 ** 70, 0, 0))  # past int64: no bound
    assert serve(small_ints(11, 3), small_ints(3, 3), None, "auto", None, {}) is not plans.MISS


def test_the_backend_asked_for_and_other_options_decide(front):
    module, serve = front
    host_family(module, backend="cublas")
    a, b = small_ints(6, 7), small_ints(7, 8)
    assert torch.equal(serve(a, b, None, "cublas", None, {}), torch.mm(a, b))
    assert serve(a, b, None, "auto", None, {}) is plans.MISS  # "auto" has no family here
    assert serve(a, b, None, "triton", None, {}) is plans.MISS
    assert serve(a, b, None, "cublas", None, {"alpha": 2.0}) is plans.MISS
    assert serve(a, b, None, "auto", None, {"alpha": 1.0}) is plans.MISS


def test_other_dtypes_ranks_and_tensor_kinds_are_not_served(front):
    module, serve = front
    host_family(module)
    a, b = small_ints(6, 7), small_ints(7, 8)
    assert serve(a.double(), b.double(), None, "auto", None, {}) is plans.MISS
    assert serve(a, b.double(), None, "auto", None, {}) is plans.MISS
    assert serve(a[0], b, None, "auto", None, {}) is plans.MISS

    class Sub(torch.Tensor):
        pass

    assert serve(a.as_subclass(Sub), b, None, "auto", None, {}) is plans.MISS


def test_a_torch_function_mode_is_left_to_torchs_own_dispatch(front):
    module, serve = front
    host_family(module)
    seen = []

    class Recording(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    a, b = small_ints(6, 7), small_ints(7, 8)
    with Recording():
        assert serve(a, b, None, "auto", None, {}) is plans.MISS
    assert serve(a, b, None, "auto", None, {}) is not plans.MISS


def test_a_refused_product_is_a_miss_not_an_error(front):
    module, serve = front
    host_family(module)
    assert serve(small_ints(6, 7), small_ints(8, 8), None, "auto", None, {}) is plans.MISS
    with pytest.raises(mb.InvalidArgument, match="inner dimensions"):
        mb.matmul(small_ints(6, 7), small_ints(8, 8))  # the full path words it


def test_a_changed_environment_or_table_generation_is_not_served(front, monkeypatch):
    module, serve = front
    host_family(module)
    a, b = small_ints(6, 7), small_ints(7, 8)
    monkeypatch.setenv(ENV_BACKEND, "triton")
    assert serve(a, b, None, "auto", None, {}) is plans.MISS
    monkeypatch.delenv(ENV_BACKEND)
    # the value it was made under, again
    assert serve(a, b, None, "auto", None, {}) is not plans.MISS
    plans.GENERATION[0] += 1  # what loading or clearing a table does
    assert serve(a, b, None, "auto", None, {}) is plans.MISS


def test_a_call_with_c_goes_to_the_python_front(front, monkeypatch):
    module, serve = front
    host_family(module)
    calls = []

    def recording(a, b, c, backend, autotune, options):
        calls.append((a, b, c, backend, autotune, options))
        return "python front"

    module.bind(recording, plans.MISS, plans.ENVIRON,
                (plans.BACKEND_KEY, plans.TUNING_KEY, plans.AUTOTUNE_KEY), plans.GENERATION,
                None)
    try:
        a, b, c = small_ints(6, 7), small_ints(7, 8), small_ints(6, 8)
        assert serve(a, b, c, "auto", None, {"alpha": 2.0}) == "python front"
        assert calls == [(a, b, c, "auto", None, {"alpha": 2.0})]
        assert serve(a, b, None, "auto", None, {}) is not plans.MISS  # its families kept
    finally:
        plans.bind(module)


def exact_plan(a, b, word=("autotune", "eager"), op=torch.mm):
    """Hand the compiled front an exact plan for calls like these, as dispatch does."""
    plans.hand_over_exact(word, a, b, op)


def test_an_exact_plan_serves_only_its_option_and_operands_exactly(front):
    module, serve = front
    a, b = small_ints(40, 24), small_ints(24, 16)
    exact_plan(a, b)
    assert module.stats()[:2] == (0, 1)
    assert torch.equal(serve(a, b, None, "auto", "eager", {}), torch.mm(a, b))
    assert serve(a, b, None, "auto", "graph", {}) is plans.MISS
    assert serve(a, b, None, "auto", None, {}) is plans.MISS
    assert serve(a, b, None, "cublas", "eager", {}) is plans.MISS  # autotuning is auto's
    assert serve(a, b, None, "auto", "eager", {"alpha": 1.0}) is plans.MISS
    assert torch.equal(serve(a, b, None, "".join("auto"), "".join("eager"), {}), torch.mm(a, b))
    assert serve(a, b.T.contiguous().T, None, "auto", "eager", {}) is plans.MISS  # strides
    wider = small_ints(41, 24)
    assert serve(wider[1:], b, None, "auto", "eager", {}) is plans.MISS  # 48 bytes on
    assert serve(a[:39], b, None, "auto", "eager", {}) is plans.MISS  # sizes
    assert serve(a.double(), b.double(), None, "auto", "eager", {}) is plans.MISS
    exact_plan(a, b)  # made again: replaced
    assert module.stats()[:2] == (0, 1)
    assert torch.equal(serve(a, b, None, "auto", "eager", {}), torch.mm(a, b))  # the new one
    exact_plan(a, b.T.contiguous().T)  # another plan in the map: the last one found may move
    assert torch.equal(serve(a, b, None, "auto", "eager", {}), torch.mm(a, b))
    module.forget()
    assert serve(a, b, None, "auto", "eager", {}) is plans.MISS


def test_an_exact_plan_for_a_config_serves_that_backend_and_config_only(front):
    """matmul(A, B, backend=name, config=c) is remembered under ("config", (name, c)): served
    for that backend and a config equal to c, with no other keyword, and for nothing else."""
    module, serve = front
    a, b = small_ints(12, 10), small_ints(10, 6)
    config = Config.of("64x64x32", BLOCK_M=64, BLOCK_N=64)
    exact_plan(a, b, ("config", ("triton", config)))
    exact_plan(a, b, ("config", ("cublas", "default")))
    assert module.stats()[:2] == (0, 2)
    same = Config.of("64x64x32", BLOCK_N=64, BLOCK_M=64)
    for backend, asked in [("triton", config), ("".join("triton"), same),
                           ("cublas", "default"), ("cublas", "".join("default"))]:
        assert torch.equal(serve(a, b, None, backend, None, {"config": asked}), torch.mm(a, b))
    for backend, autotune, options in [
            ("cutlass", None, {"config": config}), ("cublas", None, {"config": config}),
            ("triton", None, {"config": Config.of("64x64x32", BLOCK_M=64, BLOCK_N=32)}),
            ("triton", None, {"config": "64x64x32"}), ("triton", None, {}),
            ("triton", None, {"config": None}), ("auto", None, {"config": config}),
            (None, None, {"config": config}), ("triton", "eager", {"config": config}),
            ("triton", None, {"config": config, "alpha": 1.0}), ("triton", None, {"alpha": 1.0}),
            ("triton", None, {"config": {"BLOCK_M": 64}})]:
        assert serve(a, b, None, backend, autotune, options) is plans.MISS, (backend, options)
    assert serve(a.double(), b.double(), None, "triton", None, {"config": config}) is plans.MISS
    counts = sys.getrefcount(config), sys.getrefcount(a)
    for _ in range(1000):
        serve(a, b, None, "triton", None, {"config": config})
        serve(a, b, None, "triton", None, {"config": {}})
    assert (sys.getrefcount(config), sys.getrefcount(a)) == counts


def test_an_exact_plan_serves_a_plain_call_past_its_familys_bounds(front, monkeypatch):
    module, serve = front
    host_family(module, bounds=(0, 0, 8, 0, 0))
    a, b = small_ints(20, 20), small_ints(20, 20)
    assert serve(a, b, None, "auto", None, {}) is plans.MISS
    exact_plan(a, b, ("backend", "auto"))
    assert torch.equal(serve(a, b, None, "auto", None, {}), torch.mm(a, b))
    assert torch.equal(serve(a, b, None, "".join("auto"), None, {}), torch.mm(a, b))  # equal
    monkeypatch.setenv(ENV_BACKEND, "triton")
    assert serve(a, b, None, "auto", None, {}) is plans.MISS  # made under another environment


def test_a_family_for_backend_none_serves_backend_none_only(front):
    module, serve = front
    host_family(module, backend=None)
    a, b = small_ints(6, 7), small_ints(7, 8)
    assert torch.equal(serve(a, b, None, None, None, {}), torch.mm(a, b))
    assert serve(a, b, None, "auto", None, {}) is plans.MISS
    with pytest.raises(TypeError, match="backend is 3: expected a name or None"):
        module.remember(3, torch.float32, torch.float32, 2, 2, -1, (None,) * 3, 0, "mm",
                        (INF,) * 5)


def test_too_many_exact_plans_drop_the_exact_plans_and_keep_the_families(front):
    module, serve = front
    host_family(module, bounds=(0, 0, 2, 0, 0))
    b = small_ints(3, 3)
    for rows in range(2, 2 + 4097):  # past LIMIT (4096): the exact plans start again
        last = torch.ones(rows, 3)
        exact_plan(last, b, ("backend", "auto"))
    assert module.stats()[:2] == (1, 1)
    assert serve(small_ints(1, 3), b, None, "auto", None, {}) is not plans.MISS  # the family, kept
    assert torch.equal(serve(last, b, None, "auto", None, {}), last @ b)  # the last exact plan


def test_tensors_without_strides_are_not_served_or_remembered(front):
    module, serve = front
    host_family(module)
    sparse = small_ints(6, 7).to_sparse()
    assert serve(sparse, small_ints(7, 8), None, "auto", None, {}) is plans.MISS
    exact_plan(small_ints(6, 7), small_ints(7, 8))
    assert serve(sparse, small_ints(7, 8), None, "auto", "eager", {}) is plans.MISS
    with pytest.raises(ValueError, match="no plain layout"):
        module.remember_exact("autotune", "eager", sparse, small_ints(7, 8), (None,) * 3, 0, "mm")


def test_families_handed_over_by_plans_and_forgotten_with_them(front):
    module, _ = front
    get = plans.ENVIRON.get
    environment = (get(plans.BACKEND_KEY), get(plans.TUNING_KEY), get(plans.AUTOTUNE_KEY))
    key = ("auto", torch.float16, torch.float16, 2, 2, 0, *environment, plans.GENERATION[0])
    plans.remember_family(key, torch.mm, (INF, INF, 64, 64, 64))
    assert module.stats()[0] == 1
    plans.remember_family(key, torch.mm, (INF, INF, 32, 32, 32))  # made again: replaced
    assert module.stats()[0] == 1
    plans.remember_family(("auto",) + key[1:5] + (1,) + key[6:], lambda a, b: a, (INF,) * 5)
    assert module.stats()[0] == 1  # not torch's op: only the Python front serves it
    exact_plan(small_ints(3, 3), small_ints(3, 3))
    plans.forget()
    assert module.stats()[:2] == (0, 0) and not plans.FAMILIES


def test_served_calls_leak_no_references(front):
    module, serve = front
    host_family(module)
    a, b = small_ints(4, 4), small_ints(4, 4)
    counts = sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(plans.MISS)
    for _ in range(1000):
        d = serve(a, b, None, "auto", None, {})
        serve(a, b.double(), None, "auto", None, {})
    assert (sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(plans.MISS)) == counts
    assert sys.getrefcount(d) == 2  # d, and getrefcount's argument


def test_wrong_arguments_to_remember_say_what_is_wrong(front):
    module, _ = front
    with pytest.raises(ValueError, match="op is 'gemm'"):
        module.remember("auto", torch.float16, torch.float16, 2, 2, 0, (None,) * 3, 0, "gemm",
                        (INF,) * 5)
    with pytest.raises(ValueError, match="the bounds are 5"):
        module.remember("auto", torch.float16, torch.float16, 2, 2, 0, (None,) * 3, 0, "mm",
                        (INF,) * 4)
    with pytest.raises(ValueError, match="the environment holds 3 values"):
        module.remember("auto", torch.float16, torch.float16, 2, 2, 0, (None,) * 2, 0, "mm",
                        (INF,) * 5)
    for wrong in ("64", -1, -0.5, float("nan")):
        with pytest.raises(TypeError, match="bound m is .*: expected a number >= 0"):
            module.remember("auto", torch.float16, torch.float16, 2, 2, 0, (None,) * 3, 0,
                            "mm", (INF, INF, wrong, 1, 1))
    with pytest.raises(TypeError, match="serve takes"):
        module.serve(1, 2)
    a = small_ints(2, 2)
    with pytest.raises(ValueError, match="word is 'alpha'"):
        module.remember_exact("alpha", 2.0, a, a, (None,) * 3, 0, "mm")
    with pytest.raises(TypeError, match="must be torch tensors"):
        module.remember_exact("autotune", "eager", a, a.numpy(), (None,) * 3, 0, "mm")
    with pytest.raises(TypeError, match="unhashable"):
        module.remember_exact("autotune", ["eager"], a, a, (None,) * 3, 0, "mm")


def test_turned_off_every_call_takes_the_python_front(monkeypatch):
    monkeypatch.setenv(fastcall.ENV, "0")
    assert fastcall.load() is None
    assert fastcall.status() == f"off (${fastcall.ENV}=0)"
    monkeypatch.setattr(plans, "_COMPILED", [None])  # a process whose first call is to come
    assert plans.front() is plans.served


def test_a_failed_build_is_recorded_and_not_retried_with_that_compiler(monkeypatch, tmp_path):
    counter = _counting_compiler(tmp_path, monkeypatch, "echo 'no such header' >&2")
    monkeypatch.setattr(fastcall, "_loaded", {})
    assert fastcall.load() is None
    assert "build failed" in fastcall.status()
    record = fastcall._paths(fastcall.library_key())[1]
    assert "no such header" in record.read_text()
    monkeypatch.setattr(fastcall, "_loaded", {})
    assert fastcall.load() is None  # a new process: the record stands
    assert "failed before" in fastcall.status()
    assert counter.read_text().count("run") == 1
    assert not [p for p in record.parent.iterdir() if p.suffix == ".so"]
    other = tmp_path / "other-cxx"  # another compiler: the record is for the one that failed
    other.write_text(f"#!/bin/sh\necho other >> {counter}\nexit 1\n")
    other.chmod(0o755)
    monkeypatch.setenv("CXX", str(other))
    monkeypatch.setattr(fastcall, "_loaded", {})
    assert fastcall.load() is None
    assert counter.read_text().count("other") == 1 and "build failed" in fastcall.status()
    assert record.read_text().startswith(f"{fastcall.FAILED_WITH}{other}\n")


def poisoned(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


def test_a_call_with_out_writes_out_by_the_plan_of_the_call_without_it(front):
    """matmul(A, B, out=D) is served by the family or exact plan of matmul(A, B) (the same
    option word): at::mm writes D, and the call answers D itself."""
    module, serve = front
    host_family(module)
    a, b = small_ints(37, 19), small_ints(19, 23)
    out = poisoned(37, 23)
    before = served_count(module)
    assert serve(a, b, None, "auto", None, {"out": out}) is out
    assert served_count(module) == before + 1
    assert torch.equal(out, torch.mm(a, b))
    assert mb.matmul(a, b, out=out) is out  # the public call through the front
    assert served_count(module) == before + 2
    c, d = small_ints(12, 10), small_ints(10, 6)
    config = Config.of("64x64x32", BLOCK_M=64, BLOCK_N=64)
    exact_plan(c, d, ("config", ("triton", config)))
    exact_plan(c, d, ("autotune", "eager"))
    for backend, autotune, options in [("triton", None, {"config": config}),
                                       ("auto", "eager", {})]:
        out = poisoned(12, 6)
        assert serve(c, d, None, backend, autotune, {**options, "out": out}) is out
        assert torch.equal(out, torch.mm(c, d))
    counts = sys.getrefcount(out), sys.getrefcount(c)
    for _ in range(1000):
        serve(c, d, None, "auto", "eager", {"out": out})
        serve(c, d, None, "auto", "eager", {"out": out.double()})
    assert (sys.getrefcount(out), sys.getrefcount(c)) == counts


class Marked(torch.Tensor):
    """A tensor subclass: its own dispatch may differ from torch's."""


def unchanged(x, before) -> bool:
    x = x.detach()
    return bool(((x == before) | (x.isnan() & before.isnan())).all())


def test_an_out_other_than_the_d_a_plan_allocates_is_left_to_the_python_path(front):
    """Every out the plan could not write as it writes its own D is answered MISS, untouched:
    the Python path then runs the call or words the error."""
    module, serve = front
    host_family(module)
    a, b = small_ints(8, 12), small_ints(12, 16)
    shared = poisoned(20, 16)  # out its first 8 rows, A or B inside it
    room = poisoned(8 * 16 + 3)
    grad = poisoned(8, 16).requires_grad_()
    cases = [
        ("dtype", a, b, poisoned(8, 16, dtype=torch.float64)),
        ("shape", a, b, poisoned(16, 8)),
        ("3-D", a, b, poisoned(1, 8, 16)),
        ("transposed", a, b, poisoned(16, 8).T),
        ("row stride", a, b, poisoned(8, 17)[:, :16]),
        ("one row, row stride 17", a[:1], b, poisoned(2, 17)[:1, :16]),
        ("12 bytes off 16", a, b, room[3:].view(8, 16)),
        ("a subclass", a, b, poisoned(8, 16).as_subclass(Marked)),
        ("negation bit", a, b, torch._neg_view(poisoned(8, 16))),
        ("autograd", a, b, grad),
        ("shares A", shared[4:12].view(-1)[:96].view(8, 12).copy_(a), b, shared[:8]),
        ("shares B", a, shared[4:16].copy_(b), shared[:8]),
    ]
    for why, aa, bb, out in cases:
        before = out.detach().clone()
        assert serve(aa, bb, None, "auto", None, {"out": out}) is plans.MISS, why
        assert unchanged(out, before), why
    out = poisoned(8, 16)
    for options in [{"out": None}, {"out": out, "alpha": 1.0}, {"out": out, "beta": 0.0}]:
        assert serve(a, b, None, "auto", None, options) is plans.MISS, options
    assert torch.isnan(out).all()
    with torch.no_grad():
        assert serve(a, b, None, "auto", None, {"out": grad}) is grad
    assert torch.equal(grad.detach(), torch.mm(a, b))
    host_family(module, op="matmul", ranks=(3, 2))
    assert serve(a[None], b, None, "auto", None, {"out": poisoned(1, 8, 16)}) is plans.MISS


def test_an_out_as_allocated_is_told_apart_from_others():
    """plans.as_allocated: what lets a call with out hand its plan to the front."""
    a, b = small_ints(8, 12), small_ints(12, 16)
    room = poisoned(8 * 16 + 4)
    assert plans.as_allocated(poisoned(8, 16), a, b)
    assert plans.as_allocated(room[4:].view(8, 16), a, b)  # 16 bytes on
    for out in [room[3:-1].view(8, 16), poisoned(16, 8).T, poisoned(8, 17)[:, :16],
                poisoned(1, 8, 16), torch._neg_view(poisoned(8, 16)),
                poisoned(8, 16).as_subclass(Marked), poisoned(8, 16).numpy()]:
        assert not plans.as_allocated(out, a, b)
    assert not plans.as_allocated(poisoned(8, 16), a[None], b)
    assert not plans.as_allocated(poisoned(8, 16), a.numpy(), b)


def _cached_library(tmp_path, monkeypatch) -> Path:
    """This process's compiled front, copied with its record into an empty cache."""
    real = fastcall._paths(fastcall.library_key())[0]
    if fastcall.load() is None or not real.is_file():
        pytest.skip(f"the compiled front is not in use here: {fastcall.status()}")
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path / "cache"))
    copy = fastcall._paths(fastcall.library_key())[0]
    copy.write_bytes(real.read_bytes())
    fastcall._record_path(copy).write_bytes(fastcall._record_path(real).read_bytes())
    return copy


def test_a_library_cut_short_is_never_loaded_and_is_removed(tmp_path, monkeypatch):
    """What a full disk or a power loss leaves: loading it would map a truncated file and
    kill the process with SIGBUS on first use; it is removed and the front built again."""
    library = _cached_library(tmp_path, monkeypatch)
    assert fastcall._whole(library)
    library.write_bytes(library.read_bytes()[: library.stat().st_size // 2])
    monkeypatch.setattr(fastcall, "_loaded", {})
    assert fastcall.load(build=False) is None
    assert not library.exists() and not fastcall._record_path(library).exists()


def test_a_library_without_its_record_or_replaced_by_a_directory_is_rebuilt(tmp_path,
                                                                              monkeypatch):
    library = _cached_library(tmp_path, monkeypatch)
    fastcall._record_path(library).unlink()
    assert not fastcall._whole(library) and not library.exists()
    library.mkdir()
    (library / "junk").write_text("x")
    assert not fastcall._whole(library) and not library.exists()
