"""The corpus store: SQLite in WAL mode, one row per measurement, every run time kept.

Each record is committed in its own transaction as soon as it is measured, so a collection
killed at any moment (SIGKILL included) loses nothing it had committed and leaves no
half-written row; the unique measurement key makes a re-run skip what is already there.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from dlas_predict.errors import StoreError
from dlas_predict.files import replace_if_changed, scratch_path
from dlas_predict.measure.records import MeasureResult, board_emulated, slowness
from dlas_predict.space.choices import ExportFormat

if TYPE_CHECKING:
    from dlas_predict.measure.networks.plans import NetworkMeasurement
    from dlas_predict.space.config import ConvSpec

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    device TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    conv TEXT NOT NULL,
    conv_json TEXT NOT NULL,
    C INTEGER, H INTEGER, W INTEGER, K INTEGER, R INTEGER, S INTEGER,
    stride_h INTEGER, stride_w INTEGER, pad_t INTEGER, pad_l INTEGER, pad_b INTEGER,
    pad_r INTEGER, groups INTEGER, dilation_h INTEGER, dilation_w INTEGER,
    OH INTEGER, OW INTEGER, macs INTEGER,
    dtype TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    compression TEXT NOT NULL,
    ratio REAL NOT NULL,
    sparse INTEGER NOT NULL,
    pattern TEXT NOT NULL,
    sparsity REAL,
    nnz INTEGER,
    tuning TEXT NOT NULL,
    knobs TEXT NOT NULL,
    run_secs TEXT NOT NULL,
    n_runs INTEGER NOT NULL,
    number INTEGER,
    median_s REAL,
    spread REAL,
    noisy INTEGER,
    gflops REAL,
    compile_s REAL,
    tuning_seconds REAL,
    trials INTEGER,
    tuner TEXT,
    verified INTEGER,
    max_error REAL,
    error TEXT,
    threads INTEGER,
    tvm_version TEXT,
    kernels_version TEXT,
    timestamp REAL,
    contention REAL,
    slowdown REAL,
    board TEXT
);
CREATE INDEX IF NOT EXISTS idx_meas_device ON measurements(device, fingerprint);
CREATE TABLE IF NOT EXISTS network_layers (
    network TEXT NOT NULL,
    layer_index INTEGER NOT NULL,
    layer_name TEXT NOT NULL,
    conv TEXT NOT NULL,
    PRIMARY KEY (network, layer_index)
);
CREATE TABLE IF NOT EXISTS network_configs (
    network TEXT NOT NULL,
    config TEXT NOT NULL,
    layer_index INTEGER NOT NULL,
    layer_name TEXT NOT NULL,
    conv TEXT NOT NULL,
    compression TEXT NOT NULL,
    ratio REAL NOT NULL,
    PRIMARY KEY (network, config, layer_index)
);
CREATE TABLE IF NOT EXISTS network_measurements (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    device TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    network TEXT NOT NULL,
    config TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    plan TEXT NOT NULL,
    dtype TEXT NOT NULL,
    run_secs TEXT NOT NULL,
    median_s REAL,
    spread REAL,
    compile_s REAL,
    verified INTEGER,
    max_error REAL,
    top1_agreement REAL,
    error TEXT,
    kernels_version TEXT,
    timestamp REAL,
    summary TEXT,
    contention REAL,
    slowdown REAL,
    board TEXT,
    details TEXT
);
"""

#: Columns of a whole-network measurement row (id excluded).
NETWORK_COLUMNS = (
    "key", "device", "fingerprint", "network", "config", "algorithm", "plan", "dtype",
    "run_secs", "median_s", "spread", "compile_s", "verified", "max_error", "top1_agreement",
    "error", "kernels_version", "timestamp", "summary", "contention", "slowdown", "board",
    "details",
)

#: Columns of a measurement row, in insert order (id excluded).
COLUMNS = (
    "key", "device", "fingerprint", "conv", "conv_json", "C", "H", "W", "K", "R", "S",
    "stride_h", "stride_w", "pad_t", "pad_l", "pad_b", "pad_r", "groups", "dilation_h",
    "dilation_w", "OH", "OW", "macs", "dtype", "algorithm", "compression", "ratio", "sparse",
    "pattern", "sparsity", "nnz", "tuning", "knobs", "run_secs", "n_runs", "number",
    "median_s", "spread", "noisy", "gflops", "compile_s", "tuning_seconds", "trials", "tuner",
    "verified", "max_error", "error", "threads", "tvm_version", "kernels_version", "timestamp",
    "contention", "slowdown", "board",
)

#: Columns added after the first stores were written: (table, column, type), migrated in place.
_ADDED_COLUMNS = (("network_measurements", "summary", "TEXT"),
                  ("measurements", "trials", "INTEGER"), ("measurements", "tuner", "TEXT"),
                  ("measurements", "contention", "REAL"),
                  ("network_measurements", "contention", "REAL"),
                  ("measurements", "slowdown", "REAL"),
                  ("network_measurements", "slowdown", "REAL"),
                  ("measurements", "board", "TEXT"),
                  ("network_measurements", "board", "TEXT"),
                  ("network_measurements", "details", "TEXT"))


def networks_path(path: str | Path, part: str = "networks") -> Path:
    """A companion file of an exported snapshot: ``corpus.parquet`` → ``corpus.networks.parquet``
    (the networks' configurations) or, with ``part="wholenet"``, ``corpus.wholenet.parquet``
    (whole-network latencies)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{part}{path.suffix}")


@functools.lru_cache(maxsize=16384)
def _conv_texts(spec: ConvSpec) -> tuple[str, str]:
    """A workload's two text columns (thousands of rows share a few workloads)."""
    return spec.to_spec(), json.dumps(spec.to_dict(), sort_keys=True)


def _row(result: MeasureResult, run_secs: str | None = None) -> tuple:
    """A record as the measurements table's columns; ``run_secs``: the JSON of its runs where
    the caller holds it already (a snapshot's row, read back into the record)."""
    spec, v = result.conv, result.variant
    conv, conv_json = _conv_texts(spec)
    values = {
        "key": result.key, "device": result.device, "fingerprint": result.fingerprint,
        "conv": conv, "conv_json": conv_json,
        **{name: getattr(spec, name) for name in (
            "C", "H", "W", "K", "R", "S", "stride_h", "stride_w", "pad_t", "pad_l", "pad_b",
            "pad_r", "groups", "dilation_h", "dilation_w")},
        "OH": spec.OH, "OW": spec.OW, "macs": spec.macs, "dtype": v.dtype.value,
        "algorithm": v.algorithm.value, "compression": v.compression.value, "ratio": v.ratio,
        "sparse": int(v.sparse), "pattern": v.pattern.value, "sparsity": result.sparsity,
        "nnz": result.nnz, "tuning": v.tuning.value,
        "knobs": json.dumps(dict(sorted(result.knobs.items()))),
        "run_secs": run_secs or json.dumps(list(result.run_secs)),
        "n_runs": len(result.run_secs),
        "number": result.number, "median_s": result.median_s, "spread": result.spread,
        "noisy": int(result.noisy), "gflops": result.gflops, "compile_s": result.compile_s,
        "tuning_seconds": result.tuning_seconds, "trials": result.trials, "tuner": result.tuner,
        "verified": None if result.verified is None else int(result.verified),
        "max_error": result.max_error, "error": result.error, "threads": result.threads,
        "tvm_version": result.tvm_version, "kernels_version": result.kernels_version,
        "timestamp": result.timestamp, "contention": result.contention,
        "slowdown": result.slowdown, "board": result.board,
    }
    return tuple(values[c] for c in COLUMNS)


def kernel_config(r: dict[str, Any]) -> tuple:
    """A kernel row's configuration, whatever kernel code timed it: (device, machine,
    workload, algorithm, compression, ratio, tuning)."""
    return (r["device"], r["fingerprint"], r["conv"], r["algorithm"], r["compression"],
            float(r["ratio"] or 0.0), r["tuning"])


def drop_older_kernels(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kernel rows (in insertion order) less those whose configuration
    (:func:`kernel_config`) has a later row of another ``kernels_version``: a kernel whose
    code changed is measured again under a new version, and its old timings are no longer
    what it runs."""
    latest = {kernel_config(r): r["kernels_version"] or "" for r in rows}
    return [r for r in rows if (r["kernels_version"] or "") == latest[kernel_config(r)]]


_CONFIG_SQL = "INSERT OR REPLACE INTO network_configs VALUES (?, ?, ?, ?, ?, ?, ?)"
#: A kernel record (:func:`_row`), kept if its key is new.
_INSERT_SQL = (f"INSERT OR IGNORE INTO measurements ({','.join(COLUMNS)}) "
               f"VALUES ({','.join('?' * len(COLUMNS))})")


def _refuse_emulated(board: str | None) -> None:
    """Timings on an emulated board are not a device's: the corpus never holds them."""
    if board_emulated(board):
        raise StoreError("a timing on an emulated board cannot go into a corpus")


@dataclass(frozen=True)
class StoreStats:
    """A store's counts: kernel records, failed ones, duplicate keys, unverified and noisy
    ones, distinct workloads, networks, successful whole-network measurements, and the
    records per device, algorithm, compression and tuning."""

    store: str
    records: int
    failures: int
    duplicates: int
    unverified: int
    noisy: int
    workloads: int
    networks: int
    network_measurements: int
    devices: dict[str, int]
    algorithms: dict[str, int]
    compressions: dict[str, int]
    tunings: dict[str, int]


class CorpusStore:
    """A measurement corpus in one SQLite file.

    Parameters
    ----------
    path : path of the SQLite file; created (with parents) unless ``must_exist``.
    must_exist : raise :class:`StoreError` instead of creating a new store.
    scratch : a store written whole and then renamed into place (a cache): no journal, no
        waiting for the disk; a store that is interrupted is thrown away, never read.
    """

    def __init__(self, path: str | Path, must_exist: bool = False, scratch: bool = False
                 ) -> None:
        self.path = Path(path)
        if must_exist and not self.path.is_file():
            raise StoreError(f"no corpus store at {self.path}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA journal_mode={'OFF' if scratch else 'WAL'}")
            self._db.execute(f"PRAGMA synchronous={'OFF' if scratch else 'FULL'}")
            self._db.executescript(_SCHEMA)
            for table, column, kind in _ADDED_COLUMNS:  # stores written before the column
                cols = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in cols:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                             (str(SCHEMA_VERSION),))
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open corpus store {self.path}: {exc}") from None

    # ---- writing ------------------------------------------------------------------------
    def add(self, result: MeasureResult, replace_failure: bool = True,
            replace: bool = False) -> bool:
        """Commit one record; returns False if its key was already stored.

        With ``replace_failure`` a stored failure of the same key is replaced by the new
        record (a retried measurement); a stored success is replaced only with ``replace``
        (a record timed again on a quieter machine; see :meth:`slow_keys`).
        """
        with self._db:  # one transaction: the row is there entirely or not at all
            return self._insert(result, replace_failure, replace)

    def _insert(self, result: MeasureResult, replace_failure: bool, replace: bool) -> bool:
        _refuse_emulated(result.board)
        if replace or replace_failure:
            self._db.execute("DELETE FROM measurements WHERE key = ?"
                             + ("" if replace else " AND error IS NOT NULL"), (result.key,))
        cur = self._db.execute(_INSERT_SQL, _row(result))
        return cur.rowcount == 1

    def add_network_layers(self, network: str, layers: Iterable[tuple[int, str, str]]) -> None:
        """Record which conv workloads (compact specs) make up ``network``, in order."""
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO network_layers VALUES (?, ?, ?, ?)",
                [(network, i, name, conv) for i, name, conv in layers])

    def add_network_config(self, network: str, config: str,
                           layers: Iterable[tuple[int, str, str, str, float]]) -> None:
        """Record a compressed network: each conv layer's workload, compression and the
        ratio its kernels are measured at (its own sparsity, after global pruning)."""
        with self._db:
            self._db.executemany(_CONFIG_SQL, [(network, config, *layer) for layer in layers])

    def add_network(self, record: "NetworkMeasurement", replace: bool = False) -> bool:
        """Commit one whole-network measurement; a stored failure of the same key is
        replaced, a stored success only with ``replace``. False if already there."""
        with self._db:
            return self._insert_network(record.to_row(), replace)

    def _insert_network(self, row: dict[str, Any], replace: bool) -> bool:
        _refuse_emulated(row.get("board"))
        values = tuple(row.get(c) for c in NETWORK_COLUMNS)
        self._db.execute("DELETE FROM network_measurements WHERE key = ?"
                         + ("" if replace else " AND error IS NOT NULL"), (row["key"],))
        cur = self._db.execute(
            f"INSERT OR IGNORE INTO network_measurements ({','.join(NETWORK_COLUMNS)}) "
            f"VALUES ({','.join('?' * len(NETWORK_COLUMNS))})", values)
        return cur.rowcount == 1

    def network_measurements(self, where: str = "", params: tuple = ()) -> list[dict[str, Any]]:
        cur = self._db.execute("SELECT * FROM network_measurements"
                               + (f" WHERE {where}" if where else "") + " ORDER BY id", params)
        return [dict(r) for r in cur]

    def network_records(self, where: str = "", params: tuple = ()) -> list["NetworkMeasurement"]:
        """The whole-network measurements as records."""
        from dlas_predict.measure.networks.plans import NetworkMeasurement

        return [NetworkMeasurement.from_row(r) for r in self.network_measurements(where, params)]

    def network_configs(self, network: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM network_configs"
        params: tuple = ()
        if network is not None:
            sql += " WHERE network = ?"
            params = (network,)
        cur = self._db.execute(sql + " ORDER BY network, config, layer_index", params)
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row)) for row in cur]

    # ---- reading ------------------------------------------------------------------------
    def keys(self, include_failures: bool = True) -> set[str]:
        sql = "SELECT key FROM measurements"
        if not include_failures:
            sql += " WHERE error IS NULL"
        return {r[0] for r in self._db.execute(sql)}

    def slow_keys(self, protocol: Any, table: str = "measurements",
                  unprobed: bool = False) -> dict[str, float]:
        """Successful records of ``table`` (``measurements`` or ``network_measurements``)
        timed on a slow machine, as {key: slowness} (:func:`~dlas_predict.measure.records.slowness`,
        over 1): what ``collect --retime-slow`` times again. With ``unprobed`` also those
        timed before the probes were recorded (neither reading), at slowness 1, the limit: a
        new timing replaces one only if the machine was quiet (``--retime-unprobed``)."""
        if table not in ("measurements", "network_measurements"):
            raise StoreError(f"no table {table!r} of timed records")
        which = "contention > ? OR slowdown > ?"
        if unprobed:
            which += " OR (contention IS NULL AND slowdown IS NULL)"
        rows = self._db.execute(
            f"SELECT key, contention, slowdown FROM {table} WHERE error IS NULL AND ({which})",
            (float(protocol.contention_limit), float(protocol.slowdown_limit)))
        return {key: 1.0 if c is None and s is None else slowness(c, s, protocol)
                for key, c, s in rows}

    def fingerprints(self, device: str) -> list[tuple[str, int]]:
        """(fingerprint, records) of ``device``'s measurements, most records first."""
        return [(r[0], r[1]) for r in self._db.execute(
            "SELECT fingerprint, COUNT(*) n FROM measurements WHERE device = ? "
            "GROUP BY fingerprint ORDER BY n DESC", (device,))]

    def rows(self, where: str = "", params: tuple = ()) -> Iterator[dict[str, Any]]:
        sql = "SELECT * FROM measurements" + (f" WHERE {where}" if where else "") + " ORDER BY id"
        for row in self._db.execute(sql, params):
            yield dict(row)

    def current_rows(self, where: str = "", params: tuple = ()) -> list[dict[str, Any]]:
        """:meth:`rows` less the records of an older kernel code: a configuration measured
        again on the same machine with another ``kernels_version`` keeps only its latest
        version's records (see :func:`drop_older_kernels`)."""
        return drop_older_kernels(list(self.rows(where, params)))

    def tuned_rows(self, device: str) -> Iterator[dict[str, Any]]:
        """The device's successful tuned records that say how long their search took."""
        return self.rows("error IS NULL AND device = ? AND tuning = 'tuned' AND tuner IS NOT "
                         "NULL AND tuning_seconds IS NOT NULL", (device,))

    def results(self, where: str = "", params: tuple = ()) -> list[MeasureResult]:
        return [MeasureResult.from_row(r) for r in self.rows(where, params)]

    def fastest_per_layer(self, device: str) -> list[MeasureResult]:
        """The device's fastest successful kernel (by median) per (workload, compression,
        ratio), sorted by those."""
        best: dict[tuple, dict[str, Any]] = {}
        for r in self.current_rows("error IS NULL AND device = ?", (device,)):
            k = (r["conv"], r["compression"], r["ratio"] or 0.0)
            if k not in best or r["median_s"] < best[k]["median_s"]:
                best[k] = r
        return [MeasureResult.from_row(best[k]) for k in sorted(best)]

    def stats(self) -> "StoreStats":
        """Counts for ``corpus stats``: records, failures, duplicate keys, and a breakdown."""
        q = self._db.execute
        records = q("SELECT COUNT(*) FROM measurements").fetchone()[0]
        failures = q("SELECT COUNT(*) FROM measurements WHERE error IS NOT NULL").fetchone()[0]
        duplicates = q("SELECT COUNT(*) - COUNT(DISTINCT key) FROM measurements").fetchone()[0]
        unverified = q("SELECT COUNT(*) FROM measurements WHERE error IS NULL AND verified = 0"
                       ).fetchone()[0]
        noisy = q("SELECT COUNT(*) FROM measurements WHERE noisy = 1").fetchone()[0]

        def group(col: str) -> dict[str, int]:
            return {r[0]: r[1] for r in q(
                f"SELECT {col}, COUNT(*) FROM measurements GROUP BY {col} ORDER BY {col}")}

        return StoreStats(
            store=str(self.path), records=records, failures=failures,
            duplicates=duplicates, unverified=unverified, noisy=noisy,
            workloads=q("SELECT COUNT(DISTINCT conv) FROM measurements").fetchone()[0],
            networks=q("SELECT COUNT(*) FROM (SELECT network FROM network_layers UNION "
                       "SELECT network FROM network_configs)").fetchone()[0],
            network_measurements=q("SELECT COUNT(*) FROM network_measurements WHERE error "
                                   "IS NULL").fetchone()[0],
            devices=group("device"), algorithms=group("algorithm"),
            compressions=group("compression"), tunings=group("tuning"))

    def export(self, out: str | Path, fmt: str, latest: bool = False) -> int:
        """Write every measurement to ``out`` as parquet or csv; returns the row count.

        With ``latest``, the successful kernel records that a later ``kernels_version`` of
        the same configuration supersedes (:func:`drop_older_kernels`) are left out: they
        train nothing. Failures and whole-network records are all written."""
        import pandas as pd

        rows = list(self.rows())
        if latest:
            kept = {r["id"] for r in drop_older_kernels([r for r in rows if r["error"] is None])}
            rows = [r for r in rows if r["error"] is not None or r["id"] in kept]
        frame = pd.DataFrame(rows)
        if frame.empty:
            frame = pd.DataFrame(columns=["id", *COLUMNS])
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if fmt not in ExportFormat.words():
            raise StoreError(f"unknown export format {fmt!r}; allowed: "
                             + ", ".join(ExportFormat.words()))
        configs = pd.DataFrame(self.network_configs(), columns=[
            "network", "config", "layer_index", "layer_name", "conv", "compression", "ratio"])
        whole = pd.DataFrame(self.network_measurements(), columns=["id", *NETWORK_COLUMNS])
        for path, table in ((out, frame), (networks_path(out), configs),
                            (networks_path(out, "wholenet"), whole)):
            # the same records give the same bytes: an unchanged snapshot is not rewritten
            tmp = scratch_path(path)
            try:
                if fmt == "parquet":  # zstd: half snappy's size, for the snapshot in git
                    table.to_parquet(tmp, index=False, compression="zstd",
                                     compression_level=19)
                else:
                    table.to_csv(tmp, index=False)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            replace_if_changed(tmp, path)
        return len(frame)

    def import_snapshot(self, path: str | Path) -> tuple[int, int]:
        """Add the records of an exported snapshot (and its ``.networks`` file, if present)
        that this store does not hold; returns (records added, records already here). A
        network configuration the store already describes keeps the store's layers."""
        import pandas as pd

        from dlas_predict.measure.records import MeasureResult

        path = Path(path)
        if not path.is_file():
            raise StoreError(f"snapshot not found: {path}")
        read = pd.read_parquet if path.suffix == ".parquet" else pd.read_csv
        try:
            frame = read(path)
        except Exception as exc:
            raise StoreError(f"{path} is not a readable corpus snapshot ({exc})") from None
        missing = {"key", "conv_json", "algorithm", "run_secs"} - set(frame.columns)
        if missing:
            raise StoreError(f"{path} is not a corpus snapshot: no {', '.join(sorted(missing))}")
        have = self.keys()
        rows = []
        for row in frame.to_dict("records"):
            row = {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
            if row["key"] in have:
                continue
            result = MeasureResult.from_row(row)
            _refuse_emulated(result.board)
            rows.append(_row(result, row["run_secs"] or None))
        with self._db:  # one transaction: the snapshot's records are all added or none
            before = self._db.total_changes
            self._db.executemany(_INSERT_SQL, rows)
            added = self._db.total_changes - before
        nets = networks_path(path)
        if nets.is_file():
            configs = read(nets)
            held = {(c["network"], c["config"]) for c in self.network_configs()}
            layers = []
            for (network, config), group in configs.groupby(["network", "config"]):
                if (network, config) in held:  # the store's own layers (an older snapshot's
                    continue                   # may predate the removal of zeroed filters)
                layers += [(network, config, int(r.layer_index), r.layer_name, r.conv,
                            r.compression, float(r.ratio)) for r in group.itertuples()]
            with self._db:
                self._db.executemany(_CONFIG_SQL, layers)
        whole = networks_path(path, "wholenet")
        if whole.is_file():
            with self._db:
                for row in read(whole).to_dict("records"):
                    self._insert_network({k: (None if isinstance(v, float) and v != v else v)
                                          for k, v in row.items()}, False)
        return added, len(frame) - added

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "CorpusStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def store_device(store: Path, device: str, here: str | None):
    """The :class:`~dlas_predict.space.devices.Device` whose roofs describe ``device``'s rows
    in ``store``: the machine of fingerprint ``here`` (this machine's, for ``local`` and the
    profiles: :func:`~dlas_predict.space.devices.fingerprint_here`) where the store holds its
    measurements, else the machine of the store's most common fingerprint."""
    from dlas_predict.space.devices import get_device, rows_device

    with CorpusStore(store, must_exist=True) as db:
        prints = [fp for fp, _ in db.fingerprints(device)]
    if not prints:
        return get_device(device, with_target=False)
    return rows_device(device, here if here in prints else prints[0])
