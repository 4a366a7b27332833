"""Whole networks: what a build is and what its measurement records (``plans``), Relax builds
of a per-layer plan (``build``), onnxruntime runs (``ortrun``) and the batch runner
(``runner``)."""
