"""The TVM measurement backend, installed as ``dlas_predict.measure``: kernels and their
knobs, the numpy reference, the isolated worker and the typed tasks it runs, the runners
(batch in, batch out), whole-network builds, tuning, the roofs' kernels, the CUDA kernels
with their bundles and GPU runner, and measuring on boards through a TVM RPC tracker (where
built code runs, ``remote``; the farm of boards, ``farm``; its options, ``rpcopts``; a
tracker and servers on loopback for tests and benchmarks, ``loopback``).

It depends on the library (``dlas_predict``) one way: the library imports it only inside the
functions that measure. Only the modules that compile or run kernels (``kernels``,
``netbuild``, ``tuning``, ``worker``'s task code) import TVM, and they run inside the isolated
worker process. Everything importable from this package's top level is pure Python.
"""

#: Bump when a kernel's code changes, so stored measurements of the old code are not reused.
KERNELS_VERSION = "k4"
