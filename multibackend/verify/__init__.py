"""Checking results and measuring candidates: the float64 reference and its bounds, poisoned
outputs, the cross-check of every backend, and the one routine that times candidates."""
