"""Scaffolding for tests and benchmarks: the fault-injecting loopback server (`loopback_server`), float comparisons
with tolerances derived from the arithmetic (`numerics`) and one Inspect eval on a provider model (`evals`); nothing
in the library imports it."""
