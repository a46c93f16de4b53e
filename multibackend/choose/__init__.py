"""Choosing a backend and its config for a problem: the registry that discovers backends, the
dispatch order, tuning tables, the calibrated rule and the first-call autotune store."""
