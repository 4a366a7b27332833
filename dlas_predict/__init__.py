"""dlas-predict: predict the fastest accurate way to deploy a DNN (DLAS configuration space).

The library is importable without TVM, torch or LightGBM; those are imported only by the
modules that need them (``measure`` for TVM).
"""

__version__ = "0.1.0"
