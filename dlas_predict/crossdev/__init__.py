"""Cross-device cost models: one latency model over many devices, zero-shot from a spec and few-shot from a handful of measurements."""
