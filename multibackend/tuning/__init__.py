"""Tuning for a deployment: suites of shapes, the tuner, its worker processes and the cluster
that spreads them over GPUs and machines."""
