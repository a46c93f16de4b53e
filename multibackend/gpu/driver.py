"""Cubins loaded and their kernels launched through the CUDA driver API
(``cuda.bindings.driver``), with no array library in between.

- :func:`load` loads a cubin into its device's primary context (the context torch and CuPy
  work in; retained on first use) and returns the entry point as a :class:`Function`.
- :class:`Arguments` is a kernel's parameter list in the form ``cuLaunchKernel`` reads it: a
  ctypes structure with one typed field per parameter, in the signature's order and under its
  names, and the array of the fields' addresses, passed as ``kernelParams`` by its own address
  (an int: the bindings convert nothing per call).
- :class:`Launch` is one launch prepared once: function, grid, block, dynamic shared memory and
  its :class:`Arguments`. A caller overwrites the fields that change between calls (the array
  pointers) and calls ``launch(stream)`` with the raw stream handle. A launch allocates nothing
  and never synchronizes, so it can be captured in a CUDA graph.

Each launch first checks that the device's primary context is current on the calling thread
(a thread that never touched the device has none; another device's context may be current):
otherwise the primary context is pushed for the launch and popped after it, so the thread's
current device is left as it was.

Every CUresult is checked; a failure raises naming the call, the kernel, and the CUresult's
name and description: :class:`~multibackend.core.errors.CompileError` when a cubin does not load,
:class:`~multibackend.core.errors.KernelRefused` when a kernel cannot be launched as asked,
:class:`~multibackend.core.errors.BackendUnavailable` when the driver or device cannot be used.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from multibackend.core.errors import BackendUnavailable, CompileError, KernelRefused

#: ctypes of the C parameter types kernels take
POINTER = ctypes.c_uint64
INT32 = ctypes.c_int32
INT64 = ctypes.c_int64
FLOAT64 = ctypes.c_double
#: a tensor map passed by value (``const __grid_constant__ rw::TensorMap``: 128 bytes)
TENSOR_MAP = ctypes.c_uint8 * 128
#: one kernel parameter: its name in the kernel's signature and its ctypes type
Param = tuple[str, type]

#: dynamic shared memory a kernel may use without opting in (cuFuncSetAttribute)
DEFAULT_DYNAMIC_SMEM = 48 * 1024

_lock = threading.Lock()
_contexts: dict[int, int] = {}  # device ordinal -> handle of its primary context (retained)


def bindings() -> Any:
    """The ``cuda.bindings.driver`` module (pip ``cuda-bindings``)."""
    from cuda.bindings import driver

    return driver


def describe(result: Any) -> str:
    """A CUresult's name and the driver's description of it."""
    drv = bindings()
    try:
        code = drv.CUresult(int(result))
    except ValueError:  # a code newer than these bindings
        return f"CUresult {int(result)}"
    err, text = drv.cuGetErrorString(code)
    detail = text.decode(errors="replace") if not err and text else "no description"
    return f"{code.name} ({detail})"


def check(result: tuple, what: str, error: type[Exception] = KernelRefused) -> Any:
    """The value a driver call returned beside its CUresult (None when there is none); raises
    ``error`` naming ``what`` and the CUresult when the call failed."""
    if result[0]:
        raise error(f"{what} failed: {describe(result[0])}")
    return result[1] if len(result) > 1 else None


def primary_context(device: int) -> int:
    """The handle of ``device``'s primary context, retained (created if no one has yet) on
    first use and kept for the process's life."""
    context = _contexts.get(device)
    if context is None:
        drv = bindings()
        with _lock:
            context = _contexts.get(device)
            if context is None:
                check(drv.cuInit(0), "cuInit", BackendUnavailable)
                handle = check(drv.cuDeviceGet(device), f"cuDeviceGet({device})",
                               BackendUnavailable)
                context = int(check(drv.cuDevicePrimaryCtxRetain(handle),
                                    f"cuDevicePrimaryCtxRetain(device {device})",
                                    BackendUnavailable))
                _contexts[device] = context
    return context


@contextlib.contextmanager
def current(device: int) -> Iterator[None]:
    """``device``'s primary context current on this thread inside the block: pushed, then
    popped, unless it already is."""
    drv = bindings()
    context = primary_context(device)
    if int(check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")) == context:
        yield
        return
    check(drv.cuCtxPushCurrent(context), f"cuCtxPushCurrent(primary context of device {device})")
    try:
        yield
    finally:
        check(drv.cuCtxPopCurrent(), f"cuCtxPopCurrent(primary context of device {device})")


@dataclass(frozen=True)
class Function:
    """One loaded kernel entry point: its name, device, primary context and handle, and the
    module holding it (never unloaded)."""

    name: str
    device: int
    context: int
    handle: Any
    module: Any


def load(cubin: bytes, name: str, device: int, dynamic_smem: int = 0) -> Function:
    """Load ``cubin`` into ``device``'s primary context and return its entry point ``name``.
    A ``dynamic_smem`` above :data:`DEFAULT_DYNAMIC_SMEM` opts the function in to that much
    dynamic shared memory."""
    drv = bindings()
    with current(device):
        module = check(drv.cuModuleLoadData(cubin),
                       f"cuModuleLoadData of the cubin holding {name} ({len(cubin)} bytes) on "
                       f"device {device}", CompileError)
        handle = check(drv.cuModuleGetFunction(module, name.encode()),
                       f"cuModuleGetFunction({name}) on device {device}", CompileError)
        if dynamic_smem > DEFAULT_DYNAMIC_SMEM:
            attribute = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(drv.cuFuncSetAttribute(handle, attribute, dynamic_smem),
                  f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = {dynamic_smem}) of {name} "
                  f"on device {device}")
    return Function(name, device, primary_context(device), handle, module)


@functools.lru_cache(maxsize=None)
def _structure(params: tuple[Param, ...]) -> type[ctypes.Structure]:
    """The ctypes structure holding one field per parameter, in order."""
    return type("KernelArguments", (ctypes.Structure,), {"_fields_": list(params)})


class Arguments:
    """A kernel's parameter values as ``cuLaunchKernel`` reads them.

    ``values`` is a ctypes structure with one field per parameter of ``params`` (in the
    kernel's order, under its names; set a field to change that argument of later launches),
    ``pointers`` the array of the fields' addresses (``kernelParams``) and ``address`` the
    address of that array.
    """

    def __init__(self, kernel: str, params: Sequence[Param],
                 values: Mapping[str, int | float | bytes]):
        names = [name for name, _ in params]
        missing, unknown = set(names) - set(values), set(values) - set(names)
        if missing or unknown:
            raise ValueError(f"arguments of {kernel}: {sorted(missing)} missing and "
                             f"{sorted(unknown)} unknown: the kernel takes {', '.join(names)}")
        fields = {}
        for name, ctype in params:
            value = values[name]
            if ctype is TENSOR_MAP:
                if not isinstance(value, bytes) or len(value) != ctypes.sizeof(ctype):
                    raise ValueError(f"argument {name} of {kernel} must be the "
                                     f"{ctypes.sizeof(ctype)} bytes of a tensor map")
                value = ctype.from_buffer_copy(value)
            elif ctype is not FLOAT64 and ctype(value).value != value:
                raise OverflowError(f"argument {name} of {kernel} is {value}: out of the range "
                                    f"of its C type ({ctype.__name__})")
            fields[name] = value
        layout = _structure(tuple(params))
        self.params = tuple(params)
        self.values = layout(**fields)
        base = ctypes.addressof(self.values)
        self.pointers = (ctypes.c_void_p * len(names))(
            *(base + getattr(layout, name).offset for name in names))
        self.address = ctypes.addressof(self.pointers)

    def field_address(self, name: str) -> int:
        """The address of parameter ``name``'s value in the buffer."""
        return ctypes.addressof(self.values) + getattr(type(self.values), name).offset


class Launch:
    """One launch of ``function`` prepared once: grid, block, dynamic shared memory and its
    :class:`Arguments`. ``launch(stream)`` launches it on the raw stream handle ``stream``
    with the argument fields as they are then (``launch`` holds its Launch, and with it the
    buffer ``kernelParams`` points into); raises :class:`KernelRefused` when the driver
    refuses the launch."""

    def __init__(self, function: Function, grid: tuple[int, int, int],
                 block: tuple[int, int, int], dynamic_smem: int, args: Arguments):
        self.function = function
        self.grid = grid
        self.block = block
        self.dynamic_smem = dynamic_smem
        self.args = args
        self.launch = self._launcher()

    def _launcher(self) -> Callable[[int], None]:
        drv = bindings()
        launch_kernel, get_current = drv.cuLaunchKernel, drv.cuCtxGetCurrent
        handle, context, params = self.function.handle, self.function.context, self.args.address
        (gx, gy, gz), (bx, by, bz), smem = self.grid, self.block, self.dynamic_smem

        def launch(stream: int) -> None:
            err, ctx = get_current()
            if err or int(ctx) != context:
                with current(self.function.device):
                    err, = launch_kernel(handle, gx, gy, gz, bx, by, bz, smem, stream, params, 0)
            else:
                err, = launch_kernel(handle, gx, gy, gz, bx, by, bz, smem, stream, params, 0)
            if err:
                raise KernelRefused(f"{self._what(stream)} failed: {describe(err)}")

        return launch

    def _what(self, stream: int) -> str:
        return (f"cuLaunchKernel of {self.function.name} (grid {self.grid}, block {self.block}, "
                f"{self.dynamic_smem} bytes of dynamic shared memory, stream {stream:#x}) on "
                f"device {self.function.device}")
