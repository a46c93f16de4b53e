"""Arrays in and out: CuPy, torch, NumPy and any DLPack / ``__cuda_array_interface__`` object.

Every operand is viewed, without a copy where it already lives on the GPU, as a torch tensor
(torch is the one library that holds every dtype we serve: bf16 and fp8 included, and Triton
launches from it). NumPy operands are copied to the GPU when there is one and the result comes
back as NumPy. The result is the same kind as A: CuPy for CuPy, torch for torch, NumPy for
NumPy, and CuPy for other DLPack or CUDA-array-interface objects.

The caller's stream: for torch inputs torch's current stream, for CuPy (and other GPU
objects) CuPy's current stream. :func:`on_stream` makes it torch's current stream for the
duration of a call, so kernels, Triton launches and scratch allocations are all ordered on it,
with no device-wide synchronization.
"""
from __future__ import annotations

import contextlib
import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

from multibackend.core import dtypes
from multibackend.core.errors import InvalidArgument, InvalidType


@dataclass(frozen=True)
class Adapted:
    """One operand seen as a torch tensor, and where it came from."""

    tensor: Any
    kind: str  # "cupy", "torch", "numpy", "dlpack" or "cai"
    dtype: str


def _torch():
    import torch

    return torch


def _module_of(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def adapt(x: Any, name: str, op: str) -> Adapted:
    """View ``x`` as a torch tensor; raise naming ``name`` when it is not an array, or not
    one whose memory holds its values densely (a sparse tensor, NumPy's masked elements)."""
    tensor, kind = _as_tensor(x, name, op)
    if tensor.device.type not in ("cpu", "cuda"):
        raise InvalidArgument(f"{op}: {name} is on the {tensor.device.type} device: kernels "
                              "read arrays in host or CUDA memory (a meta tensor holds no "
                              "values)")
    if tensor.layout != _torch().strided:
        raise InvalidArgument(f"{op}: {name} is a {str(tensor.layout).replace('torch.', '')} "
                              f"tensor: kernels read dense (strided) arrays; pass "
                              f"{name}.to_dense()")
    name_of_dtype = dtypes.of_array(tensor.dtype)
    if name_of_dtype is None:
        raise InvalidArgument(f"{op}: {name} is {tuple(tensor.shape)} "
                              f"{str(tensor.dtype).replace('torch.', '')}: not a dtype "
                              f"multibackend serves (arrays hold {', '.join(dtypes.ARRAY)}; "
                              "packed bits go through pack_bits and binary_matmul, packed "
                              "int4 through pack_int4)")
    return Adapted(tensor, kind, name_of_dtype)


#: the operands whose kind is the result's (matmul's A, dot's x)
RESULT_KIND = ("A", "x")


def _as_tensor(x: Any, name: str, op: str) -> tuple[Any, str]:
    """``x`` as a torch tensor, and the kind of array it came as."""
    torch = _torch()
    if x is None:
        raise InvalidType(f"{op}: {name} is None: expected an array (CuPy, torch, NumPy, "
                          "DLPack or __cuda_array_interface__)")
    if isinstance(x, torch.Tensor):
        if x.is_neg():  # a lazily negated view: its memory holds the values' negation
            if name == "out":
                raise InvalidArgument(f"{op}: out has torch's negation bit set (a lazily "
                                      "negated view): D would be written negated; pass a "
                                      "tensor without it (out.resolve_neg())")
            return x.resolve_neg(), "torch"
        return x, "torch"
    if _module_of(x) == "cupy":
        return torch.from_dlpack(x), "cupy"
    if _module_of(x) == "numpy" and hasattr(x, "shape") and hasattr(x, "dtype"):
        return _from_numpy(x, name, op), "numpy"
    if hasattr(x, "__dlpack__") or hasattr(x, "__cuda_array_interface__"):
        if name in RESULT_KIND:  # the call's result comes back as a CuPy array
            try:
                import cupy  # noqa: F401
            except ImportError:
                raise InvalidType(f"{op}: {name} is a {type(x).__name__} (DLPack or CUDA "
                                  "array interface): the result then comes back as a CuPy "
                                  "array, and CuPy is not installed; pass a torch tensor or "
                                  "a CuPy array") from None
        if hasattr(x, "__dlpack__"):
            return torch.from_dlpack(x), "dlpack"
        return torch.as_tensor(x, device="cuda"), "cai"
    raise InvalidType(f"{op}: {name} is a {type(x).__name__}: expected an array (CuPy, "
                      "torch, NumPy, DLPack or __cuda_array_interface__)")


def _from_numpy(x: Any, name: str, op: str) -> Any:
    """A NumPy array as a torch tensor: negative strides and a byte order other than the
    machine's copied away; masked elements, and a read-only ``out``, refused."""
    import numpy as np

    if isinstance(x, np.ma.MaskedArray) and np.ma.is_masked(x):
        raise InvalidArgument(f"{op}: {name} is a masked NumPy array with masked elements: "
                              f"kernels read every element; pass {name}.filled(value)")
    arr = np.asarray(x)
    if name == "out" and not arr.flags.writeable:
        raise InvalidArgument(f"{op}: out is a read-only NumPy array: D is written into out")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if any(stride < 0 for stride in arr.strides):
        arr = np.ascontiguousarray(arr)  # torch views no negative strides
    try:
        return _torch().from_numpy(arr)
    except TypeError as exc:
        raise InvalidArgument(f"{op}: {name} is a NumPy array of dtype {arr.dtype}: "
                              f"not a dtype multibackend serves ({exc})") from None


def check_same_place(op: str, named: dict[str, Adapted]) -> None:
    """All operands on one device, and not a mix of host and GPU arrays."""
    places = {name: a.tensor.device for name, a in named.items()}
    first_name, first = next(iter(places.items()))
    for name, dev in places.items():
        if dev != first:
            kinds = {n: ("host" if d.type == "cpu" else str(d)) for n, d in places.items()}
            detail = ", ".join(f"{n} on {k}" for n, k in kinds.items())
            rule = ("host and GPU arrays are mixed" if "cpu" in {first.type, dev.type}
                    else "arrays are on different devices")
            raise InvalidArgument(f"{op}: {detail}: {rule}; move them to one device")


def _shown(item: Any) -> str:
    """A scalar as an error shows it: an integer of many digits by its first ones."""
    text = repr(item)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def scalar(value: Any, name: str, op: str, *, integer: bool) -> float | int:
    """A Python scalar from ``value`` (Python/NumPy number or 0-d array)."""
    item = value
    if hasattr(value, "shape") and hasattr(value, "item"):
        if tuple(value.shape) != ():
            raise InvalidArgument(f"{op}: {name} has shape {tuple(value.shape)}: "
                                  "it must be a scalar")
        item = value.item()
    if isinstance(item, bool) or not isinstance(item, numbers.Real):
        raise InvalidType(f"{op}: {name} is {value!r}: it must be a real scalar")
    shown = _shown(item)
    if integer and isinstance(item, numbers.Integral) and not -2**31 <= int(item) < 2**31:
        raise InvalidArgument(f"{op}: {name} is {shown} but the output is an integer type: "
                              "integer alpha and beta are int32 (-2**31..2**31-1)")
    if integer and not math.isfinite(item):
        raise InvalidArgument(f"{op}: {name} is {shown} but the output is an integer type: "
                              "integer outputs take finite integer alpha and beta")
    if integer:
        if float(item) != int(item):
            raise InvalidArgument(f"{op}: {name} is {shown} but the output is an integer "
                                  "type: integer outputs take integer alpha and beta")
        if not -2**31 <= int(item) < 2**31:
            raise InvalidArgument(f"{op}: {name} is {shown} but the output is an integer "
                                  "type: integer alpha and beta are int32 (-2**31..2**31-1)")
        return int(item)
    try:
        return float(item)
    except OverflowError:
        raise InvalidArgument(f"{op}: {name} is {shown}: beyond float64's range "
                              "(at most about 1.8e308 in magnitude)") from None


def to_kind(tensor: Any, kind: str) -> Any:
    """Return ``tensor`` as the kind the caller gave (see the module docstring)."""
    if kind == "torch":
        return tensor
    if kind == "numpy":
        return tensor.cpu().numpy()
    import cupy

    return cupy.from_dlpack(tensor)


@functools.cache
def _torch_accessors() -> tuple[Callable[[int], int], Callable[[], int]]:
    """(stream handle of device i, current device index) through the raw accessors Triton's
    launcher uses too where this torch has them: the public ones build Python objects."""
    torch = _torch()
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    raw_device = getattr(torch._C, "_cuda_getDevice", None)
    return (raw_stream or (lambda index: torch.cuda.current_stream(index).cuda_stream),
            raw_device or torch.cuda.current_device)


def _torch_stream(index: int) -> int:
    """torch's current stream handle on device ``index``."""
    return int(_torch_accessors()[0](index))


def _current_device() -> int:
    return int(_torch_accessors()[1]())


def caller_stream(kind: str, device: Any) -> int:
    """The raw CUDA stream handle the caller's work is ordered on (0 on the host): torch's
    current stream on the arrays' device, or CuPy's there for CuPy callers."""
    if device.type != "cuda":
        return 0
    if kind in ("cupy", "dlpack", "cai"):
        return int(_cupy_stream(device, lambda stream: stream.ptr))
    return _torch_stream(device.index)


def _cupy_stream(device: Any, read: Callable[[Any], Any]) -> Any:
    """``read`` of CuPy's current stream on ``device`` (CuPy keeps one per device and
    thread), with that device current: the null stream is each device's own."""
    import cupy

    with cupy.cuda.Device(device.index):
        return read(cupy.cuda.get_current_stream())


def capturing(kind: str, device: Any) -> bool:
    """Whether the caller's current stream (torch's, or CuPy's for CuPy callers) on
    ``device`` is capturing a CUDA graph."""
    if kind in ("cupy", "dlpack", "cai"):
        return bool(_cupy_stream(device, lambda stream: stream.is_capturing()))
    torch = _torch()
    with torch.cuda.device(device):
        return bool(torch.cuda.is_current_stream_capturing())


def is_current(stream: int, device: Any) -> bool:
    """Whether ``device`` is the current device and ``stream`` torch's current stream on it
    (always so on the host)."""
    if device.type != "cuda":
        return True
    return device.index == _current_device() and stream == _torch_stream(device.index)


@contextlib.contextmanager
def on_stream(stream: int, device: Any):
    """Make ``device`` the current device and ``stream`` torch's current stream on it for the
    body (nothing to do when both already are)."""
    if is_current(stream, device):
        yield
        return
    torch = _torch()
    external = torch.cuda.ExternalStream(stream, device=device)
    with torch.cuda.device(device), torch.cuda.stream(external):
        yield
