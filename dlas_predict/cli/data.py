"""The corpus commands (``corpus stats|export|import|import-results|import-tophub``), the
analysis toolbox (``analyze heatmap|regression|roofline|boxplot``) and ``report``."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import List, Optional

import typer

from dlas_predict.space.choices import ExportFormat, Level
from dlas_predict.cli.common import analyze_app, app, corpus_app, fail, handle_errors, print_json

# ---- corpus -----------------------------------------------------------------------------
@corpus_app.command("stats")
@handle_errors
def corpus_stats(store: Path = typer.Option(..., "--store", help="Corpus store."),
                 as_json: bool = typer.Option(False, "--json")):
    """Counts of records, failures and duplicate keys, with a breakdown."""
    from dlas_predict.corpus.store import CorpusStore

    with CorpusStore(store, must_exist=True) as db:
        stats = asdict(db.stats())
    if as_json:
        print_json(stats)
        return
    for key, value in stats.items():
        typer.echo(f"{key:>13}: {value}")


@corpus_app.command("export")
@handle_errors
def corpus_export(store: Path = typer.Option(..., "--store", help="Corpus store."),
                  fmt: ExportFormat = typer.Option(ExportFormat.PARQUET, "--format",
                                                   help="File format."),
                  out: Path = typer.Option(..., "-o", "--out", help="Output file."),
                  latest: bool = typer.Option(False, "--latest", help="Leave out the kernel "
                                              "records that a later kernels version of the "
                                              "same configuration supersedes.")):
    """Export every measurement (all run times included) as Parquet or CSV."""
    from dlas_predict.corpus.store import CorpusStore

    with CorpusStore(store, must_exist=True) as db:
        n = db.export(out, fmt.value, latest=latest)
    from dlas_predict.corpus.store import networks_path

    typer.echo(f"wrote {n} records to {out} (network configurations: {networks_path(out)})")


@corpus_app.command("import")
@handle_errors
def corpus_import(snapshot: Path = typer.Argument(..., help="An exported .parquet or .csv."),
                  store: Path = typer.Option(..., "--store", help="Corpus store (created if "
                                             "new).")):
    """Load an exported snapshot (and its network configurations) into a store."""
    from dlas_predict.corpus.store import CorpusStore

    with CorpusStore(store) as db:
        added, present = db.import_snapshot(snapshot)
    typer.echo(f"imported {added} records into {store} ({present} were already there)")


@corpus_app.command("import-results")
@handle_errors
def corpus_import_results(
        bundle: Path = typer.Argument(..., help="A kernel bundle (`dlas-predict bundle`)."),
        results: Optional[Path] = typer.Argument(
            None, help="Its results file, written by `python -m dlas_predict.measure.gpu.run` "
                       "on the GPU."),
        store: Path = typer.Option(..., "--store", help="Corpus store (created if new)."),
        device: Optional[str] = typer.Option(
            None, "--device", help="File the results under this registry GPU: the one that "
            "measured them, where it is not the bundle's (gpu.json beside the results says "
            "which)."),
        tuning_db: Optional[Path] = typer.Option(
            None, "--tuning-db", help="File the measured MetaSchedule candidates in this "
            "tuning database, what the next round of `bundle --tuner metaschedule` reads "
            "(default: DLAS_HOME/tuning/DEVICE-FINGERPRINT of the GPU they are filed "
            "under).")):
    """Import a kernel bundle's results (and its build failures) as corpus records."""
    from dlas_predict.corpus.gpu import import_bundle

    dev = None
    if device is not None:
        from dlas_predict.space.devices import get_device

        dev = get_device(device, with_target=False)
    rep = import_bundle(bundle, results, store, dev, tuning_db)
    counts = rep.counts
    typer.echo(f"imported {counts['records']} records ({counts['failed']} failures) of "
               f"{rep.networks} networks into {store}; {counts['skipped']} were already there"
               + (f"; {counts['incomplete_searches']} searches not finished (run the "
                  "bundle again)" if counts["incomplete_searches"] else "")
               + (f"; {rep.filed} MetaSchedule candidates filed in {rep.tuning_db}"
                  if rep.filed else "")
               + (f"; {counts['networks']} whole networks ({counts['network_failures']} "
                  "failures)" if counts["networks"] else ""))


@corpus_app.command("import-tophub")
@handle_errors
def corpus_import_tophub(
        logs: List[Path] = typer.Argument(..., help="TopHub .jsonl logs, or folders of them "
                                          "(e.g. $DLAS_SHARED_DATA/tophub)."),
        store: Path = typer.Option(..., "--store", help="Corpus store (created if new)."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Import public TVM TopHub measurements (AutoTVM-tuned convs of Arm and NVIDIA devices)."""
    from dlas_predict.corpus.tophub import import_tophub

    report = import_tophub(logs, store)
    if as_json:
        print_json(report.to_dict())
        return
    typer.echo(f"imported {report.added} TopHub records into {store} ({report.present} were "
               "already there)")
    for dev, n in sorted(report.devices.items()):
        typer.echo(f"  {dev:14s} {n:5d}")
    for reason, n in sorted(report.skipped.items()):
        typer.echo(f"  left out {n:4d}: {reason}")


# ---- analyze ----------------------------------------------------------------------------
_DEVICE_OPT = typer.Option("local", "--device", help="Whose shipped corpus to read (ignored "
                           "rows of other devices are dropped when --store is given too).")
_STORE_OPT = typer.Option(None, "--store", help="A corpus store instead of the device's own "
                          "(local: this machine's, once `calibrate` or `collect` measured it) "
                          "or shipped corpus.")
_LEVEL_OPT = typer.Option(Level.KERNEL, "--level", help="kernel: one row per conv kernel "
                          "measurement; network: one row per whole-network configuration.")
_NETWORK_OPT = typer.Option(None, "--network", help="Keep these networks (comma-separated).")
_TUNING_OPT = typer.Option(None, "--tuning", help="Keep untuned | tuned.")
_DTYPE_OPT = typer.Option(None, "--dtype", help="Keep float32 | float16 | int8.")
_ALG_OPT = typer.Option(None, "--algorithm", help="Keep these algorithms.")
_COMP_OPT = typer.Option(None, "--compression", help="Keep these compressions.")
_OUT_OPT = typer.Option(..., "--out", help="Plot file (.png, .svg or .pdf).")
_JSON_OPT = typer.Option(False, "--json", help="Print the numbers as JSON.")


def _analysis_frame(device, store, level, network, tuning, dtype, algorithm, compression):
    from dlas_predict.analysis import frames as A
    from dlas_predict.space.devices import get_device

    A.check_level(level)
    get_device(device, with_target=False)  # an unknown device is one clear error
    corpus = A.open_corpus(device, store)
    filters = A.Filters(network=network, tuning=tuning, dtype=dtype, algorithm=algorithm,
                        compression=compression)
    build = A.kernel_frame if level == "kernel" else A.network_frame
    frame = build(corpus.path, corpus.device, filters)
    if frame.empty:
        fail("no rows left after the filters")
    return frame, corpus


def _wrote(out: Path, frame, corpus) -> None:
    typer.echo(corpus.describe())
    typer.echo(f"wrote {out} ({len(frame)} rows)")


@analyze_app.command("heatmap")
@handle_errors
def analyze_heatmap(x: str = typer.Option(..., "--x", help="Parameter on the x axis."),
                    y: str = typer.Option(..., "--y", help="Parameter on the y axis."),
                    metric: str = typer.Option("gflops", "--metric", help="Metric coloured."),
                    out: Path = _OUT_OPT, device: str = _DEVICE_OPT,
                    store: Optional[Path] = _STORE_OPT, level: Level = _LEVEL_OPT,
                    network: Optional[str] = _NETWORK_OPT, tuning: Optional[str] = _TUNING_OPT,
                    dtype: Optional[str] = _DTYPE_OPT, algorithm: Optional[str] = _ALG_OPT,
                    compression: Optional[str] = _COMP_OPT, as_json: bool = _JSON_OPT):
    """Median of a metric over two parameters: their contribution and interaction."""
    from dlas_predict.analysis import frames as A
    from dlas_predict.analysis import plots as P

    for p in (x, y):
        A.check_parameter(p, level)
    A.check_metric(metric, level)
    frame, corpus = _analysis_frame(device, store, level, network, tuning, dtype,
                                    algorithm, compression)
    result = A.heatmap(frame, x, y, metric, level)
    P.plot_heatmap(result, out, P.plot_subtitle(frame, corpus=corpus))
    if as_json:
        print_json(result.to_dict())
        return
    from dlas_predict.render import format_table

    rows = [{result.y: yv, **{str(xv): ("" if v is None else f"{v:.4g}")
                              for xv, v in zip(result.x_values, vals)}}
            for yv, vals in zip(result.y_values, result.values)]
    typer.echo(f"median {metric} ({A.METRICS[metric][1]}) by {y} (rows) x {x} (columns); "
               "measured")
    typer.echo(format_table(rows))
    _wrote(out, frame, corpus)


@analyze_app.command("regression")
@handle_errors
def analyze_regression(metric: str = typer.Option(..., "--metric", help="Metric explained."),
                       params: Optional[str] = typer.Option(
                           None, "--params", help="Parameters (comma-separated); default: "
                           "the layer shape and the configuration."),
                       out: Path = _OUT_OPT, device: str = _DEVICE_OPT,
                       store: Optional[Path] = _STORE_OPT, level: Level = _LEVEL_OPT,
                       network: Optional[str] = _NETWORK_OPT,
                       tuning: Optional[str] = _TUNING_OPT, dtype: Optional[str] = _DTYPE_OPT,
                       algorithm: Optional[str] = _ALG_OPT,
                       compression: Optional[str] = _COMP_OPT, as_json: bool = _JSON_OPT):
    """Linear regression of a metric on parameters: standardised coefficients and R²."""
    from dlas_predict.analysis import frames as A
    from dlas_predict.analysis import plots as P

    A.check_metric(metric, level)
    default = ("C,K,H,R,stride,depthwise,algorithm,compression,sparsity" if level == "kernel"
               else "net_macs,conv_layers,algorithm,compression,ratio")
    names = [p.strip() for p in (params or default).split(",") if p.strip()]
    for p in names:
        A.check_parameter(p, level)
    frame, corpus = _analysis_frame(device, store, level, network, tuning, dtype,
                                    algorithm, compression)
    result = A.regression(frame, metric, names, level)
    P.plot_regression(result, out, P.plot_subtitle(frame, corpus=corpus))
    if as_json:
        print_json(result.to_dict())
        return
    from dlas_predict.render import format_table

    rank = sorted(range(len(result.terms)), key=lambda i: -abs(result.coefficients[i]))
    top = abs(result.coefficients[rank[0]]) or 1.0
    typer.echo(f"OLS of standardised {metric} on {', '.join(names)}: R² = {result.r2:.3f} "
               f"(in-sample), n = {result.n}; fitted on measurements")
    typer.echo(format_table([{"term": result.terms[i],
                              "std. coefficient": f"{result.coefficients[i]:+.3f}",
                              "vs largest": f"{abs(result.coefficients[i]) / top:.2f}"}
                             for i in rank]))
    typer.echo("importance by parameter (sum of |coefficient|): " + ", ".join(
        f"{k} {v:.3f}" for k, v in result.importance.items()))
    _wrote(out, frame, corpus)


@analyze_app.command("roofline")
@handle_errors
def analyze_roofline(out: Path = _OUT_OPT, device: str = _DEVICE_OPT,
                     store: Optional[Path] = _STORE_OPT,
                     color: str = typer.Option("algorithm", "--color",
                                               help="Parameter that colours the points."),
                     network: Optional[str] = _NETWORK_OPT,
                     tuning: Optional[str] = _TUNING_OPT, dtype: Optional[str] = _DTYPE_OPT,
                     algorithm: Optional[str] = _ALG_OPT,
                     compression: Optional[str] = _COMP_OPT, as_json: bool = _JSON_OPT):
    """Every kernel measurement at (arithmetic intensity, achieved GFLOP/s) under the
    device's roofs (measured for the local CPU: `devices --measure-peaks`)."""
    from dlas_predict.analysis import frames as A
    from dlas_predict.analysis import plots as P

    A.check_parameter(color, "kernel")
    frame, corpus = _analysis_frame(device, store, "kernel", network, tuning, dtype,
                                    algorithm, compression)
    frame, dev = A.unique_kernels(frame), corpus.device
    P.plot_roofline(frame, dev, out, color, P.plot_subtitle(frame, " (unique kernels)", corpus))
    frac = frame["roofline_fraction"].dropna()
    above = int((frac > 1.0).sum())
    summary = {"device": dev.name, "roofs_source": dev.source,
               "corpus": str(corpus.path), "corpus_origin": corpus.origin,
               "this_machine": corpus.this_machine, "measured_on": dev.description,
               "peak_gflops": dev.peak_gflops, "int8_dot_gflops": dev.int8_dot_gflops,
               "mem_bandwidth_gbs": dev.mem_bandwidth_gbs,
               "cache_bandwidth_gbs": dev.cache_bandwidth_gbs,
               "kernels": len(frame), "above_roof": above,
               "roofline_fraction": {q: float(frac.quantile(v)) for q, v in
                                     (("p10", 0.1), ("median", 0.5), ("p90", 0.9))}
               if len(frac) else None}
    if as_json:
        print_json(summary)
        return
    peaks = ", ".join(f"{k} {v:g}" for k, v in dev.peak_gflops.items()) or "unknown"
    if dev.int8_dot_gflops:
        peaks += f", int8 VNNI {dev.int8_dot_gflops:g}"
    caches = "".join(f", {k} {v:g}" for k, v in dev.cache_bandwidth_gbs.items())
    typer.echo(f"roofs of {dev.name} ({dev.source}): peak GFLOP/s {peaks}; bandwidth GB/s "
               f"DRAM {dev.mem_bandwidth_gbs or 'unknown'}{caches}")
    if summary["roofline_fraction"]:
        r = summary["roofline_fraction"]
        typer.echo(f"share of the attainable roof reached (measured kernels): p10 "
                   f"{r['p10']:.1%}, median {r['median']:.1%}, p90 {r['p90']:.1%}")
    if above:
        typer.echo(f"warning: {above} of {len(frac)} kernels lie above their roof"
                   + ("" if dev.cache_bandwidth_gbs else ": these roofs have no measured "
                      "cache bandwidth, and a kernel whose bytes stay in a cache beats main "
                      "memory's (`devices --measure-peaks` on that machine measures them)"))
    _wrote(out, frame, corpus)


@analyze_app.command("boxplot")
@handle_errors
def analyze_boxplot(metric: str = typer.Option(..., "--metric", help="Metric distributed."),
                    by: str = typer.Option(..., "--by", help="Parameter that groups."),
                    out: Path = _OUT_OPT, device: str = _DEVICE_OPT,
                    store: Optional[Path] = _STORE_OPT, level: Level = _LEVEL_OPT,
                    network: Optional[str] = _NETWORK_OPT, tuning: Optional[str] = _TUNING_OPT,
                    dtype: Optional[str] = _DTYPE_OPT, algorithm: Optional[str] = _ALG_OPT,
                    compression: Optional[str] = _COMP_OPT,
                    log: Optional[bool] = typer.Option(None, "--log/--linear",
                                                       help="y scale (default: log when the "
                                                       "values span over 100x)."),
                    as_json: bool = _JSON_OPT):
    """Distribution and variability of a metric per group of a parameter."""
    from dlas_predict.analysis import frames as A
    from dlas_predict.analysis import plots as P

    A.check_parameter(by, level)
    A.check_metric(metric, level)
    frame, corpus = _analysis_frame(device, store, level, network, tuning, dtype,
                                    algorithm, compression)
    result, samples = A.boxplot_stats(frame, metric, by, level)
    P.plot_boxplot(result, samples, out, P.plot_subtitle(frame, corpus=corpus), log)
    if as_json:
        print_json(result.to_dict())
        return
    from dlas_predict.render import format_table

    typer.echo(f"{metric} ({A.METRICS[metric][1]}) by {by}; measured")
    typer.echo(format_table([{by: g, **{k: (v if k == "n" else f"{v:.4g}")
                                         for k, v in st.items()}}
                             for g, st in zip(result.groups, result.stats)]))
    _wrote(out, frame, corpus)


@app.command()
@handle_errors
def report(device: str = typer.Option("local", "--device", help="Whose corpus to report on."),
           store: Optional[Path] = typer.Option(None, "--store", help="A corpus store instead "
                                                "of the device's own or shipped corpus."),
           out: Path = typer.Option(..., "--out", help="Folder for index.html, report.json "
                                    "and the plots."),
           as_json: bool = typer.Option(False, "--json", help="Print report.json too.")):
    """The DLAS report: Tables 3/4/6, the share of the ideal speedup, the study's 13
    observations with a verdict each, and the plots, as one HTML page. On local, this
    machine's measurements once `calibrate` or `collect` made them; else a shipped corpus,
    and whose machine it is."""
    from dlas_predict.analysis.page import write_report

    rep, page = write_report(device, store, out)
    if as_json:
        print_json(rep.to_dict())
        return
    typer.echo(rep.whose)
    for o in rep.observations:
        typer.echo(f"{o.number + ')':6s} {o.verdict:14s} {o.claim}")
    verdicts = [o.verdict for o in rep.observations]
    typer.echo(f"\n{verdicts.count('holds')} hold, {verdicts.count('does not hold')} do not, "
               f"{verdicts.count('no data')} have no data on {rep.device.name}")
    if rep.families:
        names = list(rep.families)
        typer.echo("\nfamily by family: " + ", ".join(
            f"{f} ({rep.counts['networks_by_family'].get(f, 0)})" for f in names))
        for i, o in enumerate(rep.families[names[0]]):
            typer.echo(f"{o.number + ')':6s} " + "  ".join(
                f"{rep.families[f][i].verdict:14s}" for f in names))
    typer.echo(f"wrote {page} ({len(rep.plots)} plots embedded) and {out / 'report.json'}")
