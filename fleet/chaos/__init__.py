"""Fault tooling: process and network faults, the chaos soak and its audit.

Tests and benchmarks import it; no production path does (import-linter's `no-chaos` contract).
"""
