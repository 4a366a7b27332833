"""The cost models and how they are judged: kernel features (``features``), the layer,
stage and tuning-time models and the baselines (``costmodel``), the whole-network model
(``netmodel``), training from a corpus (``train``) and leave-one-network-out evaluation
(``evaluation``)."""
