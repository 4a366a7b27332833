"""The cost models and how they are judged: the one interface every model follows
(``base``), kernel features (``features``), the layer, stage and tuning-time models and the
baselines (``costmodel``), the whole-network model (``netmodel``), the onnxruntime model
(``ortmodel``), the accuracy-cost model (``accuracy``), training from a corpus (``train``)
and leave-one-network-out evaluation (``evaluation``)."""
