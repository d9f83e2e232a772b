"""Steering methods, one module per method, grouped by category (input, state, output, structural)."""
