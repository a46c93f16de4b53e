"""pytest-benchmark suites: square, llm, odd, skinny and batched shapes (see
:mod:`multibackend.tuning.suites`), each backend, cuBLAS and auto in one group per shape."""
from bench_cases import measure


def test_matmul(benchmark, case):
    measure(benchmark, case)
