"""Benchmarks against other engines (`unit-tvm bench-model`): one timing protocol, typed
engines, and their reports. Not imported by the core: the engines' packages are extras."""
