"""Overhead benchmarks of sglang-mmtrace (see README.md): the plugin's own cost as a first-class number.

- ``python -m benchmarks.hotpath``: per-request / per-decode-step hook cost, wrapped vs unwrapped.
- ``python -m benchmarks.ttft_ab``: server TTFT with the plugin off vs on, interleaved A/B.
"""
