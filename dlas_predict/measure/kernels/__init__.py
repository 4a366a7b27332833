"""Conv kernels: the CPU schedules (``cpu``), the CUDA ones (``cuda``), CSR sparsity
(``sparse``), their knobs (``knobs``), the numpy reference (``reference``) and tuning
(``tuning``: MetaSchedule and the knob search)."""
