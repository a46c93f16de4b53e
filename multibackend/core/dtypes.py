"""The element types multibackend knows, by one canonical name each.

Every layer (request model, capability rules, reference, tolerances, kernels) speaks of dtypes
by these names, so that "float16" means the same thing whether it came from a CuPy array, a
torch tensor or a NumPy array. Sub-byte types ("int4", "uint4", "bit") only exist packed into
bytes; their helpers live in :mod:`multibackend.core.packing`.
"""
from __future__ import annotations

from dataclasses import dataclass

from multibackend.core.errors import InvalidArgument


@dataclass(frozen=True)
class DType:
    """One element type: its canonical name, storage size and arithmetic family."""

    name: str
    bits: int
    kind: str  # "float", "int", "uint" or "bit"
    torch_name: str | None  # attribute of the torch module holding it, None for sub-byte

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint", "bit")

    @property
    def itemsize(self) -> float:
        return self.bits / 8


_ALL = [
    DType("float64", 64, "float", "float64"),
    DType("float32", 32, "float", "float32"),
    DType("float16", 16, "float", "float16"),
    DType("bfloat16", 16, "float", "bfloat16"),
    DType("float8_e4m3fn", 8, "float", "float8_e4m3fn"),
    DType("float8_e5m2", 8, "float", "float8_e5m2"),
    DType("int32", 32, "int", "int32"),
    DType("int8", 8, "int", "int8"),
    DType("uint8", 8, "uint", "uint8"),
    DType("int4", 4, "int", None),
    DType("uint4", 4, "uint", None),
    DType("bit", 1, "bit", None),
]
DTYPES: dict[str, DType] = {d.name: d for d in _ALL}

_ALIASES = {
    "f64": "float64", "double": "float64",
    "f32": "float32", "float": "float32",
    "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
    "s32": "int32", "s8": "int8", "u8": "uint8", "s4": "int4", "u4": "uint4",
    "b1": "bit", "bool": "bit",
}


def _bare_name(dtype: object) -> str:
    """A dtype's name as its library prints it, without the wrapping (``torch.float16``,
    ``dtype('float16')``, ``<class 'numpy.float16'>``), lower-cased."""
    text = str(dtype)
    for prefix, suffix in (("torch.", ""), ("dtype('", "')"), ("<class 'numpy.", "'>")):
        if text.startswith(prefix) and text.endswith(suffix):
            return text[len(prefix):len(text) - len(suffix)].lower()
    return text.lower()


def canonical(dtype: object, *, what: str = "dtype") -> str:
    """The canonical name of ``dtype`` (a name, alias, torch/NumPy/CuPy dtype or DType).

    Raises :class:`~multibackend.core.errors.InvalidArgument` (a ``ValueError``) naming ``what``
    when the type is not one multibackend knows.
    """
    if isinstance(dtype, DType):
        return dtype.name
    text = _bare_name(dtype)
    text = _ALIASES.get(text, text)
    if text not in DTYPES:
        known = ", ".join(DTYPES)
        raise InvalidArgument(f"{what} is {dtype!r}: not a dtype multibackend knows ({known})")
    return text


#: the dtypes an array may hold (sub-byte types only exist packed into uint8 arrays; a bool
#: array is not a packed operand)
ARRAY = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
         "int32", "int8", "uint8")


def of_array(dtype: object) -> str | None:
    """The canonical name of an array's element type (torch's, NumPy's or CuPy's), or None
    when multibackend serves no array of that type."""
    text = _bare_name(dtype)
    return text if text in ARRAY else None


def get(name: str) -> DType:
    """The :class:`DType` record for a canonical name or alias."""
    return DTYPES[canonical(name)]


def torch_dtype(name: str):
    """The torch dtype for a canonical name (sub-byte types have none and raise)."""
    import torch

    record = get(name)
    if record.torch_name is None:
        raise ValueError(f"dtype {name!r} is packed sub-byte data; it has no torch dtype "
                         "of its own")
    return getattr(torch, record.torch_name)


def default_accumulator(name: str) -> str:
    """The accumulator a matmul of ``name`` operands uses unless the caller asks otherwise."""
    record = get(name)
    if record.name == "float64":
        return "float64"
    if record.is_float:
        return "float32"
    return "int32"


def default_output(a: str, b: str) -> str:
    """The output dtype of ``A @ B``: the inputs' dtype for floats, int32 for integers, and
    float32 for fp8 (fp8 results lose too much to be the default)."""
    if a != b:
        return default_accumulator(a) if get(a).is_integer == get(b).is_integer else "float32"
    record = get(a)
    if record.is_integer:
        return "int32"
    if record.bits == 8:
        return "float32"
    return a
