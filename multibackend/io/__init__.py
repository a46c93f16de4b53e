"""Turning a caller's arrays and options into a :class:`~multibackend.core.problem.Problem`
and the operands a backend runs on: the array libraries' adapters and the request model."""
