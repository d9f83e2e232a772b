"""Structural controls: replace the model at steer() (merged weights, adapters). None built in yet."""
