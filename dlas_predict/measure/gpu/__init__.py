"""CUDA GPUs reached by bundles: kernels and networks built here (``bundle``, ``networks``,
``metaschedule``), the roofs' kernels (``peaks``) and the runner that measures a bundle on the
GPU machine (``run``: ``python -m dlas_predict.measure.gpu.run``), which needs only TVM's
runtime, numpy and the driver there."""
