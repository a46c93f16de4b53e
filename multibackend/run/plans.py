"""Validated calls remembered, so a repeated call skips validation and dispatch.

Validating the arguments, building the Problem and walking the dispatch order costs far more
host time than launching a small kernel. A call whose arrays are torch tensors or CuPy arrays
is keyed by everything those steps read — each array's type, dtype, shape, strides, device
and pointer alignment, the scalars and options, the backend and config asked for, and the
state of the environment variables and tuning tables dispatch consults — and the outcome (the
Problem and the Decision) is kept. A later call with the same key only makes its operand views
and output, and launches. Anything else (NumPy, other array kinds, host tensors where there
is a GPU, empty or K = 0 problems) takes the full path every time, as do calls with a tensor
whose lazy negation bit torch set (its memory holds the negation of its values). A repeated
call with ``out`` still checks that ``out`` shares no memory with A, B or C: the key holds no
addresses.
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

from multibackend.choose import tables
from multibackend.choose.dispatch import Decision
from multibackend.choose.registry import REGISTRY
from multibackend.core.config import Operands
from multibackend.core.names import ENV_AUTOTUNE, ENV_BACKEND, ENV_TUNING
from multibackend.core.problem import Problem, folded_batch
from multibackend.gpu.native import Native
from multibackend.io.arrays import caller_stream, is_current, on_stream, to_kind
from multibackend.io.request import batched, byte_extent, out_shared, shared_with
from multibackend.run import fastcall

LIMIT = 4096


#: a plan whose backend has not been asked for a bound launch yet
_UNBOUND = object()


@dataclass(eq=False)
class Plan:
    """The outcome of validating and dispatching one kind of call. ``bound``: the backend's
    bound launch for these calls (:meth:`~multibackend.backends.base.Backend.bind`), asked
    for after the plan's first run; None where it has none. ``produce``: the backend's call
    that makes D itself from the caller's arrays, as the caller's own call would (cuBLAS's
    ``torch.mm``, ``torch.matmul``, ``cupy.matmul``), where it offers one for a call with no
    ``out``. ``front``: the call's one option as (name, value), where the compiled front may
    launch the backend's kernels for it (:func:`hand_over_native`) once they are bound."""

    problem: Problem
    decision: Decision
    kind: str
    squeeze: bool
    alpha: float | int
    beta: float | int
    backend: Any = None
    d_dtype: Any = None
    bound: Any = _UNBOUND
    produce: Any = None
    front: tuple | None = None
    #: the byte extents of A, B, C and out in this plan's calls (fixed by the key's shapes
    #: and strides), worked out on its first call with ``out``
    extents: tuple | None = None

    def check_out(self, op: str, tensors: tuple) -> None:
        """``out`` (``tensors[3]``) separate from A, B and C, as the first call checked
        (:func:`~multibackend.io.request.check_out_separate`): the key holds no addresses, so
        every call compares its own, with the extents worked out once."""
        if self.extents is None:
            self.extents = tuple(0 if t is None else byte_extent(t) for t in tensors)
        a, b, c, out = tensors
        extents = self.extents
        name = shared_with(out.data_ptr(), extents[3],
                           (("A", a.data_ptr(), extents[0]), ("B", b.data_ptr(), extents[1]),
                            ("C", c.data_ptr() if c is not None else 0, extents[2])))
        if name is not None:
            raise out_shared(op, name)

    @classmethod
    def of(cls, problem: Problem, decision: Decision, kind: str, squeeze: bool,
           alpha: float | int, beta: float | int, direct: bool = False) -> "Plan":
        """``direct``: the caller's arrays go as given to the backend's producing call
        (:meth:`~multibackend.backends.cublas.backend.CublasBackend.produce`), where it has one."""
        from multibackend.core import dtypes

        backend = REGISTRY.get(decision.backend)
        return cls(problem, decision, kind, squeeze, alpha, beta, backend,
                   dtypes.torch_dtype(problem.d_dtype),
                   produce=backend.produce(problem, decision.config, alpha, beta, kind,
                                           squeeze) if direct else None)

    def run(self, tensors: tuple, scales: tuple | None = None) -> Any:
        """D for the arrays ``tensors`` (A, B, C, out); ``scales``: a scaled product's two
        scales, as the backends take them."""
        if self.produce is not None and self.kind == "torch" and tensors[3] is None:
            # torch's stream, the device
            if self.problem.has_c:
                return self.produce(tensors[0], tensors[1], tensors[2])
            return self.produce(tensors[0], tensors[1])
        a = tensors[0]
        device = a.device
        stream = caller_stream(self.kind, device)
        if is_current(stream, device):
            d = self._launch(tensors, stream, device, scales)
        else:  # the caller's stream (and device) current while D is allocated and run
            with on_stream(stream, device):
                d = self._launch(tensors, stream, device, scales)
        return d if tensors[3] is not None else to_kind(d, self.kind)  # out: the caller's

    def _hand_over(self, a: Any, b: Any, ops: Operands) -> None:
        """Give the compiled front the backend's launches for this plan's calls, where the
        plan has a front word and the backend describes them (after its first bound run)."""
        if self.front is None:
            return
        launch = self.backend.native(self.problem, self.decision.config, ops)
        if self.kind == "torch":
            hand_over_native(self.front, a, b, launch)
        else:
            hand_over_native_arrays(self.front, a, b, launch)

    def _launch(self, tensors: tuple, stream: int, device: Any,
                scales: tuple | None = None) -> Any:
        """Make D, run the backend, and return D in the caller's shape."""
        torch = sys.modules["torch"]
        p = self.problem
        a, b, c, out = tensors
        if p.scales is not None:  # 2-D A and B; the scales go with every run, nothing bound
            d = out if out is not None else torch.empty((p.m, p.n), dtype=self.d_dtype,
                                                        device=device)
            ops = Operands(a.unsqueeze(0), b.unsqueeze(0),
                           batched(c, 1) if p.has_c else None, d.view(1, p.m, p.n),
                           self.alpha, self.beta, stream, scale_a=scales[0],
                           scale_b=scales[1])
            self.backend.run(p, ops, self.decision.config)
            return d
        if p.op == "dot":
            d = torch.empty((1,), dtype=self.d_dtype, device=device)
            ops = Operands(a, b, None, d, stream=stream)
            self.backend.run(p, ops, self.decision.config)
            if self.bound is _UNBOUND:  # a dot's launches go only to the front
                self.bound = None
                self._hand_over(a, b, ops)
            return d.reshape(())
        if p.batch == 1 and self.backend.takes_matrices:  # the arrays as the caller gave them
            if out is not None:
                d = out
            else:
                d = torch.empty((p.m, p.n) if self.squeeze else (1, p.m, p.n),
                                dtype=self.d_dtype, device=device)
            c = c if p.has_c else None
            if self.bound is None or self.bound is _UNBOUND:
                ops = Operands(a, b, c, d, self.alpha, self.beta, stream)
                self.backend.run(p, ops, self.decision.config)
                if self.bound is _UNBOUND:
                    self.bound = self.backend.bind(p, self.decision.config, ops)
                    if c is None and a.dim() == 2 and b.dim() == 2:  # out as allocated
                        self._hand_over(a, b, ops)
            else:
                self.bound(a, b, c, d, stream)
            return d
        given = a, b
        if p.batch == 1:
            a = a if a.dim() == 3 else a.unsqueeze(0)
            b = b if b.dim() == 3 else b.unsqueeze(0)
        else:
            a, b = batched(a, p.batch), batched(b, p.batch)
        c = batched(c, p.batch) if p.has_c else None
        if out is not None:
            d = out if out.dim() == 3 else out.unsqueeze(0)
        else:
            d = torch.empty((p.batch, p.m, p.n), dtype=self.d_dtype, device=device)
        ops = Operands(a, b, c, d, self.alpha, self.beta, stream)
        self.backend.run(p, ops, self.decision.config)
        if self.bound is _UNBOUND:  # a batch run as one product may go to the front
            self.bound = None
            if c is None and out is None and folded_batch(p) is not None:
                self._hand_over(*given, ops)
        if out is not None:
            return out
        return d[0] if self.squeeze else d


_PLANS: dict[tuple, Plan] = {}


@functools.cache
def _gpu_present() -> bool:
    """Whether torch sees a GPU, where the full path computes host tensors (asked once)."""
    return sys.modules["torch"].cuda.is_available()


def as_allocated(out: Any, a: Any, b: Any) -> bool:
    """Whether ``out``, given for a product of 2-D torch tensors or CuPy arrays ``a`` and
    ``b`` (its shape and dtype already checked), is what a plan of the call without it would
    allocate for D: an array of their own class on A's device, row-major contiguous, 16-byte
    aligned (the alignment the call is decided with). Such a call has that call's Problem,
    so the compiled front serves both with one plan, writing ``out`` in place of the array
    it allocates."""
    cls = out.__class__
    if not (cls is a.__class__ is b.__class__):
        return False
    torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
    if torch is not None and cls is torch.Tensor:
        if a.dim() != 2 or b.dim() != 2 or out.dim() != 2 or out.is_neg():
            return False
        return (out.stride() == (out.shape[1], 1) and out.data_ptr() % 16 == 0
                and out.device == a.device)
    if cupy is not None and cls is cupy.ndarray:
        return (a.ndim == b.ndim == out.ndim == 2 and out.data.ptr % 16 == 0
                and out.strides == (out.shape[1] * out.itemsize, out.itemsize)
                and out.device.id == a.device.id)
    return False


def as_tensors(arrays: tuple) -> tuple[str, tuple] | None:
    """(kind, torch tensors) when every array is a torch tensor or a CuPy array (None
    entries kept), else None: other kinds, tensors with torch's lazy negation bit, and host
    tensors where there is a GPU (the full path copies them there, and an ``out`` back) take
    the full path."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    a, b, c, out = arrays
    if a is None or b is None:  # the full path names the missing operand
        return None
    if type(a) is tensor and type(b) is tensor and c is None and out is None and (
            a.is_cuda and b.is_cuda) and not (a.is_neg() or b.is_neg()):
        return "torch", arrays  # the common call, without the loop
    kind = None
    adapted = []
    for x in arrays:
        if x is None:
            adapted.append(None)
            continue
        if isinstance(x, tensor):
            if x.is_neg():  # torch's lazy negation: the full path resolves it, every call
                return None
            if not x.is_cuda and (x.is_meta or _gpu_present()):
                return None  # a meta tensor is refused, a host one staged, by the full path
            this = "torch"
        elif type(x).__module__.startswith("cupy"):
            this, x = "cupy", torch.from_dlpack(x)
        else:
            return None
        kind = kind or this
        adapted.append(x)
    return kind, tuple(adapted)


#: the environment as os.environ holds it (encoded names and values), read directly on the
#: hot path: os.environ.get encodes the name and decodes the value, a microsecond a name
ENVIRON = getattr(os.environ, "_data", None)
_WATCHED = (ENV_BACKEND, ENV_TUNING, ENV_AUTOTUNE)
_ENCODE = getattr(os.environ, "encodekey", str)
BACKEND_KEY, TUNING_KEY, AUTOTUNE_KEY = map(_ENCODE, _WATCHED)


def _watched_environment() -> tuple:
    """The (encoded) values of the environment variables dispatch reads."""
    if isinstance(ENVIRON, dict):
        get = ENVIRON.get
        return get(BACKEND_KEY), get(TUNING_KEY), get(AUTOTUNE_KEY)
    return tuple(map(os.environ.get, _WATCHED))


def key(kind: str, tensors: tuple, options: tuple) -> tuple:
    """Everything validation and dispatch read, for tensors already adapted: the options,
    the array kind, the watched environment and tables, and each array's dtype, shape,
    strides, device and pointer offset within 256 bytes (which fixes its alignment)."""
    a, b, c, out = tensors
    head = (options, kind, _watched_environment(), tables.generation(),
            a.dtype, a.shape, a.stride(), a.get_device(), a.data_ptr() & 255,
            b.dtype, b.shape, b.stride(), b.get_device(), b.data_ptr() & 255)
    if c is None and out is None:
        return head
    tail = [head]
    for t in (c, out):
        tail.append(None if t is None else
                    (t.dtype, t.shape, t.stride(), t.get_device(), t.data_ptr() & 255))
    return tuple(tail)


#: the call that makes D for a product whose plan holds for every shape below a size (A and B of
#: one dtype, no ``out``, C only with 2-D A and B, cuBLAS decided with nothing shape-dependent in
#: the way below those sizes: see :func:`multibackend.choose.dispatch.shape_free`), keyed without
#: sizes, strides or alignment, by the caller's arrays as they are (torch tensors or CuPy arrays:
#: no conversion), with the element counts of A and B below which (either one) it holds. The call
#: checks the shapes itself; one it refuses takes the full path, which words the error.
FAMILIES: dict[tuple, tuple] = {}

GENERATION = tables.generation_counter()

#: the first entry of a plain matmul's options (A and B only, every keyword at its default
#: but ``backend``): its keys leave the defaults out
PLAIN = "matmul:plain"
#: what :func:`plain` answers when no family plan runs the call
MISS = object()


def torch_key(options: Any, a: Any, b: Any, c: Any = None) -> tuple | None:
    """A torch product's family key (``options`` a backend name for a plain call, else the
    options tuple): the dtypes and ranks of A and B, the device, the watched environment
    and tables, and C's dtype and strides (row stride 0 for a bias broadcast over the rows:
    then shape-free); None for a host tensor (multibackend computes it on the GPU, where its
    own op would compute on the host)."""
    device = a.get_device()
    if device < 0:
        return None
    get = ENVIRON.get
    key = (options, a.dtype, b.dtype, a.ndim, b.ndim, device, get(BACKEND_KEY),
           get(TUNING_KEY), get(AUTOTUNE_KEY), GENERATION[0])
    return key if c is None else key + (c.dtype, c.stride())


def family_key(options: tuple, a: Any, b: Any, c: Any = None) -> tuple | None:
    """The key of a product of two arrays (and C, for torch tensors) with no ``out``, sizes
    left out; None for arrays other than torch tensors or CuPy arrays all alike, and for
    host tensors. A plain call's (options ``(PLAIN, backend)``) is the key :func:`plain`
    looks up."""
    cls = a.__class__
    torch = sys.modules.get("torch")
    if torch is not None and cls is torch.Tensor and isinstance(ENVIRON, dict):
        if b.__class__ is not cls or (c is not None and c.__class__ is not cls):
            return None
        return torch_key(options[1] if options[0] == PLAIN else options, a, b, c)
    cupy = sys.modules.get("cupy")
    if cupy is not None and cls is cupy.ndarray and b.__class__ is cls and c is None:
        return (options, _watched_environment(), GENERATION[0], "cupy", a.dtype, b.dtype,
                a.ndim, b.ndim, a.device.id)
    return None


def served(a: Any, b: Any, c: Any, backend: Any, autotune: Any, options: dict) -> Any:
    """The result of ``matmul(a, b, c, backend=backend, autotune=autotune, **options)`` on
    torch tensors made by its family plan where the call is plain (no autotune, no other
    keyword), else :data:`MISS`: the Python front of a repeated call (:func:`front`)."""
    if autotune is None and not options:
        return plain(a, b, c, backend)
    return MISS


#: the compiled front (:mod:`multibackend.run.fastcall`) once bound, else None
_COMPILED: list = [None]


def front() -> Any:
    """The function serving a repeated plain call on torch tensors, ``(A, B, C, backend,
    autotune, options)`` to D or :data:`MISS`: the compiled one, bound to this module's
    families, environment and tables, where it loads (it serves calls without C itself and
    hands calls with C to :func:`served`); else :func:`served`. Loads torch (and may build
    the compiled front)."""
    module = _COMPILED[0]
    if module is None:
        module = fastcall.load() if isinstance(ENVIRON, dict) else None
        if module is None:
            return served
        bind(module)
        _COMPILED[0] = module
        for fam_key, found in list(FAMILIES.items()):
            _hand_over(fam_key, found)
    return module.serve


#: the words a dot's one option is remembered under in the compiled front, by option
DOT_WORDS = {"backend": "dot:backend", "autotune": "dot:autotune"}


def unserved(*_: Any) -> Any:
    """:data:`MISS`: the front of a repeated dot where the compiled one is not in use."""
    return MISS


def dot_front() -> Any:
    """The function serving a repeated dot of torch tensors, ``(x, y, backend, autotune,
    options)`` to its result or :data:`MISS`: the compiled front's (see :func:`front`), else
    :func:`unserved`."""
    front()
    module = _COMPILED[0]
    return module.serve_dot if module is not None else unserved


def bind(module: Any) -> None:
    """Bind the compiled front to this module's Python front, MISS, environment and tables."""
    torch = sys.modules["torch"]
    module.bind(served, MISS, ENVIRON, (BACKEND_KEY, TUNING_KEY, AUTOTUNE_KEY), GENERATION,
                getattr(torch._C, "_cuda_getCurrentRawStream", None))


def _hand_over(fam_key: tuple, found: tuple) -> None:
    """Give the compiled front a family plan it can serve: a plain call's on torch tensors
    (key of :func:`torch_key`, without C) made by ``torch.mm`` or ``torch.matmul``."""
    module, op = _COMPILED[0], _torch_op(found[0])
    if module is None or op is None or len(fam_key) != 10 or not (
            fam_key[0] is None or isinstance(fam_key[0], str)):
        return
    backend, a_dtype, b_dtype, a_ndim, b_ndim, device, *environment, generation = fam_key
    module.remember(backend, a_dtype, b_dtype, a_ndim, b_ndim, device, tuple(environment),
                    generation, op, tuple(found[1:6]))


def hand_over_exact(word: tuple[str, Any], a: Any, b: Any, produce: Any) -> None:
    """Give the compiled front a plan just made for a call with one option ``word`` (name,
    value: ``("backend", name)`` for a plain call, ``("autotune", mode)`` for an autotuned
    one, ``("config", (name, config))`` for one naming a backend's config) on torch tensors
    exactly like ``a`` and ``b`` (dtype, sizes, strides, device, pointer offset within 256
    bytes), made by ``torch.mm`` or ``torch.matmul`` (``produce``); it then serves such calls
    under the environment and tables of now."""
    module, op = _COMPILED[0], _torch_op(produce)
    torch = sys.modules.get("torch")
    if module is None or op is None or not isinstance(word[0], str):
        return
    if a.__class__ is not torch.Tensor or b.__class__ is not torch.Tensor:
        return
    module.remember_exact(word[0], word[1], a, b, _watched_environment(), GENERATION[0], op)


def hand_over_native(word: tuple[str, Any], a: Any, b: Any, launch: Native | None) -> None:
    """Give the compiled front a plan whose D the backend's kernels make (``launch``, as
    :meth:`~multibackend.backends.base.Backend.native` describes them; nothing where None),
    for calls with one option ``word`` on torch tensors exactly like ``a`` and ``b``, under
    the environment and tables of now. Where the driver cannot be loaded from here, the
    Python path keeps the calls."""
    module = _COMPILED[0]
    if module is None or launch is None or not isinstance(word[0], str):
        return
    try:
        module.remember_native(word[0], word[1], a, b, _watched_environment(), GENERATION[0],
                               launch.d_dtype, launch.d_sizes, launch.context,
                               tuple(step.wire() for step in launch.steps), launch.keep)
    except RuntimeError:  # no libcuda.so.1 to launch from
        return


#: (cupy.ndarray, the compiled front's serve_arrays and serve_dot_arrays) once a plan of CuPy
#: arrays is handed over
ARRAYS: list = [None, None, None]


def hand_over_native_arrays(word: tuple[str, Any], a: Any, b: Any,
                            launch: Native | None) -> None:
    """:func:`hand_over_native` for calls on CuPy arrays, ``a`` and ``b`` the torch views of
    this call's arrays: the front then serves calls on arrays of the same dtype, shape,
    strides, alignment and device with ``cupy.empty`` for D and CuPy's current stream."""
    key = array_key(word, a, b)
    d_dtype = _numpy_dtype(launch.d_dtype) if launch is not None else None
    module = _arrays_front() if key is not None and d_dtype is not None else None
    if module is None:
        return
    try:
        module.remember_arrays(key, _watched_environment(), GENERATION[0], launch.d_sizes,
                               d_dtype, launch.d_dtype, launch.context,
                               tuple(step.wire() for step in launch.steps), launch.keep)
    except RuntimeError:  # no libcuda.so.1 to launch from
        return


def hand_over_call_arrays(word: tuple[str, Any], a: Any, b: Any, produce: Any) -> None:
    """Give the compiled front a plan just made for a call with one option ``word`` on CuPy
    arrays ``a`` and ``b`` whose D ``produce(a, b)`` makes (the cuBLAS backend's producing
    call): it then serves calls on arrays of the same dtype, shape, strides, alignment and
    device — launching what ``produce.native(a, b)`` describes, where it describes it, else
    calling ``produce`` — under the environment and tables of now."""
    module = _arrays_front()
    if module is None:
        return
    import torch

    ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
    describe = getattr(produce, "native", None)
    launch = describe(a, b) if describe is not None else None
    if launch is not None:
        hand_over_native_arrays(word, ta, tb, launch)
        return
    key = array_key(word, ta, tb)
    if key is not None:
        module.remember_array_call(key, _watched_environment(), GENERATION[0], produce)


#: whether :func:`_arrays_front` has tried to load the compiled front for CuPy arrays
_ARRAYS_TRIED = [False]


def _arrays_front() -> Any:
    """The compiled front (loaded and bound where it can be, see :func:`front`; tried once)
    with CuPy bound as its array library, or None where it is not in use."""
    if ARRAYS[0] is None and not _ARRAYS_TRIED[0]:
        _ARRAYS_TRIED[0] = True
        front()
        module = _COMPILED[0]
        if module is not None:
            import cupy

            module.bind_arrays(cupy.ndarray, cupy.empty, _cupy_stream)
            ARRAYS[:] = [cupy.ndarray, module.serve_arrays, module.serve_dot_arrays]
    return _COMPILED[0] if ARRAYS[0] is not None else None


def array_key(word: tuple[str, Any], a: Any, b: Any) -> tuple | None:
    """The compiled front's key of a call with one option ``word`` on CuPy arrays whose
    torch views are ``a`` and ``b``: the word, then each array's NumPy dtype, shape, strides
    in bytes and address modulo 256, then the device (as the front reads them from the
    arrays); None where a dtype has no NumPy spelling or the word is not a name."""
    if not isinstance(word[0], str):
        return None
    key = (word[0], word[1])
    for t in (a, b):
        dtype = _numpy_dtype(t.dtype)
        if dtype is None:
            return None
        key += (dtype, tuple(t.shape), tuple(s * t.element_size() for s in t.stride()),
                t.data_ptr() & 255)
    return key + (a.get_device(),)


def _numpy_dtype(dtype: Any) -> Any:
    """The NumPy dtype of a torch dtype, or None (bfloat16 has none)."""
    import numpy

    try:
        return numpy.dtype(str(dtype).removeprefix("torch."))
    except TypeError:
        return None


def _cupy_stream() -> int:
    """The raw handle of CuPy's current stream."""
    return sys.modules["cupy"].cuda.get_current_stream().ptr


def _torch_op(produce: Any) -> str | None:
    """"mm" or "matmul" where ``produce`` is ``torch.mm`` or ``torch.matmul``, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if produce is torch.mm:
        return "mm"
    return "matmul" if produce is torch.matmul else None


def plain(a: Any, b: Any, c: Any, backend: Any) -> Any:
    """The result of a plain call ``matmul(a, b, c, backend=backend)`` on torch tensors
    made by its family plan, or :data:`MISS` where none holds (or the op refused the
    arrays: the full path words the error). The hot path of every repeated plain call."""
    try:
        found = FAMILIES.get(torch_key(backend, a, b, c))
        if found is not None and (a.numel() < found[1] or below(a, b, found)):
            return found[0](a, b) if c is None else made(found, a, b, c)
    except (RuntimeError, ValueError, TypeError, AttributeError):
        pass
    return MISS


#: how many times :func:`forget` ran: a layer's memo made before the last time is stale
FORGOTTEN = [0]


def made(found: tuple, a: Any, b: Any, c: Any) -> Any:
    """D made by a family plan ``found`` (its bounds already checked), or :data:`MISS`
    where C is not D's shape (the op would broadcast what matmul refuses)."""
    if c is None:
        return found[0](a, b)
    if c.shape == (a.shape[0], b.shape[1]):
        return found[0](a, b, c)
    return MISS


def below(a: Any, b: Any, found: tuple) -> bool:
    """Whether a family plan's decision holds for A and B: fewer elements in A or B, or a
    smaller M, N or K, than the bounds it holds below (see
    :func:`multibackend.choose.dispatch.shape_free`; infinite where it holds for every size);
    element counts first, shapes only if need be."""
    if _size(a) < found[1] or _size(b) < found[2]:
        return True
    a_shape, b_shape = a.shape, b.shape
    return a_shape[-2] < found[3] or b_shape[-1] < found[4] or a_shape[-1] < found[5]


def _size(array: Any) -> int:
    """Elements of a torch tensor (``numel()``) or CuPy array (``size``)."""
    numel = getattr(array, "numel", None)
    return numel() if numel is not None else array.size


#: family(key): (the op that makes D, elements of A, elements of B, M, N, K) for the calls
#: under a family key whose A or B holds fewer elements, or whose M, N or K is smaller, than
#: those bounds; None where there is none
#: (the dict's own lookup: this is the hot path of every repeated plain call)
family = FAMILIES.get


def remember_family(fam_key: tuple, produce: Any, limits: tuple[float, ...]) -> None:
    if len(FAMILIES) >= LIMIT:
        FAMILIES.clear()
    FAMILIES[fam_key] = found = (produce, *limits)
    _hand_over(fam_key, found)


def lookup(plan_key: tuple) -> Plan | None:
    return _PLANS.get(plan_key)


def remember(plan_key: tuple, plan: Plan) -> None:
    if len(_PLANS) >= LIMIT:
        _PLANS.clear()
    _PLANS[plan_key] = plan


def forget() -> None:
    """Drop every remembered plan (after the registry or environment changed), layers'
    memos included."""
    _PLANS.clear()
    FAMILIES.clear()
    FORGOTTEN[0] += 1
    if _COMPILED[0] is not None:
        _COMPILED[0].forget()
