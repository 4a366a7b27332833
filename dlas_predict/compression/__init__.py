"""Compression and what it costs in accuracy: pruning and quantising ONNX and torch networks
(``compress``), the per-layer plans of a compressed network (``netplan``), the accuracy
measurement and the shipped accuracy curves (``accuracy``, ``digits``, ``training``)."""
