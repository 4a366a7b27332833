"""The TVM measurement backend: kernels, builders, runners, the grid collector.

Only the modules that compile or run kernels (``measure.kernels``, ``measure.worker``) import
TVM, and they run inside an isolated worker process. Everything importable from this package's
top level is pure Python.
"""

#: Bump when a kernel's code changes, so stored measurements of the old code are not reused.
KERNELS_VERSION = "k2"
