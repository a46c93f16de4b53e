"""Host overhead of ``backend="auto"`` on a 64^3 float16 matmul, beyond the kernel's own time.

``per_call_us`` is the steady-state time per ``mb.matmul(a, b, out=d)`` call in a loop
(:func:`multibackend.gpu.timing.host_calls_per_second`, the device synchronized at the end);
``kernel_us`` the kernel's GPU time by CUDA events; ``overhead_us`` their difference (0 when
the loop is GPU-bound). ``direct_call_us`` is the chosen backend's ``run`` called directly,
so ``dispatch_us`` is what the front end and dispatch add to it.
"""
import torch

import multibackend as mb
from multibackend.choose.registry import REGISTRY
from multibackend.gpu.timing import host_calls_per_second, time_gpu
from multibackend.io.request import matmul_call

SIZE = 64


def test_auto_host_overhead_64(benchmark):
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.rand((SIZE, SIZE), generator=gen, device="cuda") * 2 - 1).half()
    b = (torch.rand((SIZE, SIZE), generator=gen, device="cuda") * 2 - 1).half()
    d = torch.empty((SIZE, SIZE), dtype=torch.float16, device="cuda")

    def auto() -> None:
        mb.matmul(a, b, out=d)

    decision = mb.explain(a, b)
    call = matmul_call(a, b, out=d)
    backend = REGISTRY.get(decision.backend)
    backend.prepare(call.problem, decision.config)

    def direct() -> None:
        backend.run(call.problem, call.operands, decision.config)

    kernel_us = time_gpu(auto, flush_l2=False).median_ms * 1e3
    per_call_us = 1e6 / host_calls_per_second(auto, sync=torch.cuda.synchronize)
    direct_us = 1e6 / host_calls_per_second(direct, sync=torch.cuda.synchronize)
    benchmark.group = f"host overhead {SIZE}x{SIZE}x{SIZE} float16"
    benchmark.extra_info.update({
        "member": "auto", "backend": decision.backend, "config": str(decision.config),
        "rule": decision.rule, "dtype": "float16", "shape": f"{SIZE}x{SIZE}x{SIZE}",
        "per_call_us": per_call_us, "kernel_us": kernel_us,
        "overhead_us": max(0.0, per_call_us - kernel_us), "direct_call_us": direct_us,
        "dispatch_us": per_call_us - direct_us, "device": torch.cuda.get_device_name(),
    })
    benchmark.pedantic(auto, setup=torch.cuda.synchronize, rounds=2000, iterations=1,
                       warmup_rounds=10)
