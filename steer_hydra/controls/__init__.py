"""Steering methods, one module per method, grouped by category (input, state, output; structural controls
subclass `core.controls.StructuralControl`, none built in yet)."""
