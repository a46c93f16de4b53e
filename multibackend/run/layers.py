"""Plans of ``torch.nn.Linear`` layers served through matmul: the family plan of a layer's
product (x's rows @ weight.mT + bias) looked up from the layer's own input, and each layer's
memo of the plan that served its last call, so a repeated layer call costs what torch's own
does (:mod:`multibackend.nn`)."""
from __future__ import annotations

from typing import Any

from multibackend.run import plans

#: the first entry of a linear layer's family key (:func:`linear`)
LINEAR = "linear"


def _linear_key(backend: Any, x: Any, bias: Any) -> tuple:
    """A linear layer's family key: what its product's key (:func:`plans.torch_key`) holds that the
    layer's input and bias fix (the product is 2-D whatever x's rank; the weight's dtype
    and device are x's, or torch's layer refuses the call), the watched environment and
    tables."""
    get = plans.ENVIRON.get
    return (LINEAR, backend, x.dtype, x.get_device(), None if bias is None else bias.dtype,
            get(plans.BACKEND_KEY), get(plans.TUNING_KEY), get(plans.AUTOTUNE_KEY), plans.GENERATION[0])


def linear(x: Any, weight: Any, bias: Any, backend: Any) -> bool:
    """Whether the family plan of a linear layer's product (x's rows @ weight.mT + bias
    broadcast over the rows, :func:`remember_linear`) holds for these sizes: then dispatch
    runs that product on cuBLAS, and ``torch.nn.functional.linear`` makes the layer's
    result, views and all, in one call (which refuses what matmul would: the caller then
    takes matmul's path, which words the error). The hot path of
    :func:`multibackend.nn.linear`."""
    return _linear_family(x, weight, bias, backend) is not None


def _linear_family(x: Any, weight: Any, bias: Any, backend: Any) -> tuple | None:
    """The family plan :func:`linear` asks about, where it holds for these sizes."""
    try:
        found = plans.FAMILIES.get(_linear_key(backend, x, bias))
        if found is None:
            return None
        elements = x.numel()
        if (elements < found[1] or weight.numel() < found[2]
                or elements // x.shape[-1] < found[3] or weight.shape[0] < found[4]
                or weight.shape[1] < found[5]):
            return found
    except (RuntimeError, ValueError, TypeError, AttributeError, IndexError,
            ZeroDivisionError):
        pass
    return None


def _stale() -> None:
    """What a copied or unpickled :class:`LayerPlan` becomes: none (the copy plans afresh)."""
    return None


class LayerPlan:
    """One layer's memo of the family plan that served its last call (:func:`layer_plan`):
    the objects that call was served under — x's dtype and device, the weight and bias themselves,
    the backend name, the watched environment's values, the tables' generation and how many times
    :func:`forget` ran — compared by identity on the next call (:meth:`holds`), and the plan's
    bounds on x's size (its bounds on the weight's decided once). Cheaper than the family key's
    lookup, which builds and hashes a tuple on every call; a layer inside a model pays
    that in cache misses between its calls."""

    __slots__ = ("dtype", "device", "weight", "bias", "backend", "environment", "generation",
                 "forgotten", "weight_within", "elements", "rows")

    def __init__(self, x: Any, weight: Any, bias: Any, backend: Any, found: tuple) -> None:
        get = plans.ENVIRON.get
        self.dtype, self.device = x.dtype, x.get_device()
        self.weight, self.bias, self.backend = weight, bias, backend
        self.environment = (get(plans.BACKEND_KEY), get(plans.TUNING_KEY), get(plans.AUTOTUNE_KEY))
        self.generation, self.forgotten = plans.GENERATION[0], plans.FORGOTTEN[0]
        self.weight_within = (weight.numel() < found[2] or weight.shape[0] < found[4]
                              or weight.shape[1] < found[5])
        self.elements, self.rows = found[1], found[3]

    def holds(self, x: Any, weight: Any, bias: Any, backend: Any) -> bool:
        """Whether this call is served as the one the memo was made for: the same objects
        (a changed environment variable is a new value object), and x within the bounds."""
        get = plans.ENVIRON.get
        environment = self.environment
        try:
            if not (x.dtype is self.dtype and weight is self.weight and bias is self.bias
                    and backend is self.backend and get(plans.BACKEND_KEY) is environment[0]
                    and get(plans.TUNING_KEY) is environment[1]
                    and get(plans.AUTOTUNE_KEY) is environment[2]
                    and plans.GENERATION[0] == self.generation
                    and plans.FORGOTTEN[0] == self.forgotten and x.get_device() == self.device):
                return False
            if self.weight_within:
                return True
            elements = x.numel()
            return elements < self.elements or elements // x.shape[-1] < self.rows
        except (RuntimeError, TypeError, AttributeError, IndexError, ZeroDivisionError):
            return False

    def __reduce__(self) -> tuple:
        return _stale, ()

    def __deepcopy__(self, memo: dict) -> None:
        return None


def layer_plan(x: Any, weight: Any, bias: Any, backend: Any) -> LayerPlan | None:
    """A layer's memo (:class:`LayerPlan`) where the family plan of its product holds for
    this call (:func:`linear`), else None."""
    found = _linear_family(x, weight, bias, backend)
    if found is None or not isinstance(plans.ENVIRON, dict):
        return None
    try:
        return LayerPlan(x, weight, bias, backend, found)
    except (RuntimeError, TypeError, AttributeError, IndexError):
        return None


def remember_linear(x: Any, weight: Any, bias: Any, backend: Any, rows: Any, c: Any) -> None:
    """After a linear layer's product ran through ``matmul(rows, weight.mT, c)``: where that
    made a family plan (for a device tensor x, with a weight of x's dtype and, if any, a
    bias vector), :func:`linear` serves the layer's later calls by it."""
    found = plans.FAMILIES.get(plans.torch_key(backend, rows, weight, c))  # weight: weight.mT's key
    if found is not None and weight.dtype == x.dtype and (bias is None or bias.ndim == 1):
        plans.remember_family(_linear_key(backend, x, bias), found[0], found[1:])
