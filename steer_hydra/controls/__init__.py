"""Steering methods, one module per method, grouped by category: input, state, output and structural (controls that
change the model itself at `steer()`, e.g. `structural.LoRAAdapter`)."""
