"""Whole networks: what a build is and what its measurement records (``plans``), the ONNX
model imported into Relax (``importer``), the ops fused into each conv's epilogue
(``epilogues``), the generic schedule of the other ops (``schedules``), Relax builds of a
per-layer plan (``build``), onnxruntime runs (``ortrun``) and the batch runner (``runner``)."""
