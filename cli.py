"""The ``dlas-predict`` command: a thin layer over the library.

Every library error is a :class:`dlas_predict.errors.DlasError`; it is printed as one
``Error: …`` line on stderr and the command exits non-zero. Heavy packages (TVM, torch,
LightGBM, pandas) are imported inside the commands that need them.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable, List, Optional

import typer

from dlas_predict.errors import DlasError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Predict the fastest accurate way to deploy a DNN (DLAS grid), "
                       "from real TVM measurements.")
corpus_app = typer.Typer(no_args_is_help=True, help="Inspect and export a measurement corpus.")
app.add_typer(corpus_app, name="corpus")

DEMO_NETWORK = Path(__file__).resolve().parent / "datasets" / "networks" / "demo-cnn.onnx"


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code)


def handle_errors(func: Callable) -> Callable:
    """Turn library errors into one ``Error:`` line and a non-zero exit status."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except DlasError as exc:
            _fail(str(exc))
        except OSError as exc:  # unwritable output, full disk, unreadable input
            _fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
        except KeyboardInterrupt:
            _fail("interrupted; every record measured so far is kept in the store", 130)

    return wrapper


def _print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


# ---- devices ----------------------------------------------------------------------------
@app.command()
@handle_errors
def devices(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """List the device registry (``local`` is detected on this machine)."""
    from dlas_predict.devices import all_devices
    from dlas_predict.table import format_table

    devs = all_devices()
    if as_json:
        _print_json([d.to_dict() for d in devs])
        return
    rows = [{
        "name": d.name, "kind": d.kind, "cores": d.cores,
        "peak fp32 GFLOP/s": d.peak_gflops.get("float32"),
        "bandwidth GB/s": d.mem_bandwidth_gbs, "figures": d.source,
        "target": json.dumps(d.target, separators=(",", ":")), "description": d.description,
    } for d in devs]
    typer.echo(format_table(rows))
    typer.echo("\nfigures: spec = vendor specification; estimate = derived from the detected "
               "ISA and clock (not measured).")


# ---- measure ----------------------------------------------------------------------------
def _protocol(max_repeats: int, time_budget: float):
    from dlas_predict.errors import ConfigError
    from measure.worker import Protocol

    if max_repeats < 1:
        raise ConfigError(f"--max-repeats must be at least 1, got {max_repeats}")
    if time_budget <= 0:
        raise ConfigError(f"--time-budget must be positive, got {time_budget}")
    return Protocol(max_repeats=max_repeats, min_repeats=min(10, max_repeats),
                    time_budget_s=time_budget)


def _local_device(name: str):
    from dlas_predict.devices import LOCAL, get_device
    from dlas_predict.errors import DeviceError

    if name != LOCAL:
        get_device(name, with_target=False)  # an unknown name raises, listing the known ones
        raise DeviceError(f"device {name!r} is in the registry but cannot be measured from "
                          "here: measurement runs on 'local' only (RPC runners are not built "
                          "yet)")
    return get_device(LOCAL)


@app.command()
@handle_errors
def measure(
    conv: str = typer.Option(..., "--conv", help="Conv workload, e.g. "
                             "C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1[,groups=G]"),
    device: str = typer.Option("local", "--device", help="Device name (see `devices`)."),
    algorithm: str = typer.Option("all", "--algorithm",
                                  help="all | comma list of direct,gemm,spatial_pack"),
    compression: str = typer.Option(
        "all", "--compression",
        help="all | comma list of dense,weight_pruning,channel_pruning,float16,int8"),
    ratio: float = typer.Option(0.9, "--ratio", help="Pruning ratio in (0, 1)."),
    store: Optional[Path] = typer.Option(None, "--store", help="Also record into this corpus."),
    max_repeats: int = typer.Option(150, "--max-repeats", help="Timed runs (at most)."),
    time_budget: float = typer.Option(3.0, "--time-budget",
                                      help="Seconds of timing per variant (>= 10 runs kept)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds before a kernel is "
                                  "declared hung."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per variant."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
):
    """Measure one conv workload across algorithms × compressions on a device."""
    from dlas_predict.config import Algorithm, Compression, ConvSpec, check_ratio, variant_grid
    from dlas_predict.table import format_table
    from measure.collect import collect as run_collect
    from measure.runner import LocalRunner, MeasureTask

    spec = ConvSpec.parse(conv)
    algorithms = Algorithm.parse_list(algorithm)
    compressions = Compression.parse_list(compression)
    check_ratio(ratio)
    proto = _protocol(max_repeats, time_budget)
    dev = _local_device(device)
    variants = variant_grid(algorithms, compressions, ratio)
    tasks = [MeasureTask.make(spec, v, dev) for v in variants]
    db = None
    if store is not None:
        from dlas_predict.store import CorpusStore

        db = CorpusStore(store)
    with LocalRunner(dev, protocol=proto, timeout_s=timeout) as runner:
        # measure always measures: nothing is skipped; with --store each record is committed
        # as it arrives.
        results = run_collect(tasks, None, runner, progress=not quiet and not as_json,
                              on_result=db.add if db is not None else None).results
    if db is not None:
        db.close()
    keys = ("algorithm", "compression", "ratio", "sparse", "dtype", "tuning", "median_ms",
            "spread", "n_runs", "gflops", "sparsity", "verified", "max_error", "compile_s",
            "knobs", "error")
    out = [{"conv": spec.to_spec(), "device": dev.name,
            **{k: r.to_dict()[k] for k in keys}} for r in results]
    if as_json:
        _print_json(out)
    else:
        typer.echo(f"{spec.to_spec()}  on {dev.name} ({dev.description}); "
                   f"{spec.macs / 1e6:.1f} M MACs; measured medians")
        typer.echo(format_table([_measure_row(r) for r in results]))
    bad = [r for r in results if not r.ok or r.verified is False]
    if bad:
        _fail(f"{len(bad)} of {len(results)} variants failed or did not verify "
              "(see the error column)")


def _measure_row(r) -> dict:
    d = r.to_dict()
    return {
        "algorithm": d["algorithm"], "compression": d["compression"],
        "ratio": d["ratio"] or "", "dtype": d["dtype"], "sparse": "csr" if d["sparse"] else "",
        "median ms": None if d["median_ms"] is None else round(d["median_ms"], 4),
        "spread": None if d["spread"] is None else f"{d['spread']:.1%}",
        "runs": d["n_runs"], "GFLOP/s": None if d["gflops"] is None else round(d["gflops"], 1),
        "verified": d["verified"], "max err": None if d["max_error"] is None
        else f"{d['max_error']:.2g}", "error": (d["error"] or "")[:70],
    }


# ---- collect ----------------------------------------------------------------------------
@app.command()
@handle_errors
def collect(
    network: List[Path] = typer.Option(..., "--network", help="ONNX file (repeatable)."),
    store: Path = typer.Option(..., "--store", help="Corpus store (SQLite), created if new."),
    device: str = typer.Option("local", "--device", help="Device name (see `devices`)."),
    algorithms: str = typer.Option("all", "--algorithms", help="all | comma list."),
    compressions: str = typer.Option("all", "--compressions", help="all | comma list."),
    ratio: float = typer.Option(0.9, "--ratio", help="Pruning ratio in (0, 1)."),
    retry_failures: bool = typer.Option(False, "--retry-failures",
                                        help="Measure again what failed before."),
    max_repeats: int = typer.Option(150, "--max-repeats"),
    time_budget: float = typer.Option(3.0, "--time-budget"),
    timeout: float = typer.Option(300.0, "--timeout"),
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
):
    """Measure the grid over every unique conv layer of the networks; resumable."""
    _collect(network, store, device, algorithms, compressions, ratio, retry_failures,
             max_repeats, time_budget, timeout, as_json, quiet)


def _collect(networks, store, device, algorithms, compressions, ratio, retry_failures,
             max_repeats, time_budget, timeout, as_json, quiet):
    from dlas_predict.config import Algorithm, Compression, variant_grid
    from dlas_predict.network import conv_layers, unique_specs
    from dlas_predict.store import CorpusStore
    from measure.collect import collect as run_collect, plan_tasks
    from measure.runner import LocalRunner

    algs = Algorithm.parse_list(algorithms)
    comps = Compression.parse_list(compressions)
    proto = _protocol(max_repeats, time_budget)
    variants = variant_grid(algs, comps, ratio)
    dev = _local_device(device)
    layers_by_net = {}
    for path in networks:
        layers = conv_layers(path)
        if not layers:
            raise DlasError(f"{path} has no Conv layer to measure")
        layers_by_net[Path(path).stem] = layers
    specs = unique_specs([layer for ls in layers_by_net.values() for layer in ls])
    tasks = plan_tasks(specs, variants, dev)
    db = CorpusStore(store)
    for name, layers in layers_by_net.items():
        db.add_network_layers(name, [(l.index, l.name, l.spec.to_spec()) for l in layers])
    if not quiet and not as_json:
        typer.echo(f"{len(layers_by_net)} network(s), {len(specs)} unique conv workloads × "
                   f"{len(variants)} variants = {len(tasks)} kernels on {dev.name}", err=True)
    with LocalRunner(dev, protocol=proto, timeout_s=timeout) as runner:
        summary = run_collect(tasks, db, runner, retry_failures=retry_failures,
                              progress=not quiet and not as_json)
    stats = db.stats()
    db.close()
    report = {**summary.to_dict(), "store": str(store), "records": stats["records"],
              "failures_in_store": stats["failures"]}
    if as_json:
        _print_json(report)
    else:
        typer.echo(f"measured {summary.measured} ({summary.failed} failed), skipped "
                   f"{summary.skipped} already in the store, in {summary.seconds:.1f} s; "
                   f"store {store} now holds {stats['records']} records")
    if summary.failed:
        _fail(f"{summary.failed} kernels failed; each failure is recorded with its error "
              f"(dlas-predict corpus stats --store {store})")
    return summary


# ---- corpus -----------------------------------------------------------------------------
@corpus_app.command("stats")
@handle_errors
def corpus_stats(store: Path = typer.Option(..., "--store", help="Corpus store."),
                 as_json: bool = typer.Option(False, "--json")):
    """Counts of records, failures and duplicate keys, with a breakdown."""
    from dlas_predict.store import CorpusStore

    with CorpusStore(store, must_exist=True) as db:
        stats = db.stats()
    if as_json:
        _print_json(stats)
        return
    for key, value in stats.items():
        typer.echo(f"{key:>13}: {value}")


@corpus_app.command("export")
@handle_errors
def corpus_export(store: Path = typer.Option(..., "--store", help="Corpus store."),
                  fmt: str = typer.Option("parquet", "--format", help="parquet | csv"),
                  out: Path = typer.Option(..., "-o", "--out", help="Output file.")):
    """Export every measurement (all run times included) as Parquet or CSV."""
    from dlas_predict.errors import StoreError
    from dlas_predict.store import CorpusStore

    if fmt not in ("parquet", "csv"):
        raise StoreError(f"unknown export format {fmt!r}; allowed: parquet, csv")
    with CorpusStore(store, must_exist=True) as db:
        n = db.export(out, fmt)
    typer.echo(f"wrote {n} records to {out}")


# ---- demo -------------------------------------------------------------------------------
@app.command()
@handle_errors
def demo(store: Optional[Path] = typer.Option(None, "--store",
                                              help="Default: DLAS_HOME/demo.sqlite"),
         quiet: bool = typer.Option(False, "--quiet", "-q")):
    """The embedded default: the shipped demo CNN's conv layers × the whole untuned grid,
    measured on the local CPU; prints the fastest algorithm per layer and compression."""
    from dlas_predict.home import dlas_home
    from dlas_predict.store import CorpusStore
    from dlas_predict.table import format_table

    store = store or dlas_home() / "demo.sqlite"
    _collect([DEMO_NETWORK], store, "local", "all", "all", 0.9, False, 150, 1.0, 300.0,
             False, quiet)
    with CorpusStore(store, must_exist=True) as db:
        rows = db.rows("error IS NULL AND device = 'local'")
        best: dict[tuple[str, str], dict] = {}
        for r in rows:
            k = (r["conv"], r["compression"])
            if k not in best or r["median_s"] < best[k]["median_s"]:
                best[k] = r
    table = [{"conv": c, "compression": comp, "fastest algorithm": r["algorithm"],
              "median ms": round(r["median_s"] * 1e3, 4),
              "GFLOP/s": round(r["gflops"], 1)} for (c, comp), r in sorted(best.items())]
    typer.echo("\nFastest algorithm per layer and compression (measured):")
    typer.echo(format_table(table))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
