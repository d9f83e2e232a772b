"""Scaffolding for tests and benchmarks (fault-injecting servers); nothing in the library imports it."""
