"""Strategies that organise the loops around a tensorized core (cpu, gpu)."""
