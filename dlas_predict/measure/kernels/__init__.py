"""Conv kernels: a kernel's specification and epilogue math (``spec``), the dense CPU computes
and hand schedules (``cpu``), the VNNI int8 GEMM (``vnni``), the CSR kernels (``csr``), a
kernel built and its arguments (``build``), the CUDA kernels (``cuda``), CSR sparsity
(``sparse``), the knobs (``knobs``), the numpy reference (``reference``) and tuning
(``tuning``: MetaSchedule and the knob search)."""
