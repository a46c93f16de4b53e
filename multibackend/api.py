"""The public calls: ``matmul``, ``binary_matmul``, ``dot`` and ``explain``.

Semantics every backend shares (and the tests hold them to):

- ``D = alpha * A @ B + beta * C``; A is (M, K) or (batch, M, K), B (K, N) or (batch, K, N),
  a 2-D operand is broadcast over the batch; C is (M, N) or (batch, M, N) of D's dtype.
- M, N, K may be any size >= 1. K = 0 gives ``beta * C`` (zeros without C; saturated where
  asked), M, N or a batch of 0 an empty result; these are answered here without a kernel,
  under the rules a kernel's call keeps (a named backend must be able to run here, options
  must be ones some backend computes).
- Integer inputs give int32 and take integer alpha and beta; fp8 inputs give float32.
- NaN and Inf in the inputs propagate as IEEE arithmetic says (0 * Inf = NaN, Inf - Inf =
  NaN, a NaN anywhere in a row of A or column of B poisons that output), the same in every
  backend. A result that saturates (``saturate=True``, WMMA's satf) maps +-Inf to the largest
  finite value and NaN to +0 instead.
- Work is ordered on the caller's current stream; nothing synchronizes the device, except
  that a NumPy result, or D for a host ``out``, is copied back to the host. Host operands are
  computed on the GPU where there is one. A call with ``out`` answers the caller's own
  ``out`` object.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

from multibackend.backends.base import Config

from . import autotune as first_call
from . import plans
from .arrays import capturing, on_stream, to_kind
from .dispatch import BASELINE, Decision, decide, shape_free, verdict
from .errors import BackendUnavailable, CaptureError, InvalidArgument, UnsupportedProblem
from .problem import Problem
from .registry import REGISTRY
from .request import Call, dot_call, matmul_call

BITOPS = ("xor", "and")


def execute(call: Call, decision: Decision) -> None:
    """Prepare and run the decided backend on the call's operands (on the caller's stream)."""
    backend = REGISTRY.get(decision.backend)
    with on_stream(call.operands.stream, call.device):
        backend.prepare(call.problem, decision.config)
        backend.run(call.problem, call.operands, decision.config)


#: capability rules about sizes, layouts and alignment: an empty or K = 0 product, which no
#: kernel runs, is not held to them
_SHAPE_RULES = frozenset({"shape", "size", "alignment", "layout", "batch"})


def _check_trivial(problem: Problem, backend: str | None, config: Any) -> None:
    """A problem answered without a kernel keeps the rules of a kernel's call but those about
    sizes and layout: a named backend must be able to run here and take its dtypes and
    options, a config must be one it could take, and under ``auto`` some backend must
    compute those dtypes and options at all. Each is checked on the problem with one row,
    column, step of K and batch entry where it has none."""
    probe = problem.with_(m=max(problem.m, 1), n=max(problem.n, 1), k=max(problem.k, 1),
                          batch=max(problem.batch, 1))
    named = backend not in (None, "auto")
    if config is not None and (not named or not isinstance(config, str)):
        _resolve_config(probe, backend, config)  # a config's name is not checked: none runs
    if named:
        found = verdict(probe, backend)
        if found.accepted or found.reason.rule in _SHAPE_RULES:
            return
        text = (f"{problem.op}: backend={backend!r} cannot run {problem.describe()}: "
                f"{found.reason.message} (rule: {found.reason.rule})")
        if REGISTRY.availability(backend) is not None:
            raise BackendUnavailable(text)
        raise UnsupportedProblem(text, [found.reason])
    refusals = [reason for name in REGISTRY.names
                if (impl := REGISTRY.get(name)) is not None
                and (reason := impl.supports(probe)) is not None
                and reason.rule not in _SHAPE_RULES]
    if len(refusals) == len(REGISTRY.names):
        listing = "; ".join(f"{r.backend}: {r.message}" for r in refusals)
        raise UnsupportedProblem(f"{problem.op}: no backend computes {problem.describe()} "
                                 f"at any size: {listing}", refusals)


def _answer_trivial(call: Call) -> None:
    """D of an empty or K = 0 problem: ``beta * C`` (zeros without C), saturated where the
    call asks (NaN to 0, +-Inf to the largest finite value)."""
    ops = call.operands
    if not ops.d.numel():
        return
    with on_stream(ops.stream, call.device):
        if ops.c is not None and ops.beta != 0:  # floats scaled in float64, rounded once
            ops.d.copy_(ops.c.double() * ops.beta if ops.c.is_floating_point()
                        else ops.c * ops.beta)
            if call.problem.saturate and ops.d.is_floating_point():
                import torch

                big = torch.finfo(ops.d.dtype).max
                torch.nan_to_num_(ops.d, nan=0.0, posinf=big, neginf=-big)
        else:
            ops.d.zero_()


def _finish(call: Call) -> Any:
    d = call.operands.d
    if call.problem.op == "dot":
        d = d.reshape(())
    elif call.own_out is not None:  # D went into a stand-in for the caller's own out
        if call.staged_out is not None:  # a host array: D comes back into it, in order
            with on_stream(call.operands.stream, call.device):
                call.staged_out.copy_(call.out)
        return call.own_out
    elif call.out is not None:
        d = call.out
    elif call.squeeze:
        d = d[0]
    result = to_kind(d, call.kind)
    if call.user_out is not None and result is not call.user_out:
        import numpy as np

        np.copyto(call.user_out, result)
        return call.user_out
    return result


def _resolve_config(problem: Problem, backend: str | None, config: Any) -> Config | None:
    """The Config asked for by ``config`` (a Config or one of the backend's config names)."""
    if config is None:
        return None
    op = problem.op
    if backend in (None, "auto"):
        raise InvalidArgument(f"{op}: config is {config!r} but backend is 'auto': a config "
                              "belongs to one backend, so name the backend too")
    impl = REGISTRY.get(backend)
    if isinstance(config, Config):
        fault = impl.check_config(problem, config) if impl is not None else None
        if fault is not None:
            raise InvalidArgument(f"{op}: config is {config.name!r}: {fault}")
        return config
    if not isinstance(config, str):
        raise InvalidArgument(f"{op}: config is {config!r}: expected a Config or a config name")
    offered = impl.configs(problem) if impl is not None else []
    for candidate in offered:
        if candidate.name == config:
            return candidate
    names = ", ".join(c.name for c in offered) or "none"
    raise InvalidArgument(f"{op}: config is {config!r}: not a config of backend {backend!r} "
                          f"for this problem (offered: {names})")


def matmul(A: Any, B: Any, C: Any = None, *, backend: Any = "auto", autotune: Any = None,
           **options: Any) -> Any:
    """``D = alpha * A @ B + beta * C`` on the backend ``backend`` ("auto" by default).

    ``out_dtype``: D's dtype (default: A's for floats, int32 for integers, float32 for fp8).
    ``acc_dtype``: the accumulator (float32 by default; float16 where a backend offers it).
    ``precision``: for float32 operands, "ieee" (default), "tf32" or "tf32x3".
    ``dtype``: "int4" or "uint4" when A and B are packed sub-byte operands (uint8 arrays
    packed along K, see :mod:`multibackend.packing`). ``beta`` defaults to 1 when C is given.
    ``autotune``: first-call autotuning for ``backend="auto"`` (True or "eager", "graph";
    None: ``$MULTIBACKEND_AUTOTUNE`` decides; see :mod:`multibackend.autotune`).

    A call with new arguments plans (validates, dispatches, compiles, autotunes); a repeated
    one only launches, and may be captured in a CUDA graph. A first call made while a graph
    is being captured raises :class:`~multibackend.errors.CaptureError`.

    Under torch.compile, and where autograd must record a call that torch's own op would not
    run, the call goes through the registered operator :mod:`multibackend.torch_op` (under
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
            backend: str | None = "auto", config: Any = None, autotune: Any = None) -> Any:
    """:func:`matmul` with its keywords spelled out: every call but a repeated plain one."""
    # every keyword but out, backend, config and autotune at its default
    others = _at_defaults(alpha, beta, out_dtype, acc_dtype, precision, saturate, dtype)
    defaults = others and out is None and config is None
    plain = defaults and autotune is None
    if _compiling():  # torch.compile traces torch's own op or the registered operator
        from . import torch_op

        return torch_op.compiled(A, B, C, plain, alpha=alpha, beta=beta, out=out,
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
                       packed=_packed(dtype))

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


def _at_defaults(alpha: Any, beta: Any, out_dtype: Any, acc_dtype: Any, precision: Any,
                 saturate: Any, dtype: Any) -> bool:
    """Whether every keyword but ``out``, ``backend``, ``config`` and ``autotune`` is at its
    default."""
    return (beta is None and type(alpha) is float and alpha == 1
            and out_dtype is None and acc_dtype is None and precision is None
            and saturate is False and dtype is None)


# -- models: torch.compile and autograd go through the registered operator (torch_op.py) --

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
    """The call through the registered operator (:func:`multibackend.torch_op.matmul`)."""
    from . import torch_op

    return torch_op.matmul(A, B, C, **options)


def _packed(dtype: Any) -> str | None:
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
    :func:`multibackend.packing.pack_bits` does; D is int32 (M, N).
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
    None). ``options`` starts with the op (or :data:`multibackend.plans.PLAIN`); for matmul
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


def _autotune_mode(autotune: Any, backend: str | None, op: str) -> str | None:
    """First-call autotuning's timing mode for a call (None: off). Only ``auto`` autotunes;
    with a named backend a given ``autotune`` is still checked, and then unused."""
    if backend in (None, "auto"):
        return first_call.mode_of(autotune, op)
    if autotune is not None:
        first_call.mode_of(autotune, op)
    return None


def _decide(call: Call, backend: str | None, config: Any, rerun: Any,
            mode: str | None) -> Decision:
    """The decision for the call, after timing the backends first when first-call
    autotuning (in timing mode ``mode``) asks for it."""
    explicit = _resolve_config(call.problem, backend, config)
    decision = decide(call.problem, backend, explicit, autotune=mode)
    if decision.backend is None and mode is not None and rerun is not None:
        accepted = [v.backend for v in decision.verdicts if v.accepted]
        accepted.sort(key=lambda name: name != BASELINE)
        entry = first_call.measure(call, accepted, mode, rerun, REGISTRY)
        if entry is not None:
            first_call.STORE.put(call.problem, mode, entry)
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
    front may serve its plan (:func:`multibackend.plans.hand_over_exact`)."""
    if backend not in (None, "auto"):
        REGISTRY.check_name(backend, call.problem.op)
    mode = _autotune_mode(autotune, backend, call.problem.op)
    if call.problem.trivial:
        _check_trivial(call.problem, backend, config)
        _answer_trivial(call)
        return _finish(call)
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
    return _finish(call)


def dot(x: Any, y: Any, *, backend: Any = "auto", autotune: Any = None, **options: Any) -> Any:
    """``x . y`` for 1-D vectors of one dtype (f16, bf16, f32, f64): a 0-d array in the
    accumulator's dtype (float32, or float64 for float64 inputs), made by the backend
    ``backend`` ("auto" by default). ``acc_dtype``: the accumulator; ``autotune`` as for
    :func:`matmul`. A repeated call with at most ``backend`` or ``autotune`` whose plan is a
    kernel of ours is launched by the compiled front (see :mod:`multibackend.fastcall`)."""
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


def _given(alpha: Any, saturate: Any, **others: Any) -> list[str]:
    """The names of the options given other than their defaults (alpha 1, saturate False,
    the others None)."""
    named = [name for name, value in others.items() if value is not None]
    named += ["alpha"] * (type(alpha) not in (int, float) or alpha != 1)
    return named + ["saturate"] * (saturate is not False)


def explain(A: Any, B: Any = None, C: Any = None, *, backend: str | None = "auto",
            autotune: Any = None, alpha: Any = 1.0, beta: Any = None, out: Any = None,
            out_dtype: Any = None, acc_dtype: Any = None, precision: str | None = None,
            saturate: bool = False, dtype: str | None = None, config: Any = None) -> Decision:
    """The dispatch decision :func:`matmul` (or :func:`dot`) would make for these arguments,
    which it takes alike: the chosen backend and config, the rule that decided, and every
    backend's accept/reject reason (print it, or ``.to_dict()``).

    With B None, A is taken to be a :class:`~multibackend.problem.Problem`. For a 1-D A and
    B the decision is dot's, which takes ``acc_dtype`` only. Where the call would raise
    because no backend (or not the one named) can run the problem here, the decision has no
    backend, rule "none", and that error's words."""
    if B is None and isinstance(A, Problem):
        given = _given(alpha, saturate, C=C, beta=beta, out=out, out_dtype=out_dtype,
                       acc_dtype=acc_dtype, precision=precision, dtype=dtype)
        if given:
            raise InvalidArgument(f"explain: A is a Problem, which holds every option, so "
                                  f"{', '.join(given)} cannot be given with it")
        problem = A
    elif getattr(A, "ndim", None) == 1:
        extra = _given(alpha, saturate, C=C, beta=beta, out=out, out_dtype=out_dtype,
                       precision=precision, dtype=dtype)
        if extra:
            raise InvalidArgument(f"explain: x is 1-D, so this is a dot, which takes no "
                                  f"{', '.join(extra)} (dot takes acc_dtype only)")
        problem = dot_call(A, B, acc_dtype=acc_dtype).problem
    else:
        problem = matmul_call(A, B, C, alpha=alpha, beta=beta, out=out, out_dtype=out_dtype,
                              acc_dtype=acc_dtype, precision=precision, saturate=saturate,
                              packed=_packed(dtype)).problem
    if backend not in (None, "auto"):
        REGISTRY.check_name(backend, problem.op)
    verdicts = tuple(verdict(problem, name) for name in REGISTRY.names)
    mode = _autotune_mode(autotune, backend, problem.op)
    if problem.trivial:
        try:
            _check_trivial(problem, backend, config)
        except (UnsupportedProblem, BackendUnavailable) as exc:  # the call's error
            return Decision(problem, None, None, "none", str(exc), verdicts)
        return Decision(problem, None, None, "trivial",
                        "M, N, K or the batch is 0: answered without a kernel (K = 0 gives "
                        "beta * C, zeros without C; M, N or the batch 0 an empty result)",
                        verdicts)
    explicit = _resolve_config(problem, backend, config)
    try:
        return decide(problem, backend, explicit, autotune=mode)
    except (UnsupportedProblem, BackendUnavailable) as exc:  # the call's error, as the answer
        return Decision(problem, None, None, "none", str(exc), verdicts)
