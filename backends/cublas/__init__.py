"""cuBLAS as torch calls it (and as CuPy callers reach it): the baseline backend."""
