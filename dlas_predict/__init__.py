"""dlas-predict: predict the fastest accurate way to deploy a DNN (DLAS configuration space).

Subpackages, one per role: ``space`` (configuration space, devices), ``networks`` (graphs,
zoo, generator), ``compression`` (pruning, quantisation, accuracy), ``corpus`` (records,
store, collection), ``models`` (features, cost models, training, evaluation), ``recommend``,
``analysis`` (frames, plots, report), and ``measure``, the TVM backend (kernels, builders,
runners, tuning), which depends on the library and is imported by it only inside functions.
``paths`` says where shipped data and state live. The library imports without TVM, torch or
LightGBM; those are imported only by the modules that need them.
"""

__version__ = "0.1.0"
