"""The eager call path behind the public ``matmul``, ``binary_matmul`` and ``dot``: a repeated
call served by its remembered plan (or the compiled front), a new one validated, decided
(first-call autotuning included), run and remembered. :mod:`multibackend.api` is the public
face and states the semantics."""
from __future__ import annotations

import inspect
import sys
from typing import Any

from multibackend import first_call
from multibackend.choose import store
from multibackend.choose.dispatch import Decision, decide, shape_free
from multibackend.choose.registry import REGISTRY
from multibackend.core import scales
from multibackend.core.errors import (
    CaptureError,
    InvalidArgument,
)
from multibackend.core.names import BASELINE
from multibackend.io.arrays import capturing
from multibackend.io.request import Call, dot_call, matmul_call
from multibackend.run import plans
from multibackend.run.execute import answer_trivial, check_trivial, execute, finish, resolve_config

BITOPS = ("xor", "and")


def matmul(A: Any, B: Any, C: Any = None, *, backend: Any = "auto", autotune: Any = None,
           **options: Any) -> Any:
    """``D = alpha * A @ B + beta * C`` on the backend ``backend`` ("auto" by default).

    ``out_dtype``: D's dtype (default: A's for floats, int32 for integers, float32 for fp8).
    ``scale_a``, ``scale_b``: for fp8 A and B, float32 scales, tensor-, row- or block-wise:
    ``D = (scale_a * A) @ (scale_b * B) + beta * C`` (see :mod:`multibackend.core.scales`;
    :func:`multibackend.quantize` makes them).
    ``acc_dtype``: the accumulator (float32 by default; float16 where a backend offers it).
    ``precision``: for float32 operands, "ieee" (default), "tf32" or "tf32x3".
    ``dtype``: "int4" or "uint4" when A and B are packed sub-byte operands (uint8 arrays
    packed along K, see :mod:`multibackend.core.packing`). ``beta`` defaults to 1 when C is given.
    ``autotune``: first-call autotuning for ``backend="auto"`` (True or "eager", "graph";
    None: ``$MULTIBACKEND_AUTOTUNE`` decides; see :mod:`multibackend.first_call`).

    A call with new arguments plans (validates, dispatches, compiles, autotunes); a repeated
    one only launches, and may be captured in a CUDA graph. A first call made while a graph
    is being captured raises :class:`~multibackend.core.errors.CaptureError`.

    Under torch.compile, and where autograd must record a call that torch's own op would not run,
    the call goes through the registered operator :mod:`multibackend.integrations.torch_op` (under
    torch.compile, a call dispatch gives to cuBLAS is traced as torch's own op).
    """
    cls = A.__class__
    if cls is _TENSOR and not _compiling():
        # a repeated call on torch tensors with at most backend or autotune: its plan, at once
        done = _served(A, B, C, backend, autotune, options)
        if done is not _MISS:
            return done
    elif cls is _ARRAYS[0]:  # the same on CuPy arrays, once such a plan was handed over
        done = _ARRAYS[1](A, B, C, backend, autotune, options)
        if done is not _MISS:
            return done
    try:
        return _matmul(A, B, C, backend=backend, autotune=autotune, **options)
    except TypeError:
        _check_keywords("matmul", options, _matmul)
        raise


def _check_keywords(op: str, given: dict, spelled_out: Any) -> None:
    """Raise the TypeError Python would for a keyword ``op`` does not take, under ``op``'s own
    name (``spelled_out`` is the function its keywords go to), listing the ones it takes."""
    taken = [name for name, p in inspect.signature(spelled_out).parameters.items()
             if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(given) - set(taken))
    if unknown:
        raise TypeError(f"{op}() got an unexpected keyword argument {unknown[0]!r} (it takes "
                        f"{', '.join(taken)})") from None


def _matmul(A: Any, B: Any, C: Any = None, *, alpha: Any = 1.0, beta: Any = None,
            out: Any = None, out_dtype: Any = None, acc_dtype: Any = None,
            precision: str | None = None, saturate: bool = False, dtype: str | None = None,
            backend: str | None = "auto", config: Any = None, autotune: Any = None,
            scale_a: Any = None, scale_b: Any = None) -> Any:
    """:func:`matmul` with its keywords spelled out: every call but a repeated plain one."""
    if scale_a is not None or scale_b is not None:
        return _scaled(A, B, C, alpha=alpha, beta=beta, out=out, out_dtype=out_dtype,
                       acc_dtype=acc_dtype, precision=precision, saturate=saturate,
                       packed=packed(dtype), backend=backend, config=config,
                       autotune=autotune, scale_a=scale_a, scale_b=scale_b)
    # every keyword but out, backend, config and autotune at its default
    others = _at_defaults(alpha, beta, out_dtype, acc_dtype, precision, saturate, dtype)
    defaults = others and out is None and config is None
    plain = defaults and autotune is None
    if _compiling():  # torch.compile traces torch's own op or the registered operator
        return OPERATOR().compiled(A, B, C, plain, alpha=alpha, beta=beta, out=out,
                                 out_dtype=out_dtype, acc_dtype=acc_dtype,
                                 precision=precision, saturate=saturate, dtype=dtype,
                                 backend=backend, config=config, autotune=autotune)
    if plain:
        options: tuple = (plans.PLAIN, backend)  # the plain call, keyed by less
    else:
        options = ("matmul", alpha, beta, out_dtype, acc_dtype, precision, saturate, dtype,
                   backend, config, autotune)
    fast = _planned(options, (A, B, C, out))
    if fast[0] is not None:
        return fast[0]
    if _records_grad(A, B, C):  # autograd records the registered operator
        if backend not in (None, "auto"):
            REGISTRY.check_name(backend, "matmul")
        return _recorded(A, B, C, alpha=alpha, beta=beta, out=out, out_dtype=out_dtype,
                         acc_dtype=acc_dtype, precision=precision, saturate=saturate,
                         dtype=dtype, backend=backend, config=config, autotune=autotune)
    call = matmul_call(A, B, C, alpha=alpha, beta=beta, out=out, out_dtype=out_dtype,
                       acc_dtype=acc_dtype, precision=precision, saturate=saturate,
                       packed=packed(dtype))

    def rerun(name: str, chosen: Any, into: Any) -> Any:
        if defaults and chosen is None and into is None:  # as the call runs once chosen,
            return matmul(A, B, C, backend=name)  # which the compiled front may serve
        return matmul(A, B, C, alpha=alpha, beta=beta, out=into, out_dtype=out_dtype,
                      acc_dtype=acc_dtype, precision=precision, saturate=saturate, dtype=dtype,
                      backend=name, config=chosen)

    # an out the front may write as the D a plan of the call without it would allocate
    as_made = out is None or (C is None and others and plans.as_allocated(out, A, B))
    direct = as_made and (C is None or (call.squeeze and getattr(C, "ndim", 2) == 2))
    exact = None  # a call with one option (or none), no C: its plan may go to the front
    if C is None and fast[1] is not None and others and as_made:
        if config is None and autotune is None:
            exact = ("backend", backend), A, B
        elif config is None and backend == "auto":
            exact = ("autotune", autotune), A, B
        elif config is not None and autotune is None and A.__class__ is _TENSOR:
            exact = ("config", (backend, config)), A, B
    return _dispatch_and_run(call, backend, config, fast[1:], rerun, autotune, direct, exact)


def _scaled(A: Any, B: Any, C: Any, *, backend: str | None, config: Any, autotune: Any,
            **arguments: Any) -> Any:
    """A scaled fp8 product. A repeated one (scales given as torch tensors) runs its
    remembered plan, with the scales of this call: the plan's key holds what validation read
    of them (dtype, shape, device), never the tensors, so each call's scales are read as they
    are (made contiguous where they are not). A first one validates, decides and runs; it cannot be made
    while a CUDA graph is being captured."""
    if _compiling():
        raise InvalidArgument("matmul: scale_a or scale_b under torch.compile: scaled fp8 "
                              "products are not traced by torch.compile; call matmul outside "
                              "the compiled region")
    found = _scaled_plan(A, B, C, arguments, backend, config, autotune)
    plan_key = None
    if found is not None:
        plan_key, tensors, plan = found
        if plan is not None:
            p = plan.problem
            given = [arguments["scale_a"], arguments["scale_b"]]
            for i, (operand, rows, cols) in enumerate((("A", p.m, p.k), ("B", p.k, p.n))):
                given[i] = (sys.modules["torch"].ones((), dtype=sys.modules["torch"].float32,
                                                      device=tensors[0].device)
                            if given[i] is None else
                            scales.canonical(given[i], p.scales[i], operand, rows, cols))
            if tensors[3] is not None:
                plan.check_out("matmul", tensors)
                plan.run(tensors, scales=tuple(given))
                return arguments["out"]
            return plan.run(tensors, scales=tuple(given))
    call = matmul_call(A, B, C, **arguments)
    if call.device.type == "cuda" and capturing(call.kind, call.device):
        raise CaptureError(f"matmul: first call for {call.problem.describe()} while a CUDA "
                           "graph is being captured: a first call validates, dispatches and "
                           "compiles, none of which can be captured; call it once with the "
                           "same arguments (scales of the same shapes) before capturing")
    return _dispatch_and_run(call, backend, config, (plan_key, None), autotune=autotune)


def _scaled_plan(A: Any, B: Any, C: Any, arguments: dict, backend: Any, config: Any,
                 autotune: Any) -> tuple | None:
    """(the plan key of a scaled call, its arrays as torch tensors, the plan remembered under
    it or None), or None where it can have no plan: scales that are not torch tensors,
    alpha or beta of other types than Python int and float, arrays the plans do not take,
    unhashable options."""
    torch = sys.modules.get("torch")
    alpha, beta = arguments["alpha"], arguments["beta"]
    given = (arguments["scale_a"], arguments["scale_b"])
    if torch is None or type(alpha) not in _PLAIN_SCALARS or type(beta) not in _PLAIN_SCALARS \
            or any(s is not None and type(s) is not torch.Tensor for s in given):
        return None
    adapted = plans.as_tensors((A, B, C, arguments["out"]))
    if adapted is None:
        return None
    kind, tensors = adapted
    options = ("matmul:scaled", alpha, beta, arguments["out_dtype"], arguments["acc_dtype"],
               arguments["precision"], arguments["saturate"], arguments["packed"], backend,
               config, autotune, type(alpha), type(beta))
    read = tuple(None if s is None else (s.dtype, s.shape, s.get_device()) for s in given)
    try:
        plan_key = (plans.key(kind, tensors, options), read)
        return plan_key, tensors, plans.lookup(plan_key)
    except (TypeError, RuntimeError):  # an unhashable option; a tensor without storage
        return None


def _at_defaults(alpha: Any, beta: Any, out_dtype: Any, acc_dtype: Any, precision: Any,
                 saturate: Any, dtype: Any) -> bool:
    """Whether every keyword but ``out``, ``backend``, ``config`` and ``autotune`` is at its
    default."""
    return (beta is None and type(alpha) is float and alpha == 1
            and out_dtype is None and acc_dtype is None and precision is None
            and saturate is False and dtype is None)


# -- models: torch.compile and autograd go through the registered operator --

#: the registered torch operator's module (:mod:`multibackend.integrations.torch_op`, a layer
#: above this one, which calls this path): a function that imports it on first use, bound by
#: :mod:`multibackend.api` when the package is imported
OPERATOR: Any = None


#: torch.Tensor, once torch is imported: the class :func:`matmul`'s shortest path serves
_TENSOR: Any = None


def _compiling() -> bool:
    """Whether torch.compile is tracing the call: torch's own check, which it reads as True
    while tracing, bound here once torch is imported (no torch, nothing to trace), with
    :data:`_TENSOR`."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    global _compiling, _TENSOR
    _compiling = torch.compiler.is_dynamo_compiling
    _TENSOR = torch.Tensor
    return _compiling()


if "torch" in sys.modules:  # bound now: a compiled caller's guards then see one function
    _compiling()


def _records_grad(A: Any, B: Any, C: Any) -> bool:
    """Whether autograd records this call: an operand requiring grad (a torch tensor, so
    torch is imported) and grad mode on."""
    return (getattr(A, "requires_grad", False) or getattr(B, "requires_grad", False)
            or getattr(C, "requires_grad", False)) and sys.modules["torch"].is_grad_enabled()


def _recorded(A: Any, B: Any, C: Any, **options: Any) -> Any:
    """The call through the registered operator (:func:`multibackend.integrations.torch_op.matmul`)."""
    return OPERATOR().matmul(A, B, C, **options)


def packed(dtype: Any) -> str | None:
    """matmul's ``dtype`` keyword checked: the packed operand type it names, or None."""
    if dtype is not None and dtype not in ("int4", "uint4"):
        raise InvalidArgument(f"matmul: dtype is {dtype!r}: only 'int4' and 'uint4' name packed "
                              "operands (use binary_matmul for bits; other dtypes come from "
                              "the arrays)")
    return dtype


def binary_matmul(A: Any, B: Any, *, op: str = "xor", out: Any = None,
                  backend: str | None = "auto", config: Any = None) -> Any:
    """Popcounts of bit-packed rows of A against bit-packed columns of B.

    ``D[i, j] = popcount(A[i, :] op B[:, j])`` over K bits, with ``op`` "xor" (a Hamming
    distance matrix) or "and". A is uint8 (M, K/8) and B uint8 (K/8, N), packed along K as
    :func:`multibackend.core.packing.pack_bits` does; D is int32 (M, N).
    """
    fast = _planned(("binary_matmul", op, backend, config), (A, B, None, out))
    if fast[0] is not None:
        return fast[0]
    if op not in BITOPS:
        raise InvalidArgument(f"binary_matmul: op is {op!r}: expected 'xor' or 'and'")
    call = matmul_call(A, B, None, alpha=1, beta=0, out=out, out_dtype="int32",
                       acc_dtype="int32", packed="bit", bitop=op, op="binary_matmul")
    return _dispatch_and_run(call, backend, config, fast[1:])


#: the types alpha and beta may have in a plan's key: anything else (bool, which is refused;
#: NumPy scalars and 0-d arrays) takes the full path
_PLAIN_SCALARS = frozenset({int, float, type(None)})
_MISS = plans.MISS
_ARRAYS = plans.ARRAYS


def _served(A: Any, B: Any, C: Any, backend: Any, autotune: Any, options: dict) -> Any:
    """The front of a repeated plain call on torch tensors (:func:`plans.front`), chosen on
    the first call (which loads, or builds, the compiled one) and bound here for the next."""
    global _served
    _served = plans.front()
    return _served(A, B, C, backend, autotune, options)


#: help() and IDEs show matmul's keywords, which it passes on to the full path
matmul.__signature__ = inspect.signature(_matmul)


def _planned(options: tuple, arrays: tuple) -> tuple[Any, tuple | None, tuple | None]:
    """(the result, None, None) when a remembered plan ran the call; else (None, the key
    under which to remember this call's plan, the key of its shape-free family plan). A key
    is None where there can be none: alpha or beta other than a Python int or float,
    unhashable options, arrays other than torch tensors and CuPy arrays; the family key only
    without ``out``, for torch tensors (C too) or CuPy arrays (no C), all of one kind. A
    remembered plan whose backend autograd cannot see (any but torch's own op, which with
    ``out`` it sees neither) does not run a matmul autograd must record: (None, None,
    None). ``options`` starts with the op (or :data:`multibackend.run.plans.PLAIN`); for matmul
    its second and third entries are alpha and beta, keyed with their types (alpha=1 and
    alpha=1.0 plan apart)."""
    if options[0] == "matmul":
        kinds = (type(options[1]), type(options[2]))
        if kinds[0] not in _PLAIN_SCALARS or kinds[1] not in _PLAIN_SCALARS:
            return None, None, None
        options += kinds
    fam_key = None
    if options[0] in ("matmul", plans.PLAIN) and arrays[3] is None:
        fam_key = plans.family_key(options, *arrays[:3])
        try:
            found = plans.family(fam_key)
        except TypeError:  # an unhashable option
            return None, None, None
        if found is not None and plans.below(arrays[0], arrays[1], found):
            try:
                done = plans.made(found, *arrays[:3])
            except (RuntimeError, ValueError):  # refused: the full path words the error
                return None, None, None
            if options[0] == plans.PLAIN and fam_key[3] == "cupy" and done is not plans.MISS:
                # the compiled front serves this shape's later calls (CuPy has no families
                # there), so a CuPy call reaches this path once per shape
                plans.hand_over_call_arrays(("backend", options[1]), arrays[0], arrays[1],
                                            found[0])
            return (None if done is plans.MISS else done), None, None
    adapted = plans.as_tensors(arrays)
    if adapted is None:
        return None, None, None
    kind, tensors = adapted
    try:
        plan_key = plans.key(kind, tensors, options)
        plan = plans.lookup(plan_key)
    except TypeError:  # an unhashable option
        return None, None, None
    except RuntimeError:  # a tensor without a data pointer (sparse): the full path words it
        return None, None, None
    if plan is not None:
        if (plan.produce is None or tensors[3] is not None) and options[0] != "dot" and (
                _records_grad(*tensors[:3])):  # only torch's own op, without out, records
            return None, None, None
        if tensors[3] is not None:  # the key holds no addresses: out checked apart each call
            plan.check_out(options[0], tensors)
            plan.run(tensors)
            return arrays[3], None, None  # the caller's own out, written
        return plan.run(tensors), None, None
    return None, plan_key, fam_key


def _refuse_capture(call: Call) -> None:
    """A call that must plan cannot run inside a CUDA graph capture: say how to fix it."""
    if call.device.type == "cuda" and capturing(call.kind, call.device):
        raise CaptureError(f"{call.problem.op}: first call for {call.problem.describe()} while "
                           "a CUDA graph is being captured: a first call validates, "
                           "dispatches, compiles or autotunes and allocates, none of which "
                           "can be captured; call it once with the same arguments (shapes, "
                           "strides, dtypes, options) before capturing")


def autotune_mode(autotune: Any, backend: str | None, op: str) -> str | None:
    """First-call autotuning's timing mode for a call (None: off). Only ``auto`` autotunes;
    with a named backend a given ``autotune`` is still checked, and then unused."""
    if backend in (None, "auto"):
        return store.mode_of(autotune, op)
    if autotune is not None:
        store.mode_of(autotune, op)
    return None


def _decide(call: Call, backend: str | None, config: Any, rerun: Any,
            mode: str | None) -> Decision:
    """The decision for the call, after timing the backends first when first-call
    autotuning (in timing mode ``mode``) asks for it."""
    explicit = resolve_config(call.problem, backend, config)
    decision = decide(call.problem, backend, explicit, autotune=mode)
    if decision.backend is None and mode is not None and rerun is not None:
        accepted = [v.backend for v in decision.verdicts if v.accepted]
        accepted.sort(key=lambda name: name != BASELINE)
        entry = first_call.measure(call, accepted, mode, rerun, REGISTRY)
        if entry is not None:
            store.STORE.put(call.problem, mode, entry)
            decision = decide(call.problem, backend, explicit, autotune=mode)
    if decision.backend is None:  # autotuning asked for where it cannot measure (no GPU)
        decision = decide(call.problem, backend, explicit)
    return decision


def _dispatch_and_run(call: Call, backend: str | None, config: Any,
                      keys: tuple = (None, None), rerun: Any = None, autotune: Any = None,
                      direct: bool = False, exact: tuple | None = None) -> Any:
    """Validate, decide, run and remember the call's plan under ``keys`` (the plan's and
    its shape-free family's, see :func:`_planned`). ``direct``: the caller's arrays, as
    given, can go to a backend's own producing call (no ``out``; C, if any, 2-D with 2-D A
    and B). ``exact``: (the call's one option as (name, value), A, B) where the compiled
    front may serve its plan (:func:`multibackend.run.plans.hand_over_exact`)."""
    if backend not in (None, "auto"):
        REGISTRY.check_name(backend, call.problem.op)
    mode = autotune_mode(autotune, backend, call.problem.op)
    if call.problem.trivial or call.operands.alpha == 0:  # no product: A and B not read
        check_trivial(call.problem, backend, config)
        answer_trivial(call)
        return finish(call)
    _refuse_capture(call)
    decision = _decide(call, backend, config, rerun, mode)
    execute(call, decision)
    plan_key, fam_key = keys
    if plan_key is not None:
        plan = plans.Plan.of(call.problem, decision, call.kind, call.squeeze,
                             call.operands.alpha, call.operands.beta, direct)
        plans.remember(plan_key, plan)
        limits = None
        if fam_key is not None and plan.produce is not None:
            limits = shape_free(call.problem, decision, mode)
            if limits is not None:
                plans.remember_family(fam_key, plan.produce, limits)
        if exact is not None and plan.produce is not None and call.kind == "torch" and (
                exact[0][0] != "backend" or limits is None
                or not plans.below(exact[1], exact[2], (None, *limits))):
            # no family serves this call (one serves every shape below its bounds, for calls
            # with no option but a backend)
            plans.hand_over_exact(exact[0], exact[1], exact[2], plan.produce)
        elif exact is not None and plan.produce is not None and call.kind == "cupy":
            plans.hand_over_call_arrays(exact[0], exact[1], exact[2], plan.produce)
        elif exact is not None and plan.produce is None:
            plan.front = exact[0]  # its kernels go to the front once bound
    return finish(call)


def dot(x: Any, y: Any, *, backend: Any = "auto", autotune: Any = None, **options: Any) -> Any:
    """``x . y`` for 1-D vectors of one dtype (f16, bf16, f32, f64): a 0-d array in the
    accumulator's dtype (float32, or float64 for float64 inputs), made by the backend
    ``backend`` ("auto" by default). ``acc_dtype``: the accumulator; ``autotune`` as for
    :func:`matmul`. A repeated call with at most ``backend`` or ``autotune`` whose plan is a
    kernel of ours is launched by the compiled front (see :mod:`multibackend.run.fastcall`)."""
    cls = x.__class__
    if cls is _TENSOR and not _compiling():
        done = _dot_served(x, y, backend, autotune, options)
        if done is not _MISS:
            return done
    elif cls is _ARRAYS[0]:
        done = _ARRAYS[2](x, y, backend, autotune, options)
        if done is not _MISS:
            return done
    try:
        return _dot(x, y, backend=backend, autotune=autotune, **options)
    except TypeError:
        _check_keywords("dot", options, _dot)
        raise


def _dot(x: Any, y: Any, *, acc_dtype: Any = None, backend: str | None = "auto",
         config: Any = None, autotune: Any = None) -> Any:
    """:func:`dot` with its keywords spelled out: every call the front did not serve."""
    if _TENSOR is None:  # torch imported since: binds the class the front serves
        _compiling()
    fast = _planned(("dot", acc_dtype, backend, config, autotune), (x, y, None, None))
    if fast[0] is not None:
        return fast[0]
    call = dot_call(x, y, acc_dtype=acc_dtype)

    def rerun(name: str, chosen: Any, _into: Any) -> Any:
        if acc_dtype is None and chosen is None:  # as the call runs once chosen
            return dot(x, y, backend=name)
        return dot(x, y, acc_dtype=acc_dtype, backend=name, config=chosen)

    exact = None  # a call with one option (or none): its plan's kernels may go to the front
    if fast[1] is not None and acc_dtype is None and config is None:
        if autotune is None:
            exact = (plans.DOT_WORDS["backend"], backend), x, y
        elif backend == "auto":
            exact = (plans.DOT_WORDS["autotune"], autotune), x, y
    return _dispatch_and_run(call, backend, config, fast[1:], rerun, autotune, exact=exact)


def _dot_served(x: Any, y: Any, backend: Any, autotune: Any, options: dict) -> Any:
    """The front of a repeated dot on torch tensors (:func:`plans.dot_front`), chosen on the
    first call and bound here for the next."""
    global _dot_served
    _dot_served = plans.dot_front()
    return _dot_served(x, y, backend, autotune, options)


#: help() and IDEs show dot's keywords, which it passes on
dot.__signature__ = inspect.signature(_dot)
