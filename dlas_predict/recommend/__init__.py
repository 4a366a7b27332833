"""Recommend: rank the configuration space for a network on a device from the cost models
and accuracy curves, and (with a runner) validate the top candidates by building and timing
them (``search``)."""
