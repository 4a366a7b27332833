"""The configuration space and the devices: algorithms, compressions, data types, tuning,
variants and their validation (``config``); the device registry, the detected local CPU and
its measured roofs (``devices``)."""
