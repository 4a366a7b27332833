"""The measurement corpus: records of kernel and whole-network measurements (``records``,
``networks``), the SQLite store with its Parquet snapshots (``store``), the collection loop that
hands tasks to a runner and keeps what it returns (``collect``), and the TopHub importer
(``tophub``)."""
