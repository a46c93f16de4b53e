"""Names shared across the layers: the baseline backend, the environment variables the library
reads, and the least lead a measured winner must have. One leaf module, imported from
everywhere, importing nothing, so that a constant never pulls in the module that uses it."""
from __future__ import annotations

#: the baseline every measurement is set against: cuBLAS as torch calls it
BASELINE = "cublas"
#: how the baseline is named beside a figure
BASELINE_LABEL = "torch.matmul"

#: names a backend for every call that does not name one (``auto`` leaves the choice to dispatch)
ENV_BACKEND = "MULTIBACKEND_BACKEND"
#: first-call autotuning's mode: 1/eager, graph, or 0 (off)
ENV_AUTOTUNE = "MULTIBACKEND_AUTOTUNE"
#: a tuning table's path (several separated by the path separator)
ENV_TUNING = "MULTIBACKEND_TUNING"
#: "0" turns the compiled call front off
ENV_FASTCALL = "MULTIBACKEND_FASTCALL"
#: the user cache directory's override
ENV_CACHE_DIR = "MULTIBACKEND_CACHE_DIR"

#: the least relative lead over cuBLAS a measured winner must have, per timing mode, whatever
#: its measured spread: eager figures move with the host's load, graph replays much less
MIN_SPREAD = {"eager": 0.03, "graph": 0.01}
