"""Networks: the ONNX graph reader and per-layer summaries (``graph``), the model zoo and its
torch definitions (``zoo``, ``torchmodels``), and the random-network generator (``generate``)."""
