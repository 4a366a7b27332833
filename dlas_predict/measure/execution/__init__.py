"""Where and how built code runs: the isolated worker and the typed tasks it runs
(``worker``, ``tasks``), the batch runner (``runner``), boards through a TVM RPC tracker
(``remote``, its options ``rpcopts``, the farm of boards ``farm``, a loopback tracker for
tests ``loopback``) and the contention probes around each timing (``contention``)."""
