"""The ``dlas-predict`` command: a thin layer over the library.

Every library error is a :class:`dlas_predict.errors.DlasError`; it is printed as one
``Error: …`` line on stderr and the command exits non-zero. Heavy packages (TVM, torch,
LightGBM, pandas) are imported inside the commands that need them.
"""

from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path
from typing import Callable, List, Optional

import typer

from dlas_predict.space.config import DEFAULT_CURVE_RATIOS, ELBOW_DROP_PP
from dlas_predict.errors import DlasError
from dlas_predict.paths import DEMO_NETWORK

#: Help texts are plain text: ``[/ALGORITHM]`` and the like are syntax, not rich markup.
_PLAIN = {"rich_markup_mode": None}

app = typer.Typer(add_completion=False, no_args_is_help=True, **_PLAIN,
                  help="Predict the fastest accurate way to deploy a DNN (DLAS grid), "
                       "from real TVM measurements.")
corpus_app = typer.Typer(no_args_is_help=True, **_PLAIN, help="Inspect and export a measurement corpus.")
app.add_typer(corpus_app, name="corpus")
analyze_app = typer.Typer(no_args_is_help=True, **_PLAIN, help="ParaDnn's analysis toolbox over a corpus: "
                          "heatmap, regression, roofline, boxplot (PNG/SVG/PDF plots).")
app.add_typer(analyze_app, name="analyze")



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


_TRACKER_OPT = typer.Option(None, "--tracker", help="Measure on boards of this TVM RPC "
                            "tracker (HOST:PORT; default $DLAS_TRACKER). Loopback only "
                            "unless --allow-remote-tracker.")
_RPC_KEY_OPT = typer.Option(None, "--rpc-key", help="Tracker key of the boards (default: the "
                            "device's rpc_key in the registry).")
_ALLOW_REMOTE_OPT = typer.Option(False, "--allow-remote-tracker", help="Allow a tracker that "
                                 "is not on loopback. TVM RPC has no authentication: anyone "
                                 "on that network can run code on the boards.")
_BOARDS_OPT = typer.Option(None, "--boards", help="RPC: boards to use at once (default: "
                           "every board under the key).")
_TRIES_OPT = typer.Option(3, "--tries", help="RPC: boards a task is given (after a board "
                          "drops off, crashes or hangs) before its failure is recorded.")


# ---- devices ----------------------------------------------------------------------------
devices_app = typer.Typer(invoke_without_command=True, **_PLAIN,
                          help="The device registry: list, measure roofs, add, remove.")
app.add_typer(devices_app, name="devices")


@devices_app.callback()
@handle_errors
def devices(ctx: typer.Context,
            as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
            wide: bool = typer.Option(False, "--wide", help="Every column (origin, TVM "
                                      "target) and whole descriptions; the table is then "
                                      "wider than 120 characters."),
            measure_peaks: bool = typer.Option(
                False, "--measure-peaks", help="Measure the device's roofs (peak GFLOP/s "
                "per dtype with an FMA-bound kernel, bandwidth with a streaming kernel) and "
                "store them with its entry."),
            device: str = typer.Option("local", "--device", help="With --measure-peaks: "
                                       "the device (this machine, a profile, or a board "
                                       "through --tracker)."),
            save_to: Optional[Path] = typer.Option(
                None, "--save-to", help="With --measure-peaks: also merge the result into "
                "this JSON file (the shipped one is dlas_predict/data/measured_peaks.json)."),
            tracker: Optional[str] = _TRACKER_OPT, rpc_key: Optional[str] = _RPC_KEY_OPT,
            allow_remote_tracker: bool = _ALLOW_REMOTE_OPT,
            timeout: float = typer.Option(300.0, "--timeout", help="RPC: seconds to wait "
                                          "for a free board.")):
    """List the device registry: ``local`` and its profiles are detected on this machine,
    the others are shipped or added with ``devices add``."""
    from dlas_predict.space.devices import all_devices
    from dlas_predict.render import format_table

    if ctx.invoked_subcommand is not None:
        return
    if save_to is not None and not measure_peaks:
        _fail("--save-to needs --measure-peaks", 2)
    if measure_peaks:
        _measure_peaks(as_json, save_to, device, tracker, rpc_key, allow_remote_tracker,
                       timeout)
        return
    from dlas_predict.crossdev.adapted import adapted_devices, adapted_summary
    from dlas_predict.crossdev.transfer import foreign_calibration, own_model

    devs = all_devices()
    # a calibration measured on another machine is not this machine's local CPU's
    adapted = [n for n in adapted_devices() if not foreign_calibration(n)]
    trained = {d.name for d in devs if own_model(d.name)}
    known = {d.name for d in devs}
    measured_only = [adapted_summary(n) for n in adapted if n not in known]
    if as_json:
        _print_json([{**d.to_dict(), "model": "trained" if d.name in trained else
                      "adapted" if d.name in adapted else "zero-shot"} for d in devs]
                    + measured_only)
        return
    rows = [{
        "name": d.name, "kind": d.kind, "cores": d.cores,
        "fp32 GFLOP/s": _figure(d.peak_gflops.get("float32")),
        "GB/s": _figure(d.mem_bandwidth_gbs), "figures": d.source, "origin": d.origin,
        "model": "trained" if d.name in trained else "adapted" if d.name in adapted
        else "zero-shot",
        "target": json.dumps(d.target, separators=(",", ":")), "description": d.description,
    } for d in devs] + [{"name": m["name"], "kind": "?", "origin": "adapted",
                         "model": "adapted", "description": m["description"]}
                        for m in measured_only]
    columns = [c for c in rows[0] if wide or c not in ("origin", "target")]
    typer.echo(format_table(rows, columns, fit=None if wide else ("description", 120)))
    legend = ("figures: spec = vendor or user specification; estimate = derived from the "
              "detected ISA and clock (not measured); measured = `devices --measure-peaks`. "
              "origin (--wide): detected = this machine and its profiles (the same CPU, "
              "measured with other code generation and threads), shipped = the registry, "
              "user = `devices add`, adapted = known by measurements alone (`adapt`, "
              "`active-learn`). model: trained = its own cost models (for this machine and "
              "its profiles: trained on this machine); adapted = fitted on its "
              "measurements; zero-shot = from its spec.")
    typer.echo("\n" + textwrap.fill(legend, 100))


def _figure(value: float | None) -> str | None:
    """A roof for the devices table: one decimal below 1,000, none above."""
    if value is None:
        return None
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


@devices_app.command("add")
@handle_errors
def devices_add(name: str = typer.Argument(..., help="The new device's name."),
                kind: str = typer.Option(..., "--kind", help="cpu | gpu"),
                target: str = typer.Option(..., "--target", help="TVM target as JSON, e.g. "
                                           '{"kind":"llvm","mtriple":"aarch64-linux-gnu",'
                                           '"mcpu":"cortex-a72"}'),
                cores: int = typer.Option(..., "--cores", help="Cores (or GPU cores)."),
                peak_gflops: float = typer.Option(..., "--peak-gflops",
                                                  help="Peak float32 GFLOP/s (spec)."),
                bandwidth_gbs: float = typer.Option(..., "--bandwidth-gbs",
                                                    help="Memory bandwidth, GB/s (spec)."),
                rpc_key: Optional[str] = typer.Option(None, "--rpc-key",
                                                      help="Its boards' tracker key."),
                description: Optional[str] = typer.Option(None, "--description")):
    """Register a device in DLAS_HOME; its figures are labelled ``spec``."""
    from dlas_predict.space.devices import add_device, user_registry_path

    dev = add_device(name, kind, target, cores, peak_gflops, bandwidth_gbs, rpc_key,
                     description)
    typer.echo(f"added {dev.name} ({dev.kind}, {dev.cores} cores, "
               f"{dev.peak_gflops['float32']:g} GFLOP/s and {dev.mem_bandwidth_gbs:g} GB/s "
               f"as given: spec) to {user_registry_path()}")


@devices_app.command("remove")
@handle_errors
def devices_remove(name: str = typer.Argument(..., help="A device `devices add` added.")):
    """Remove a device that ``devices add`` registered."""
    from dlas_predict.space.devices import remove_device, user_registry_path

    remove_device(name)
    typer.echo(f"removed {name} from {user_registry_path()}")


def _measure_peaks(as_json: bool, save_to: Optional[Path], device: str, tracker, rpc_key,
                   allow_remote, timeout) -> None:
    from dlas_predict.measure.peaks import measure_device_peaks
    from dlas_predict.space.devices import get_device
    from dlas_predict.measure.execution.runner import LocalRunner

    dev = get_device(device)
    rpc = _rpc(dev, tracker, rpc_key, allow_remote, 1, 1, timeout)
    if not as_json:
        where = f" through {rpc.tracker} (key {rpc.key})" if rpc else ""
        typer.echo(f"measuring the roofs of {dev.name} ({dev.description}){where}, about "
                   "30 s ...")
    peaks, path = measure_device_peaks(dev, lambda: LocalRunner(dev, timeout_s=600, rpc=rpc),
                                       save_to)
    if as_json:
        _print_json(peaks.to_dict())
        return
    for dtype, value in peaks.peak_gflops.items():
        typer.echo(f"  peak {dtype:8s} {value:8.1f} GFLOP/s (measured)")
    if peaks.int8_dot_gflops:
        typer.echo(f"  peak int8 VNNI {peaks.int8_dot_gflops:8.1f} GOP/s (measured)")
    typer.echo(f"  bandwidth        {peaks.mem_bandwidth_gbs:8.1f} GB/s (measured)")
    for level, value in peaks.cache_bandwidth_gbs.items():
        typer.echo(f"  {level} bandwidth     {value:8.1f} GB/s (measured, warm)")
    typer.echo(f"stored with the {dev.name} entry: {path}"
               + (f" and {save_to}" if save_to else ""))


# ---- measure ----------------------------------------------------------------------------
_TRIALS_OPT = typer.Option(64, "--trials", help="Tuned: trial budget per kernel (up to the "
                           "study's 20000).")
_EARLY_STOP_OPT = typer.Option(32, "--early-stop", help="Tuned: stop a search after this many "
                               "trials without a 1 % gain (0: never).")
_TUNING_DB_OPT = typer.Option(None, "--tuning-db", help="Tuning database directory, reused "
                              "across runs (default: DLAS_HOME/tuning/DEVICE-FINGERPRINT).")

_QUIET_WAIT_OPT = typer.Option(30.0, "--quiet-wait", help="Seconds to wait, before each "
                               "timing, for the machine to run at its usual speed: no other "
                               "process on a core, the canary kernel near its fastest (0: time "
                               "at once; both are probed and recorded either way).")


def _check_quiet_wait(quiet_wait: float) -> None:
    from dlas_predict.errors import ConfigError

    if quiet_wait < 0:
        raise ConfigError(f"--quiet-wait must be 0 or more seconds, got {quiet_wait}")


def _protocol(max_repeats: int, time_budget: float, quiet_wait: float = 30.0):
    from dlas_predict.errors import ConfigError
    from dlas_predict.measure.execution.tasks import Protocol

    if max_repeats < 1:
        raise ConfigError(f"--max-repeats must be at least 1, got {max_repeats}")
    if time_budget <= 0:
        raise ConfigError(f"--time-budget must be positive, got {time_budget}")
    _check_quiet_wait(quiet_wait)
    return Protocol(max_repeats=max_repeats, min_repeats=min(10, max_repeats),
                    time_budget_s=time_budget, quiet_wait_s=quiet_wait)


def _rpc(device, tracker, rpc_key, allow_remote, boards=None, tries=3, timeout=300.0,
         emulated=False):
    """The RPC options of a measuring command (None: measure on this machine); an
    unreachable tracker or an unknown key fails here, with one clear line."""
    from dlas_predict.measure.execution.remote import boards_under
    from dlas_predict.measure.execution.rpcopts import rpc_options

    rpc = rpc_options(tracker, rpc_key, device, allow_remote,
                      warn=lambda line: typer.echo(line, err=True), boards=boards,
                      tries=tries, request_timeout_s=timeout, emulated=emulated)
    if rpc is not None:
        boards_under(rpc.host, rpc.port, rpc.key)
    return rpc


def _board_lines(runner) -> None:
    """Per-board progress of a farm run."""
    progress = getattr(runner, "progress", None)
    for p in (progress() if progress else []):
        typer.echo(f"board {p['board']}: {p['done']} measured ({p['failed']} failed), "
                   f"{p['requeued']} given back after the board dropped off, crashed or hung; "
                   f"busy {p['busy_s']:.1f} s", err=True)


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
    quiet_wait: float = _QUIET_WAIT_OPT,
    tuning: str = typer.Option("untuned", "--tuning", help="untuned | tuned | all (tuned: "
                               "MetaSchedule for dense kernels, a knob search for CSR)."),
    trials: int = _TRIALS_OPT, early_stop: int = _EARLY_STOP_OPT,
    tuning_db: Optional[Path] = _TUNING_DB_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per variant."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    tracker: Optional[str] = _TRACKER_OPT, rpc_key: Optional[str] = _RPC_KEY_OPT,
    allow_remote_tracker: bool = _ALLOW_REMOTE_OPT, boards: Optional[int] = _BOARDS_OPT,
    tries: int = _TRIES_OPT,
    emulated: bool = typer.Option(False, "--emulated", help="RPC: the boards are emulators "
                                  "(qemu-user): outputs are verified, timings are labelled "
                                  "emulated and never stored."),
):
    """Measure one conv workload across algorithms × compressions (× tuning) on a device."""
    from dlas_predict.space.config import (Algorithm, Compression, ConvSpec, check_ratio,
                                           variant_grid)
    from dlas_predict.render import format_table
    from dlas_predict.corpus.collect import collect_kernels as run_collect
    from dlas_predict.measure.execution.farm import kernel_runner
    from dlas_predict.measure.execution.runner import MeasureTask
    from dlas_predict.space.devices import get_device

    spec = ConvSpec.parse(conv)
    algorithms = Algorithm.parse_list(algorithm)
    compressions = Compression.parse_list(compression)
    check_ratio(ratio)
    proto = _protocol(max_repeats, time_budget, quiet_wait)
    tunings, opts = _tuning(tuning, trials, early_stop, tuning_db)
    dev = get_device(device)
    if emulated and store is not None:
        raise DlasError("timings on an emulated board are not the device's: the corpus "
                        "refuses them (drop --store)")
    rpc = _rpc(dev, tracker, rpc_key, allow_remote_tracker, boards, tries, timeout, emulated)
    if emulated and rpc is None:
        raise DlasError("--emulated is for boards reached through --tracker")
    variants = [v for t in tunings for v in variant_grid(algorithms, compressions, ratio, t)]
    tasks = [MeasureTask.make(spec, v, dev, tuning=opts) for v in variants]
    db = None
    if store is not None:
        from dlas_predict.corpus.store import CorpusStore

        db = CorpusStore(store)
    log = None if quiet or as_json else (lambda line: typer.echo(line, err=True))
    with kernel_runner(dev, proto, timeout, rpc, log) as runner:
        # measure always measures: nothing is skipped; with --store each record is committed
        # as it arrives.
        results = run_collect(tasks, None, runner, progress=not quiet and not as_json,
                              on_result=db.add if db is not None else None).results
    if log:
        _board_lines(runner)
    order = {t.key: i for i, t in enumerate(tasks)}
    results.sort(key=lambda r: order.get(r.key, 0))
    if db is not None:
        db.close()
    keys = ("algorithm", "compression", "ratio", "sparse", "dtype", "tuning", "median_ms",
            "spread", "n_runs", "gflops", "sparsity", "verified", "max_error", "compile_s",
            "knobs", "tuning_seconds", "trials", "tuner", "error")
    out = [{"conv": spec.to_spec(), "device": dev.name,
            **{k: r.to_dict()[k] for k in keys}} for r in results]
    if emulated:  # an emulator's timings are labelled, never given as the device's figures
        for o in out:
            o["emulated"] = True
            o["emulated_median_ms"] = o.pop("median_ms")
            o["gflops"] = None
    if as_json:
        _print_json(out)
    else:
        where = (f" through {rpc.tracker} (key {rpc.key})" if rpc else "")
        typer.echo(f"{spec.to_spec()}  on {dev.name} ({dev.description}){where}; "
                   f"{spec.macs / 1e6:.1f} M MACs; measured medians")
        rows = [_measure_row(r) for r in results]
        if emulated:
            for row in rows:
                row["emulated ms"] = row.pop("median ms")
                row["GFLOP/s"] = "—"
            typer.echo("boards are emulated: outputs verified there, timings are the "
                       "emulator's, not the device's")
        typer.echo(format_table(rows))
    bad = [r for r in results if not r.ok or r.verified is False]
    if bad:
        _fail(f"{len(bad)} of {len(results)} variants failed or did not verify "
              "(see the error column)")


def _tuning(tuning: str, trials: int, early_stop: int, tuning_db: Optional[Path]):
    """(tunings to measure, tuning options) from the command's options."""
    from dlas_predict.space.config import Tuning
    from dlas_predict.measure.execution.runner import TuningOptions

    tunings = Tuning.parse_list(tuning)
    return tunings, TuningOptions(budget=trials, patience=early_stop,
                                  db=str(tuning_db) if tuning_db else None)


def _measure_row(r) -> dict:
    d = r.to_dict()
    tuned = d["tuning"] == "tuned"
    return {
        "algorithm": d["algorithm"], "compression": d["compression"],
        "ratio": d["ratio"] or "", "dtype": d["dtype"], "sparse": "csr" if d["sparse"] else "",
        "tuning": f"{d['tuner']} ({d['trials']} trials)" if tuned and d["tuner"] else d["tuning"],
        "tuning s": round(d["tuning_seconds"], 1) if d["tuning_seconds"] is not None else "",
        "median ms": None if d["median_ms"] is None else round(d["median_ms"], 4),
        "spread": None if d["spread"] is None else f"{d['spread']:.1%}",
        "runs": d["n_runs"], "GFLOP/s": None if d["gflops"] is None else round(d["gflops"], 1),
        # the chain probe's parallel/serial ratio around the timing: ~1 alone, ~2 when
        # another process held one of 2 cores; the canary kernel's time over its fastest
        "contention": "" if d["contention"] is None else f"{d['contention']:.2f}",
        "slowdown": "" if d["slowdown"] is None else f"{d['slowdown']:.2f}",
        "verified": d["verified"], "max err": None if d["max_error"] is None
        else f"{d['max_error']:.2g}", "error": (d["error"] or "")[:70],
    }


# ---- collect ----------------------------------------------------------------------------
@app.command()
@handle_errors
def collect(
    network: List[str] = typer.Option(..., "--network",
                                      help="ONNX file or zoo:NAME (repeatable)."),
    store: Path = typer.Option(..., "--store", help="Corpus store (SQLite), created if new."),
    device: str = typer.Option("local", "--device", help="Device name (see `devices`)."),
    algorithms: str = typer.Option("all", "--algorithms", help="all | comma list."),
    compressions: str = typer.Option("all", "--compressions", help="all | comma list."),
    ratio: float = typer.Option(0.9, "--ratio", help="Global pruning ratio in (0, 1)."),
    uniform: bool = typer.Option(False, "--uniform",
                                 help="Measure every layer at --ratio instead of at its own "
                                      "sparsity after global pruning."),
    retry_failures: bool = typer.Option(False, "--retry-failures",
                                        help="Measure again what failed before."),
    retime_slow: bool = typer.Option(
        False, "--retime-slow",
        help="Time again what was timed on a slow machine (chain ratio or canary over its "
             "limit); a new timing replaces the stored one only if the machine was quieter."),
    retime_unprobed: bool = typer.Option(
        False, "--retime-unprobed",
        help="As --retime-slow, and also time again what was timed before the probes were "
             "recorded (no reading); a new timing replaces such a record only if the machine "
             "was quiet."),
    whole_network: bool = typer.Option(
        False, "--whole-network",
        help="Also build and time each whole network under every configuration (TVM Relax, "
             "checked against onnxruntime), and run each by onnxruntime too."),
    backends: str = typer.Option(
        "tvm,onnxruntime", "--backends",
        help="tvm | onnxruntime | both (comma list). tvm: our kernels and, with "
             "--whole-network, our builds; onnxruntime: with --whole-network, every "
             "configuration run by onnxruntime (fp32, static QDQ int8, float16), on this "
             "machine's CPU and its native-ISA profiles. onnxruntime alone measures no "
             "kernel."),
    builds_only: bool = typer.Option(
        False, "--builds-only",
        help="With --whole-network: time the whole networks only, not their kernels (after "
             "an engine change); per-layer plans read the kernels already in the store."),
    max_repeats: int = typer.Option(150, "--max-repeats"),
    time_budget: float = typer.Option(3.0, "--time-budget"),
    timeout: float = typer.Option(300.0, "--timeout"),
    quiet_wait: float = _QUIET_WAIT_OPT,
    tuning: str = typer.Option("untuned", "--tuning", help="untuned | tuned | all."),
    trials: int = _TRIALS_OPT, early_stop: int = _EARLY_STOP_OPT,
    tuning_db: Optional[Path] = _TUNING_DB_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    tracker: Optional[str] = _TRACKER_OPT, rpc_key: Optional[str] = _RPC_KEY_OPT,
    allow_remote_tracker: bool = _ALLOW_REMOTE_OPT, boards: Optional[int] = _BOARDS_OPT,
    tries: int = _TRIES_OPT,
):
    """Measure the grid over every unique conv layer of the networks; resumable.

    Pruned networks are pruned globally at --ratio and each layer's kernels are measured at
    that layer's own sparsity."""
    _collect(network, store, device, algorithms, compressions, ratio, retry_failures,
             max_repeats, time_budget, timeout, as_json, quiet, per_layer=not uniform,
             whole_network=whole_network,
             tuning=_tuning(tuning, trials, early_stop, tuning_db), quiet_wait=quiet_wait,
             retime_slow=retime_slow, retime_unprobed=retime_unprobed,
             remote=(tracker, rpc_key, allow_remote_tracker, boards, tries),
             backends=backends, builds_only=builds_only)


@app.command()
@handle_errors
def bundle(networks: List[str] = typer.Argument(..., help="ONNX files or zoo:NAME."),
           device: str = typer.Option(..., "--device", help="A CUDA GPU of the registry."),
           out: Path = typer.Option(..., "--out", help="Bundle directory (resumable)."),
           algorithms: str = typer.Option("all", "--algorithms"),
           compressions: str = typer.Option("all", "--compressions"),
           ratio: float = typer.Option(0.9, "--ratio", help="Global pruning ratio."),
           chunk: int = typer.Option(32, "--chunk", help="Kernels a module."),
           trials: int = typer.Option(0, "--trials", help="Tune: each kernel becomes a "
                                      "measured search of this many candidates (--tuner); "
                                      "the fastest verified one is its tuned record."),
           whole_network: bool = typer.Option(False, "--whole-network", help="Build whole "
                                              "networks instead of kernels: every "
                                              "configuration × algorithm, and the per-layer "
                                              "plan of the device's measured kernels."),
           store: Optional[Path] = typer.Option(None, "--store", help="Whole networks: the "
                                                "corpus whose kernels pick the per-layer "
                                                "plans (default: the device's shipped one)."),
           timing_weights: bool = typer.Option(
               False, "--timing-weights", help="Whole networks: give large weight tensors a "
               "repeating pattern of their own magnitudes (zeros kept: same shapes, masks and "
               "kernels), so big networks fit a small transfer; the check uses the same "
               "weights."),
           tuner: str = typer.Option("knob-search", "--tuner", help="With --trials: "
                                     "knob-search (every kernel) or metaschedule (dense "
                                     "kernels: the hand schedule and trials-1 candidates of "
                                     "one round of MetaSchedule's evolutionary search)."),
           tuning_db: Optional[Path] = typer.Option(
               None, "--tuning-db", help="metaschedule: the tuning database of earlier "
               "rounds (their measured schedules seed and train the search; default: "
               "DLAS_HOME/tuning/DEVICE-FINGERPRINT)."),
           round_no: int = typer.Option(1, "--round", help="metaschedule: the round's number "
                                        "(a search per round, each its own tuned record)."),
           kernel_sizes: str = typer.Option("", "--kernel-sizes", help="Only layers of these "
                                            "kernel sizes R (comma list), e.g. 3.")):
    """Build the CUDA kernels of NETWORKS for a GPU no tracker reaches: measure the bundle
    there with `python -m dlas_predict.measure.gpu.run OUT --out results.jsonl`, then bring the
    results back with `dlas-predict corpus import-results OUT results.jsonl --store S`."""
    from dlas_predict.space.config import Algorithm, Compression, check_ratio
    from dlas_predict.space.devices import get_device
    from dlas_predict.measure.gpu.bundle import save_plans, write_bundle
    from dlas_predict.corpus.gpu import plan_networks

    if chunk < 1:
        raise DlasError(f"--chunk must be >= 1, got {chunk}")
    if trials < 0 or trials == 1:
        raise DlasError(f"--trials must be 0 (untuned) or at least 2, got {trials}")
    dev = get_device(device, with_target=False)
    if timing_weights and not whole_network:
        raise DlasError("--timing-weights applies to whole networks: add --whole-network")
    from dlas_predict.measure.records import KNOB_SEARCH, METASCHEDULE

    if tuner not in (KNOB_SEARCH, METASCHEDULE):
        raise DlasError(f"--tuner must be {KNOB_SEARCH} or {METASCHEDULE}, got {tuner!r}")
    try:
        sizes = tuple(int(x) for x in kernel_sizes.split(",") if x.strip())
    except ValueError:
        raise DlasError(f"--kernel-sizes takes integers, got {kernel_sizes!r}") from None
    if any(r < 1 for r in sizes) or round_no < 1:
        raise DlasError("--kernel-sizes and --round must be positive")
    if tuner == METASCHEDULE:
        if trials < 2 or whole_network:
            raise DlasError("--tuner metaschedule tunes kernels: give --trials of at least 2 "
                            "and no --whole-network")
        from dlas_predict.measure.gpu.bundle import write_metaschedule_bundle
        from dlas_predict.corpus.gpu import dense_kernels

        kernels = dense_kernels(networks, Algorithm.parse_list(algorithms),
                                Compression.parse_list(compressions), check_ratio(ratio),
                                sizes)
        if not kernels:
            raise DlasError("no dense kernel to tune: MetaSchedule cannot sample CSR kernels "
                            "(use --tuner knob-search)")
        from dlas_predict.paths import tuning_db_dir

        counts = write_metaschedule_bundle(
            kernels, dev, out, trials, tuning_db or tuning_db_dir(dev.name, dev.fingerprint),
            round_no, log=lambda s: typer.echo(s, err=True))
        typer.echo(f"{counts['searches']} MetaSchedule searches: {counts['built']} kernels "
                   f"built, {counts['failed']} failed to build, {counts['skipped']} searches "
                   f"already in {out}")
        return
    if whole_network:
        _bundle_networks(networks, dev, out, Algorithm.parse_list(algorithms),
                         Compression.parse_list(compressions), check_ratio(ratio), store,
                         timing_weights)
        return
    tasks, plans = plan_networks(networks, Algorithm.parse_list(algorithms),
                                 Compression.parse_list(compressions), check_ratio(ratio), dev,
                                 trials=trials, kernel_sizes=sizes)
    out.mkdir(parents=True, exist_ok=True)
    save_plans(out, plans)
    counts = write_bundle(tasks, dev, out, chunk, log=lambda s: typer.echo(s, err=True))
    typer.echo(f"{counts['built']} kernels built, {counts['failed']} failed to build, "
               f"{counts['skipped']} already in {out}")


@app.command()
@handle_errors
def tune(
    network: List[str] = typer.Option(..., "--network",
                                      help="ONNX file or zoo:NAME (repeatable)."),
    device: str = typer.Option("local", "--device", help="Device name (see `devices`)."),
    trials: int = _TRIALS_OPT, early_stop: int = _EARLY_STOP_OPT,
    tuning_db: Optional[Path] = _TUNING_DB_OPT,
    store: Optional[Path] = typer.Option(None, "--store", help="Corpus store the tuned "
                                         "records go to (default: DLAS_HOME/corpus.sqlite)."),
    algorithms: str = typer.Option("all", "--algorithms", help="all | comma list."),
    compressions: str = typer.Option("all", "--compressions", help="all | comma list."),
    ratio: float = typer.Option(0.9, "--ratio", help="Global pruning ratio in (0, 1)."),
    retry_failures: bool = typer.Option(False, "--retry-failures"),
    max_repeats: int = typer.Option(150, "--max-repeats"),
    time_budget: float = typer.Option(3.0, "--time-budget"),
    quiet_wait: float = _QUIET_WAIT_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    tracker: Optional[str] = _TRACKER_OPT, rpc_key: Optional[str] = _RPC_KEY_OPT,
    allow_remote_tracker: bool = _ALLOW_REMOTE_OPT, boards: Optional[int] = _BOARDS_OPT,
    tries: int = _TRIES_OPT,
    timeout: float = typer.Option(300.0, "--timeout", help="RPC: seconds to wait for a free "
                                  "board."),
):
    """Auto-schedule every unique conv layer of the networks: MetaSchedule for dense kernels,
    a measured knob search for CSR kernels. Resumable: what the store or the tuning database
    already holds is not tuned again."""
    from dlas_predict.paths import default_store_path

    _collect(network, store or default_store_path(), device, algorithms, compressions, ratio,
             retry_failures, max_repeats, time_budget, timeout, as_json, quiet,
             tuning=_tuning("tuned", trials, early_stop, tuning_db), quiet_wait=quiet_wait,
             remote=(tracker, rpc_key, allow_remote_tracker, boards, tries))


def _backends(text: str) -> tuple[str, ...]:
    """``tvm``, ``onnxruntime`` or both, from a comma list."""
    allowed = ("tvm", "onnxruntime")
    got = [b.strip().lower() for b in str(text).split(",") if b.strip()]
    bad = [b for b in got if b not in allowed]
    if bad or not got:
        raise DlasError(f"unknown backend {(bad or [text])[0]!r}; backends: "
                        + ", ".join(allowed))
    return tuple(b for b in allowed if b in got)


def _collect(networks, store, device, algorithms, compressions, ratio, retry_failures,
             max_repeats, time_budget, timeout, as_json, quiet, per_layer=True,
             whole_network=False, tuning=None, quiet_wait=30.0, retime_slow=False,
             retime_unprobed=False, remote=(None, None, False, None, 3), backends="tvm",
             builds_only=False):
    """Wire the runners (this machine's, or a farm of boards) into
    :func:`dlas_predict.corpus.collect.collect`; render."""
    from dlas_predict.corpus.collect import collect as run_collect
    from dlas_predict.measure.execution.farm import kernel_runner, network_runner
    from dlas_predict.space.config import Algorithm, Compression, Tuning, check_ratio
    from dlas_predict.space.devices import get_device

    algs = Algorithm.parse_list(algorithms)
    comps = Compression.parse_list(compressions)
    check_ratio(ratio)
    proto = _protocol(max_repeats, time_budget, quiet_wait)
    tunings, opts = tuning or ([Tuning.UNTUNED], None)
    dev = get_device(device)
    rpc = _rpc(dev, *remote, timeout)
    chatty = not quiet and not as_json
    log = (lambda line: typer.echo(line, err=True)) if chatty else None
    whole = ((lambda: network_runner(dev, proto, max(timeout, 600.0), rpc, log))
             if whole_network else None)
    chosen = _backends(backends)
    if builds_only and not whole_network:
        raise DlasError("--builds-only times whole networks: add --whole-network")
    if "onnxruntime" in chosen and not whole_network:
        if chosen == ("onnxruntime",):
            raise DlasError("--backends onnxruntime times whole networks: add --whole-network")
        chosen = ("tvm",)
    if "onnxruntime" in chosen:
        from dlas_predict.measure.networks.runner import onnxruntime_unsupported

        why = onnxruntime_unsupported(dev, rpc)
        if why and chosen == ("onnxruntime",):
            raise DlasError(why)
        if why:
            chosen = ("tvm",)
            if log:
                log(f"note: {why}; only our builds are timed")
    with kernel_runner(dev, proto, timeout, rpc, log) as runner:
        rep = run_collect(networks, store, dev, runner, algs, comps, ratio, tunings, opts,
                          per_layer=per_layer, retry_failures=retry_failures,
                          retime_slow=retime_slow, retime_unprobed=retime_unprobed,
                          network_runner=whole, backends=chosen, kernels=not builds_only,
                          progress=chatty, log=log)
    if chatty:
        _board_lines(runner)
    summary = rep.kernels
    if as_json:
        _print_json(rep.to_dict())
    else:
        typer.echo(f"measured {summary.measured} ({summary.failed} failed), skipped "
                   f"{summary.skipped} already in the store, in {summary.seconds:.1f} s; "
                   f"store {store} now holds {rep.records} records")
        if summary.contended:
            typer.echo(f"{summary.contended} kernels were timed on a slow machine after "
                       f"waiting {proto.quiet_wait_s:g} s (another process on a core: chain "
                       f"ratio over {proto.contention_limit:g}, or the canary kernel over "
                       f"{proto.slowdown_limit:g}× its fastest); their records carry both "
                       "(columns contention, slowdown)")
        if rep.network_contended:
            typer.echo(f"{rep.network_contended} whole networks were timed on a slow machine; "
                       "their records carry both probes (contention, slowdown)")
        if retime_slow or retime_unprobed:
            typer.echo(f"timed again on a slow (or unprobed) machine's records: "
                       f"{summary.retimed} kernels and {rep.network_retimed} whole networks "
                       f"now timed quieter; {summary.kept} kernels and {rep.network_kept} "
                       "whole networks no quieter (the stored timing kept)")
        if summary.contended or rep.network_contended:
            typer.echo("time them again later with --retime-slow")
    if rep.failed:
        _fail(f"{summary.failed} kernels and {rep.network_failures} whole networks failed; "
              f"each failure is recorded with its error (dlas-predict corpus stats --store "
              f"{store})")
    return summary


# ---- networks ---------------------------------------------------------------------------
@app.command()
@handle_errors
def layers(model: str = typer.Argument(..., help="ONNX file or zoo:NAME."),
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Every layer of a network: op, shapes, MACs, parameters, bytes moved; and totals."""
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network
    from dlas_predict.render import format_table

    path = zoo.resolve(model)
    net = read_network(path, name=model.removeprefix(zoo.ZOO_PREFIX))
    if as_json:
        _print_json(net.to_dict())
        return
    rows = [{"#": l.index, "name": l.name[:40], "op": l.op, "kind": l.kind,
             "input": "×".join(map(str, l.input_shapes[0])) if l.input_shapes else "",
             "output": "×".join(map(str, l.output_shape)), "MACs": l.macs,
             "params": l.params, "bytes": l.bytes_moved} for l in net.layers]
    typer.echo(format_table(rows))
    t = net.totals()
    typer.echo(f"\n{net.name}: {len(net.layers)} layers ({t['conv_layers']} conv), "
               f"{t['params'] / 1e6:.2f} M params, {t['macs'] / 1e6:.1f} M MACs, "
               f"{t['bytes'] / 1e6:.1f} MB moved (fp32, batch {net.batch})")


@app.command("zoo")
@handle_errors
def zoo_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """The study's eight networks, their published size and their weights."""
    from dlas_predict.networks import zoo
    from dlas_predict.render import format_table

    entries = [e.to_dict() for e in zoo.ZOO.values()]
    if as_json:
        _print_json(entries)
        return
    typer.echo(format_table([{
        "name": e["name"], "dataset": e["dataset"],
        "input": "×".join(map(str, e["input_shape"])), "classes": e["num_classes"],
        "paper params": f"{e['paper_params'] / 1e6:.1f} M",
        "paper MACs": f"{e['paper_macs'] / 1e6:.0f} M", "weights": e["weights"],
    } for e in entries]))
    typer.echo("\nUse zoo:NAME wherever a model is expected; `dlas-predict layers zoo:NAME` "
               "prints the measured size.")


@app.command()
@handle_errors
def export(name: str = typer.Argument(..., help="Zoo network (NAME or zoo:NAME)."),
           out: Path = typer.Option(..., "-o", "--out", help="ONNX file to write."),
           compression: str = typer.Option("dense", "--compression",
                                           help="dense | weight_pruning | channel_pruning | "
                                                "float16 | int8"),
           ratio: Optional[float] = typer.Option(None, "--ratio", help="Pruning ratio [0, 1)."),
           remove_channels: bool = typer.Option(False, "--remove-channels",
                                                help="channel_pruning: remove the zeroed "
                                                     "channels (a smaller dense network)."),
           finetune_epochs: int = typer.Option(0, "--finetune-epochs")):
    """Export a zoo network (optionally compressed) to ONNX."""
    import onnx

    from dlas_predict.compression import accuracy
    from dlas_predict.networks import zoo

    model = name if name.startswith(zoo.ZOO_PREFIX) else zoo.ZOO_PREFIX + name
    zoo.get(model)
    if compression == "dense" and not remove_channels:
        path = zoo.export(model, out)
    else:
        calib = None
        if compression == "int8":
            calib = accuracy.load_data("digits", zoo.get(model).input_shape, "train").x[:128]
        prep = accuracy.prepare(model, compression, ratio, remove_channels, finetune_epochs,
                                calib)
        out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(prep.compressed.model, str(out))
        path = out
        for note in prep.compressed.notes:
            typer.echo(note)
    typer.echo(f"wrote {path}")


@app.command()
@handle_errors
def generate(family: str = typer.Argument(..., help="fc | cnn | nasbench201"),
             param: List[str] = typer.Option([], "--param", help="NAME=V1,V2,.. (repeatable; "
                                             "fc and cnn)"),
             arch: List[str] = typer.Option([], "--arch", help="nasbench201: an architecture "
                                            "string |op~0|+|op~0|op~1|+|op~0|op~1|op~2| "
                                            "(repeatable)."),
             index_file: Optional[Path] = typer.Option(None, "--index-file", help="nasbench201:"
                                                       " architectures one a line (strings, or "
                                                       "benchmark indices)."),
             out: Path = typer.Option(..., "-o", "--out", help="Output directory.")):
    """ParaDnn-style sweep (fc, cnn): one ONNX file per grid point, named by its parameters;
    or NAS-Bench-201 networks from their architecture strings."""
    if family == "nasbench201":
        from dlas_predict.networks import nasbench201 as nb

        if param:
            _fail("nasbench201 takes --arch or --index-file, not --param")
        if not arch and index_file is None:
            _fail("nasbench201 needs --arch STR or --index-file FILE")
        archs = [nb.parse_arch(a) for a in arch]
        if index_file is not None:
            from dlas_predict.crossdev.sources import help_arch_strings

            archs += nb.read_index_file(index_file, help_arch_strings)
        for path in nb.generate(archs, out):
            typer.echo(str(path))
        typer.echo(f"wrote {len(set(archs))} NAS-Bench-201 network(s) to {out}", err=True)
        return
    if arch or index_file is not None:
        _fail("--arch and --index-file are for nasbench201")
    from dlas_predict.networks.generate import FAMILIES, generate as run

    written = run(family, list(param), out)
    for m in written:
        typer.echo(str(m.path))
    defaults = ", ".join(f"{k}={v}" for k, v in FAMILIES[family].items())
    typer.echo(f"wrote {len(written)} model(s) to {out} (defaults: {defaults})", err=True)


@app.command("accuracy")
@handle_errors
def accuracy_cmd(
    model: str = typer.Argument(..., help="ONNX file or zoo:NAME."),
    data: str = typer.Option("digits", "--data", help="digits | PATH (.npz or image folder)."),
    compression: str = typer.Option("dense", "--compression",
                                    help="dense | weight_pruning | channel_pruning | float16 "
                                         "| int8"),
    ratio: Optional[float] = typer.Option(None, "--ratio", help="Pruning ratio [0, 1)."),
    remove_channels: bool = typer.Option(False, "--remove-channels"),
    finetune_epochs: int = typer.Option(0, "--finetune-epochs",
                                        help="Fine-tune the pruned zoo network (digits train "
                                             "split, masks held)."),
    curve: bool = typer.Option(False, "--curve", help="Accuracy-vs-ratio curves for both "
                               "pruning kinds, with the elbow ratio of each."),
    ratios: str = typer.Option(",".join(map(str, DEFAULT_CURVE_RATIOS)), "--ratios",
                               help="Curve ratios."),
    elbow_drop: float = typer.Option(ELBOW_DROP_PP, "--elbow-drop",
                                     help="Elbow rule: a drop of more than this many "
                                          "percentage points is significant."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Measured top-1 of a (compressed) model; without labels, the fidelity proxy."""
    from dlas_predict.compression import accuracy
    from dlas_predict.render import format_table

    log = None if as_json else (lambda s: typer.echo(s, err=True))
    if not curve:
        res = accuracy.measure(model, data, compression, ratio, finetune_epochs,
                               remove_channels, log=log)
        if as_json:
            _print_json(res.to_dict())
            return
        what = res.compression + (f" at ratio {res.ratio}" if res.ratio is not None else "")
        label = "top-1" if res.metric == "top1" else "fidelity proxy (top-1 agreement with " \
                                                     "the uncompressed model; no labels)"
        typer.echo(f"{res.model}, {what}: {label} {res.value:.2%} on {res.n_samples} samples "
                   f"of {res.data} (measured)")
        if res.reference_top1 is not None:
            typer.echo(f"uncompressed: {res.reference_top1:.2%}; drop "
                       f"{(res.reference_top1 - res.value) * 100:.2f} points")
        if res.uncalibrated is not None:
            typer.echo(f"int8 before calibration (ranges from one random input): "
                       f"{res.uncalibrated:.2%}")
        typer.echo(f"weights: {res.weights}")
        for note in res.notes:
            typer.echo(f"note: {note}")
        return
    rep = accuracy.pruning_curves(model, ratios, data, finetune_epochs, elbow_drop, log=log)
    if as_json:
        _print_json(rep.to_dict())
        return
    curves, elbows, reference, metric, grid = (rep.curves, rep.elbows, rep.reference,
                                               rep.metric, rep.ratios)
    rows = [{"ratio": r, **{k: f"{curves[k][i].value:.2%}" for k in curves}}
            for i, r in enumerate(grid)]
    typer.echo(f"{metric} (measured) on {curves['weight_pruning'][0].data}; uncompressed: "
               + (f"{reference:.2%}" if reference is not None else "n/a (proxy)")
               + (f"; fine-tuned {finetune_epochs} epochs" if finetune_epochs else ""))
    typer.echo(format_table(rows))
    for k, r in elbows.items():
        typer.echo(f"elbow ({k}): " + (f"ratio {r}" if r is not None else
                                       "none (the lowest ratio already drops)")
                   + f" — the highest ratio within {elbow_drop} points of the uncompressed")


# ---- cost models ------------------------------------------------------------------------


@app.command()
@handle_errors
def train(store: Path = typer.Option(..., "--store", help="Corpus store to learn from."),
          device: str = typer.Option("local", "--device"),
          out: Optional[Path] = typer.Option(None, "--out",
                                             help="Model directory (default: "
                                                  "models_store/DEVICE, or models_store/"
                                                  "machines/FINGERPRINT/DEVICE where the "
                                                  "corpus's machine has one)."),
          seed: int = typer.Option(0, "--seed"),
          only: Optional[str] = typer.Option(None, "--only",
                                             help="onnxruntime: fit only the onnxruntime "
                                                  "model, leaving the others as they are."),
          as_json: bool = typer.Option(False, "--json")):
    """Train the cost models on a corpus: the layer model (LightGBM, 80 % interval), and,
    from the store's whole-network measurements, the network residual model (and the
    onnxruntime model from its onnxruntime records)."""
    from dlas_predict.models.train import train as run

    if only not in (None, "onnxruntime"):
        raise DlasError(f"--only takes onnxruntime, got {only!r}")
    report = run(store, device, out, seed, only_onnxruntime=only == "onnxruntime")
    if as_json:
        _print_json(report.to_dict())
        return
    if report.onnxruntime_model:
        lono = "; ".join(f"{m} MAPE {v['mape']:.1%}, within ±10 % {v['within_10pct']:.0%}, "
                         f"±25 % {v['within_25pct']:.0%} ({v['networks']} networks)"
                         for m, v in report.onnxruntime_lono.items())
        typer.echo(f"onnxruntime model: {report.onnxruntime_records} whole networks run by "
                   f"onnxruntime → {report.onnxruntime_model}; leave-one-network-out: {lono}")
        if not report.kernels:
            return
    if report.tuning_model:
        typer.echo(f"tuning-time model: {report.tuned_records} tuned kernels "
                   f"({report.tuning_hours:.2f} h of search), fit MAPE "
                   f"{report.tuning_mape:.1%} → {report.tuning_model}")
    typer.echo(f"trained on {report.kernels} kernels of {report.device} in "
               f"{report.train_seconds} s → {report.model}")
    typer.echo(f"fit on the training data (not a held-out figure; see `evaluate`): MAPE "
               f"{report.mape:.1%}, within ±10 % {report.within_10pct:.1%}, 80 % "
               f"interval covers {report.interval_coverage:.1%}")
    if report.whole_networks:
        typer.echo(f"network residual model: {report.whole_networks} whole-network "
                   f"measurements of {report.networks} networks → {report.network_model}")
    else:
        typer.echo("no whole-network measurements in the store: no network model (recommend "
                   "then sums the predicted conv kernels, a lower bound; collect whole "
                   "networks with `dlas-predict collect --whole-network`)")


@app.command()
@handle_errors
def evaluate(store: Optional[Path] = typer.Option(None, "--store", help="Corpus store "
                                                  "(leave-one-network-out)."),
             device: Optional[str] = typer.Option(None, "--device", help="The device "
                                                  "evaluated (default local); with "
                                                  "--leave-one-device-out, the one held out "
                                                  "(default: each in turn)."),
             seed: int = typer.Option(0, "--seed"),
             lodo: bool = typer.Option(False, "--leave-one-device-out",
                                       help="Hold out each device of --source in turn and "
                                            "predict it from the others and N of its own "
                                            "measurements."),
             source: Optional[str] = typer.Option(None, "--source", help="help | tophub | "
                                                  "profiles (default: help at network "
                                                  "level, profiles at kernel level)."),
             level: str = typer.Option("kernel", "--level", help="kernel | network"),
             shots: Optional[str] = typer.Option(None, "--shots", help="Comma-separated "
                                                 "measurement counts (default 0,5,10,20,50)."),
             draws: int = typer.Option(5, "--draws", help="Random draws of the shots."),
             data: Optional[Path] = typer.Option(None, "--data", help="Folder of the public "
                                                 "data (default $DLAS_SHARED_DATA, else the "
                                                 "public data folder beside the checkout)."),
             as_json: bool = typer.Option(False, "--json")):
    """Leave-one-network-out: the cost model against the roofline and MACs baselines; or
    leave-one-device-out (--leave-one-device-out): the cross-device model by shots."""
    if lodo:
        return _evaluate_devices(source, level, shots, draws, data, device, seed, as_json)
    if store is None:
        _fail("--store is needed (or --leave-one-device-out)")
    from dlas_predict.models.evaluation import MODELS, WHOLE_MODELS, evaluate_store
    from dlas_predict.render import format_table

    ev = evaluate_store(store, device or "local", seed)
    if as_json:
        _print_json(ev.to_dict())
        return
    report, whole = ev.kernels, ev.whole
    typer.echo(f"leave-one-network-out on {report.device}; configurations are compression "
               f"× algorithm, latency = {report.scope}; measured vs predicted")
    typer.echo(format_table(_score_rows(report, MODELS)))
    if whole is None:
        typer.echo("\nno whole-network evaluation: it needs whole-network measurements of at "
                   "least three networks (`dlas-predict collect --whole-network`)")
        return
    typer.echo(f"\nleave-one-network-out over {ev.whole_measurements} measured {whole.scope}: "
               "the held-out network's kernels and whole measurements are unseen in training; "
               "top-3 gap = best measured of the predicted top 3 / best measured; "
               "measured_conv+residual is no predictor: the network model on the held-out "
               "network's measured kernels, what a perfect layer model would reach")
    typer.echo(format_table(_score_rows(whole, WHOLE_MODELS)))


def _evaluate_devices(source, level, shots, draws, data, device, seed, as_json) -> None:
    from dlas_predict.crossdev.evaluate import evaluate_devices
    from dlas_predict.render import format_table

    log = None if as_json else (lambda m: typer.echo(m, err=True))
    rep = evaluate_devices(source, level, shots, draws, data, device, seed, log)
    if as_json:
        _print_json(rep.to_dict())
        return
    pct = (lambda v: "—" if v is None else f"{v:.0%}")
    rows = []
    for h in rep.devices:
        for n, sc in h.by_shots.items():
            b = h.macs[n]
            rows.append({"held out": h.device, "shots": n, "targets": h.measured,
                         "Spearman": f"{sc.spearman:.3f}", "Kendall τ": f"{sc.kendall:.3f}",
                         "MAPE": pct(sc.mape), "within ±10%": pct(sc.within_10pct),
                         "within ±25%": pct(sc.within_25pct),
                         "MACs Spearman": f"{b.spearman:.3f}",
                         "MACs ±10%": pct(b.within_10pct)})
        if h.roofline is not None:
            rows.append({"held out": h.device, "shots": "roofline (spec)",
                         "Spearman": f"{h.roofline.spearman:.3f}",
                         "MAPE": pct(h.roofline.mape),
                         "within ±10%": pct(h.roofline.within_10pct)})
        c = h.ceiling
        rows.append({"held out": h.device, "shots": "ceiling (own data, 5-fold)",
                     "Spearman": f"{c.spearman:.3f}", "Kendall τ": f"{c.kendall:.3f}",
                     "MAPE": pct(c.mape), "within ±10%": pct(c.within_10pct),
                     "within ±25%": pct(c.within_25pct)})
    typer.echo(f"leave-one-device-out on {rep.source} ({rep.level} level): each device "
               f"predicted from the others and N of its own measurements (random, "
               f"{rep.draws} draws, seed {seed}); 0 shots = zero-shot from the device's "
               "spec (or the mean device where it has none); MACs: log-linear fit on the "
               "shots")
    typer.echo(format_table(rows))
    means = "; ".join(f"{n} shots {rep.mean('model', n):.3f} (MACs {rep.mean('macs', n):.3f})"
                      for n in rep.shots)
    typer.echo(f"\nmean Spearman: {means}")


@app.command()
@handle_errors
def predict(targets: List[str] = typer.Argument(..., help="conv:C=..,H=..,W=..,K=..,R=..,S=.."
                                                "[,stride=..][,pad=..][,groups=..], "
                                                "nasbench201:ARCH, or a `generate "
                                                "nasbench201` file."),
            device: str = typer.Option(..., "--device", help="Any registry device, a HELP "
                                       "device, or one `adapt` fitted."),
            config: Optional[str] = typer.Option(None, "--config", help="COMPRESSION[@RATIO]"
                                                 "[/ALGORITHM][/tuned]; an omitted part: the "
                                                 "fastest predicted."),
            data: Optional[Path] = typer.Option(None, "--data", help="Folder of the public "
                                                "data (default $DLAS_SHARED_DATA, else the "
                                                "public data folder beside the checkout)."),
            as_json: bool = typer.Option(False, "--json")):
    """Batch prediction on any device from the cross-device models: the latency, its 80 %
    interval and where it comes from (trained, adapted or zero-shot)."""
    from dlas_predict.recommend.predict import predict as run
    from dlas_predict.render import format_table

    preds = run(list(targets), device, config, data)
    if as_json:
        _print_json([{k: v for k, v in p.to_dict().items() if k != "basis"} for p in preds])
        return
    typer.echo(format_table([{"target": p.target, "config": p.config,
                              "predicted ms": f"{p.predicted_ms:.4g}",
                              "80% interval": f"{p.low_ms:.4g}–{p.high_ms:.4g}",
                              "source": p.source, "model": p.basis} for p in preds]))
    if any(p.source == "zero-shot" for p in preds):
        typer.echo(f"zero-shot: {device} has no measurement here; `dlas-predict adapt --device "
                   f"{device} --measurements FILE.csv` (or active-learn) makes it better")


@app.command()
@handle_errors
def adapt(device: str = typer.Option(..., "--device", help="A registry device, or a new "
                                     "name (registered by its measurements alone)."),
          measurements: Path = typer.Option(..., "--measurements", help="CSV: target, "
                                            "config (default dense), latency_ms."),
          data: Optional[Path] = typer.Option(None, "--data", help="Folder of the public "
                                              "data."),
          as_json: bool = typer.Option(False, "--json")):
    """Few-shot calibration: fit a device's loading on latencies measured on it, in any
    runtime; saved under DLAS_HOME (never over the shipped models)."""
    from dlas_predict.recommend.predict import adapt as run

    rep = run(device, measurements, data)
    if as_json:
        _print_json(rep.__dict__)
        return
    what = "new device, known by these measurements alone" if rep.registered else "registry device"
    typer.echo(f"adapted {rep.device} ({what}) on {rep.rows} measurement(s), against "
               f"{rep.source}; saved {rep.path}")
    typer.echo(f"fitted {rep.parameters}: " + ", ".join(f"{v:.3f}" for v in rep.loading))
    typer.echo(f"expected error (leave-one-out over your rows): Spearman "
               f"{rep.loo_spearman:.3f}, median error {rep.loo_median_error:.0%}")


@app.command("active-learn")
@handle_errors
def active_learn(device: str = typer.Option(..., "--device", help="The device to learn."),
                 budget: int = typer.Option(..., "--budget", help="Kernel measurements."),
                 network: List[str] = typer.Option([], "--network", help="The networks that "
                                                   "matter (ONNX or zoo:NAME; repeatable; "
                                                   "with --replay of a snapshot, default: "
                                                   "its networks)."),
                 replay: Optional[Path] = typer.Option(None, "--replay", help="Recorded "
                                                       "measurements instead of the device: "
                                                       "a snapshot .parquet, a store .sqlite "
                                                       "or a CSV (target,config,latency_ms)."),
                 target_interval: Optional[float] = typer.Option(
                     None, "--target-interval", help="Stop when every plan's 80 % interval "
                     "is narrower than this high/low ratio (e.g. 1.2)."),
                 plot: Optional[Path] = typer.Option(None, "--plot", help="Learning curve PNG "
                                                     "(default DLAS_HOME/active-learn/DEVICE"
                                                     ".png)."),
                 criterion: str = typer.Option("variance", "--criterion", help="variance (the "
                                               "expected drop of the plans' variance) | "
                                               "uncertainty (interval width × share) | "
                                               "random."),
                 random_runs: int = typer.Option(3, "--random-runs", help="--replay: runs of "
                                                 "the random baseline (seeds 0..N-1)."),
                 seed: int = typer.Option(0, "--seed"),
                 store: Optional[Path] = typer.Option(None, "--store", help="Live: also record "
                                                      "each measurement into this corpus."),
                 max_repeats: int = typer.Option(150, "--max-repeats"),
                 time_budget: float = typer.Option(3.0, "--time-budget"),
                 timeout: float = typer.Option(300.0, "--timeout"),
                 quiet_wait: float = _QUIET_WAIT_OPT,
                 tracker: Optional[str] = _TRACKER_OPT, rpc_key: Optional[str] = _RPC_KEY_OPT,
                 allow_remote_tracker: bool = _ALLOW_REMOTE_OPT,
                 as_json: bool = typer.Option(False, "--json")):
    """Measure the kernels that most reduce the uncertainty about your networks, refit, and
    repeat; draws the learning curve against random choice (with --replay)."""
    import numpy as np

    from dlas_predict.recommend import active

    log = None if as_json else (lambda m: typer.echo(m, err=True))
    if replay is not None:
        if store is not None or tracker:
            _fail("--replay measures nothing: drop --store and --tracker")
        rep = active.learn_replay(device, replay, list(network), budget, criterion, seed,
                                  target_interval, random_runs, plot, log)
    else:
        from dlas_predict.measure.execution.farm import kernel_runner
        from dlas_predict.space.devices import get_device

        dev = get_device(device)
        proto = _protocol(max_repeats, time_budget, quiet_wait)
        rpc = _rpc(dev, tracker, rpc_key, allow_remote_tracker, None, 3, timeout)
        if rpc is None and not dev.measured_here:
            _fail(f"{device} is measured through a tracker: pass --tracker HOST:PORT (or "
                  "--replay recorded measurements)")
        rep = active.learn_live(device, list(network),
                                lambda: kernel_runner(dev, proto, timeout, rpc, log), budget,
                                criterion, seed, target_interval, store, plot, log)
    if as_json:
        _print_json(rep.to_dict())
        return
    last = rep.main.steps[-1]
    typer.echo(f"{device}: {last.measured} kernel measurements (reference model "
               f"{rep.main.reference}); plans' mean 80% interval ×{last.mean_interval:.2f}")
    if rep.replayed:
        for name, runs in rep.curves.items():
            reach = [c.first_reaching(0.9) for c in runs]
            final = np.mean([c.steps[-1].within_10pct for c in runs])
            typer.echo(f"  {name:12s} plans within ±10%: {final:.0%} after {last.measured}; "
                       "90% reached after "
                       + ", ".join("never" if r is None else str(r) for r in reach))
    if rep.failed:
        typer.echo(f"{len(rep.failed)} kernels failed to measure and were skipped: "
                   + "; ".join(f"{k}: {e}" for k, e in list(rep.failed.items())[:3]))
    typer.echo(f"learning curve: {rep.plot}")
    from dlas_predict.crossdev.transfer import own_model

    typer.echo(f"saved the adapted map: {rep.saved} ("
               + (f"{device} has trained models, which recommend uses; the map is kept for "
                  "reference" if own_model(device) else
                  f"recommend --device {device} uses it") + ")")


@app.command()
@handle_errors
def calibrate(device: str = typer.Option("local", "--device", help="This machine's CPU or "
                                         "one of its profiles."),
              minutes: float = typer.Option(5.0, "--minutes", help="Time budget: about 55 % "
                                            "for kernels, the rest for whole networks."),
              network: List[str] = typer.Option([], "--network", help="Networks whose "
                                                "kernels and builds to measure (ONNX or "
                                                "zoo:NAME; repeatable; default: the demo "
                                                "CNN, resnet18-cifar, mobilenetv2-cifar)."),
              as_json: bool = typer.Option(False, "--json")):
    """This CPU calibrated in minutes: kernels by active learning, then whole networks of
    both backends; recommend and predict then answer for it as adapted. Resumable."""
    import numpy as np

    from dlas_predict.recommend import calibrate as cal

    rep = cal.run(device, minutes, list(network) or None,
                  log=lambda m: typer.echo(m, err=True))
    if as_json:
        _print_json(rep.to_dict())
        return
    typer.echo(f"{device} calibrated on {rep.cpu_model} (fingerprint {rep.fingerprint}) in "
               f"{rep.seconds / 60:.1f} min: {rep.kernels} kernels (reference "
               f"{rep.reference}), {len(rep.network_rows)} whole-network runs")
    for label, loo, offs in (("our builds", rep.network_loo, rep.network_offsets),
                             ("onnxruntime", rep.onnxruntime_loo, rep.onnxruntime_offsets)):
        if offs:
            err = np.abs(np.expm1(np.asarray(loo))) if loo else np.array([])
            typer.echo(f"  {label}: offsets " + ", ".join(
                f"{k} ×{np.exp(v):.2f}" for k, v in offs.items())
                + (f"; leave-one-out within ±10 %: {np.mean(err <= 0.1):.0%} of {len(err)}"
                   if len(err) else ""))
    for n in rep.notes:
        typer.echo(f"note: {n}")
    typer.echo(f"saved: {rep.saved} (measurements: {rep.memo}); `recommend` and `predict` "
               f"on {device} use it")


def _score_rows(report, models) -> list[dict]:
    """One table row per (held-out network or OVERALL, model) of an evaluation report."""
    pct = (lambda v, f: "—" if v is None else format(v, f))
    rows = []
    for net, scores, n in [*((k, h.scores, h.configurations) for k, h in report.networks.items()),
                           ("OVERALL", report.overall, "")]:
        for m in models:
            r = scores[m]
            row = {"held out": net, "model": m, "configs": n}
            if r.layer_mape is not None:
                row["layer MAPE"] = f"{r.layer_mape:.1%}"
            row.update({"MAPE": pct(r.mape, ".1%"), "within ±10%": pct(r.within_10pct, ".0%"),
                        "Kendall τ": f"{r.kendall_tau:.2f}", "top-1 hit": f"{r.top1_hit:.0%}",
                        "regret": f"{r.regret:.3f}"})
            if r.top3_gap is not None:
                row["top-3 gap"] = f"{r.top3_gap:.3f}"
            rows.append(row)
    return rows


# ---- recommend --------------------------------------------------------------------------
def _network_runner(device: str, rpc=None, quiet_wait: float = 30.0):
    """A factory of the whole-network runner that validates on ``device``: this machine
    (or its profile), or the boards of ``rpc``, waiting up to ``quiet_wait`` s for quiet."""
    from dlas_predict.space.devices import get_device

    dev = get_device(device, with_target=False)
    if rpc is None and not dev.measured_here:
        return None  # recommend refuses to validate elsewhere, with the reason

    def make():
        from dlas_predict.measure.execution.farm import network_runner
        from dlas_predict.measure.execution.tasks import Protocol

        log = lambda line: typer.echo(line, err=True)  # noqa: E731
        return network_runner(get_device(device), Protocol(quiet_wait_s=quiet_wait), 600.0,
                              rpc, log)

    return make


def _show_recommendation(rec, top: int, max_accuracy_drop: float) -> None:
    """Print a recommendation as a table with its sources; exit 1 if a validation failed."""
    from dlas_predict.render import format_table

    ms = (lambda s: "—" if s is None or s != s else f"{s * 1e3:.2f}")
    shown = rec.candidates[:max(top, len(rec.validated))]
    ref = rec.reference
    ref_pred = ref.predicted_s if ref is not None and ref.predicted_s == ref.predicted_s \
        else None
    base = ref_pred or rec.dense_baseline_s
    rows = []
    listed = shown + ([ref] if ref is not None and ref not in shown else [])
    for i, c in enumerate(listed, 1):
        row = {"#": "ref" if c is ref and c not in shown else i,
               "backend": c.backend + (" (ref)" if c is ref else ""),
               "compression": c.compression.value,
               "ratio": "" if c.ratio is None else f"{c.ratio:g}", "algorithm": c.algorithm,
               "sparse": {True: "csr", False: "dense"}.get(c.sparse, "mixed"),
               "tuning": c.tuning.value,
               "tuning min": "" if c.tuning_s is None else f"{c.tuning_s / 60:.1f}",
               "predicted ms": ms(c.predicted_s),
               "80% interval": (f"{c.low_s * 1e3:.2f}–{c.high_s * 1e3:.2f}"
                                if c.low_s == c.low_s else "—"),
               "source": c.source,
               "speedup": (f"{base / c.predicted_s:.2f}×" + (" ?" if c.warning else "")
                           if c.predicted_s == c.predicted_s else "—"),
               "accuracy": "—" if c.accuracy is None else f"{c.accuracy:.1%}",
               "accuracy source": c.accuracy_source.split(":")[0]}
        if rec.validated:
            timed = c in rec.validated or c is ref
            row["measured ms"] = ms(c.measured_s) if timed else ""
            row["pred/meas"] = (f"{c.predicted_s / c.measured_s:.2f}"
                                if c.measured_s and c.predicted_s == c.predicted_s
                                else (c.measured_note or "")[:30] if timed else "")
            if ref is not None and ref.measured_s:
                row["measured speedup"] = (f"{ref.measured_s / c.measured_s:.2f}×"
                                           if timed and c.measured_s else "")
        rows.append(row)
    from dlas_predict.recommend.search import unchecked

    blind = sum(1 for c in rec.candidates if unchecked(c))
    typer.echo(f"{rec.network} on {rec.device}: {len(rec.candidates)} candidates kept"
               + (f" ({blind} of them with no accuracy figure, unchecked)" if blind else "")
               + f", {len(rec.dropped)} over the accuracy budget "
               f"({max_accuracy_drop:g} points), {len(rec.skipped)} grid points skipped; "
               f"{rec.seconds:.1f} s")
    if rec.source == "trained":
        how = "predicted by the cost models (" + str(rec.model_info["directory"]) + ")"
    else:
        m = rec.mapping
        how = (f"{rec.source}: {m['reference']}'s cost models ({rec.model_info['directory']}) "
               f"mapped to {rec.device}" + (" by its spec" if rec.source == "zero-shot" else
                                            f" by {m['shots']} of its measurements"))
    against = (f"onnxruntime fp32, the reference ({ref_pred * 1e3:.2f} ms predicted by the "
               "onnxruntime model)" if ref_pred else
               f"the fastest predicted dense configuration ({rec.dense_baseline_s * 1e3:.2f} "
               "ms; no onnxruntime model for this device)")
    typer.echo(f"latency: {how}; speedup over {against}")
    typer.echo(format_table(rows))
    flagged = [i for i, c in enumerate(listed, 1) if c.warning]
    if flagged:
        typer.echo(f"? (rows {', '.join(map(str, flagged))}): not surely faster than "
                   "onnxruntime fp32, whose predicted time its 80 % interval reaches; "
                   "--validate N measures them"
                   + (", `dlas-predict calibrate` narrows them" if rec.source == "zero-shot"
                      and rec.device == "local" else ""))
    sources = dict.fromkeys(c.accuracy_source for c in shown)
    for src in sources:
        typer.echo(f"accuracy source: {src}")
    by_reason: dict[str, list[str]] = {}
    for label, why in rec.skipped:
        by_reason.setdefault(why, []).append(label)
    for why, labels in by_reason.items():
        typer.echo(f"skipped {len(labels)} ({', '.join(labels)}): {why}")
    for note in rec.notes:
        typer.echo(f"note: {note}")
    if rec.validated:
        ok = [c for c in rec.validated if c.measured_s is not None]
        if ok:
            win = min(ok, key=lambda c: c.measured_s)
            typer.echo(f"validated {len(rec.validated)}: fastest measured is {win.label} "
                       f"({win.backend}) at {win.measured_s * 1e3:.2f} ms (predicted "
                       f"{win.predicted_s * 1e3:.2f})")
        for c in rec.validated:
            if c.same_build_as:
                typer.echo(f"{c.label} chose {c.layers[0][0]} for every layer: the same "
                           f"network as {c.same_build_as}, built and timed once")
        if ref is not None and ref.measured_s:
            ours = [c for c in ok if c.backend == "tvm"]
            best = min(ours, key=lambda c: c.measured_s) if ours else None
            typer.echo(f"onnxruntime fp32 measured in the same run: {ref.measured_s * 1e3:.2f} "
                       "ms" + (f"; our fastest validated build ({best.label}) is "
                               f"{ref.measured_s / best.measured_s:.2f}× its speed"
                               if best else ""))
        elif ref is not None and ref.measured_note:
            typer.echo(f"onnxruntime fp32 (the reference) was not timed: {ref.measured_note}")
        failed = [c for c in rec.validated if c.measured_s is None]
        if failed:
            _fail(f"{len(failed)} validated candidates failed to build or run: "
                  + "; ".join(f"{c.label}: {c.measured_note}" for c in failed))


@app.command()
@handle_errors
def recommend(
    model: str = typer.Argument(..., help="ONNX file or zoo:NAME."),
    device: str = typer.Option("local", "--device", help="Device name (see `devices`)."),
    max_accuracy_drop: float = typer.Option(
        ELBOW_DROP_PP, "--max-accuracy-drop",
        help="Drop candidates more than this many top-1 points below dense."),
    data: Optional[str] = typer.Option(None, "--data",
                                       help="digits | NPZ | image folder: measure accuracy "
                                            "on it (else the shipped curves)."),
    top: int = typer.Option(10, "--top", help="Candidates to print."),
    validate: str = typer.Option("0", "--validate",
                                 help="Build and time the top K whole networks (K | all)."),
    models_dir: Optional[Path] = typer.Option(None, "--models",
                                              help="Model directory (default: "
                                                   "models_store/DEVICE)."),
    tuning: str = typer.Option("all", "--tuning", help="untuned | tuned | all: the halves "
                               "of the grid to rank (tuned ones with their search time)."),
    trials: int = typer.Option(64, "--trials", help="Trial budget per kernel the tuned "
                               "candidates' search time is predicted for (and, with "
                               "--validate, the budget their schedules were tuned with)."),
    tuning_db: Optional[Path] = _TUNING_DB_OPT,
    as_json: bool = typer.Option(False, "--json"),
    tracker: Optional[str] = _TRACKER_OPT, rpc_key: Optional[str] = _RPC_KEY_OPT,
    allow_remote_tracker: bool = _ALLOW_REMOTE_OPT, boards: Optional[int] = _BOARDS_OPT,
    tries: int = _TRIES_OPT,
    timeout: float = typer.Option(300.0, "--timeout", help="--validate through RPC: seconds "
                                  "to wait for a free board."),
    quiet_wait: float = _QUIET_WAIT_OPT,
):
    """The fastest accurate configuration of MODEL on DEVICE, predicted in seconds; with
    --validate, proved by building and timing whole networks."""
    from dlas_predict.measure.execution.rpcopts import tracker_given
    from dlas_predict.recommend.search import recommend as run
    from dlas_predict.space.devices import get_device

    if top < 1:
        raise DlasError(f"--top must be >= 1, got {top}")
    if validate.strip().lower() == "all":
        k = 10 ** 9
    else:
        try:
            k = int(validate)
        except ValueError:
            raise DlasError(f"--validate takes a count or 'all', got {validate!r}") from None
    _check_quiet_wait(quiet_wait)
    log = None if as_json else (lambda line: typer.echo(line, err=True))
    rpc = None
    if k and tracker_given(tracker):
        rpc = _rpc(get_device(device), tracker, rpc_key, allow_remote_tracker, boards, tries,
                   timeout)
    rec = run(model, device, max_accuracy_drop, data, top, k, models_dir=models_dir, log=log,
              tuning=tuning, trials=trials, tuning_db=str(tuning_db) if tuning_db else None,
              network_runner=_network_runner(device, rpc, quiet_wait) if k else None)
    if as_json:
        _print_json(rec.to_dict(top if not k else max(top, min(k, len(rec.candidates)))))
        return
    _show_recommendation(rec, top, max_accuracy_drop)


# ---- corpus -----------------------------------------------------------------------------
@corpus_app.command("stats")
@handle_errors
def corpus_stats(store: Path = typer.Option(..., "--store", help="Corpus store."),
                 as_json: bool = typer.Option(False, "--json")):
    """Counts of records, failures and duplicate keys, with a breakdown."""
    from dlas_predict.corpus.store import CorpusStore

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
                  out: Path = typer.Option(..., "-o", "--out", help="Output file."),
                  latest: bool = typer.Option(False, "--latest", help="Leave out the kernel "
                                              "records that a later kernels version of the "
                                              "same configuration supersedes.")):
    """Export every measurement (all run times included) as Parquet or CSV."""
    from dlas_predict.errors import StoreError
    from dlas_predict.corpus.store import CorpusStore

    if fmt not in ("parquet", "csv"):
        raise StoreError(f"unknown export format {fmt!r}; allowed: parquet, csv")
    with CorpusStore(store, must_exist=True) as db:
        n = db.export(out, fmt, latest=latest)
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


def _bundle_networks(networks: list[str], dev, out: Path, algorithms, compressions,
                     ratio: float, store: Optional[Path], timing_weights: bool = False) -> None:
    from dlas_predict.analysis.frames import resolve_store
    from dlas_predict.corpus.collect import plan_networks as plan_whole, whole_network_plans
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.measure.gpu.bundle import require_cuda, save_plans
    from dlas_predict.corpus.gpu import network_entries
    from dlas_predict.measure.gpu.networks import write_network_bundle

    require_cuda(dev, "GPU network bundles")  # before anything is written to OUT
    nets = plan_whole(networks, compressions, ratio)
    try:
        path = resolve_store(dev.name, store)
    except DlasError:
        path = None  # no kernels of this GPU yet: the uniform plans alone
    with CorpusStore(path or ":memory:", must_exist=path is not None) as db:
        plans = whole_network_plans(nets, algorithms, ratio, db, dev)
    out.mkdir(parents=True, exist_ok=True)
    save_plans(out, network_entries(nets))
    counts = write_network_bundle(plans, dev, out, log=lambda s: typer.echo(s, err=True),
                                  timing_weights=timing_weights)
    typer.echo(f"{counts['built']} networks built, {counts['failed']} failed to build, "
               f"{counts['skipped']} already in {out}")


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
        _print_json(report.to_dict())
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
_LEVEL_OPT = typer.Option("kernel", "--level", help="kernel (one row per conv kernel "
                          "measurement) | network (one row per whole-network configuration).")
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
        _fail("no rows left after the filters")
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
                    store: Optional[Path] = _STORE_OPT, level: str = _LEVEL_OPT,
                    network: Optional[str] = _NETWORK_OPT, tuning: Optional[str] = _TUNING_OPT,
                    dtype: Optional[str] = _DTYPE_OPT, algorithm: Optional[str] = _ALG_OPT,
                    compression: Optional[str] = _COMP_OPT, as_json: bool = _JSON_OPT):
    """Median of a metric over two parameters: their contribution and interaction."""
    from dlas_predict.analysis import frames as A

    for p in (x, y):
        A.check_parameter(p, level)
    A.check_metric(metric, level)
    frame, corpus = _analysis_frame(device, store, level, network, tuning, dtype,
                                    algorithm, compression)
    result = A.heatmap(frame, x, y, metric, level)
    A.plot_heatmap(result, out, A._subtitle(frame, corpus=corpus))
    if as_json:
        _print_json(result.to_dict())
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
                       store: Optional[Path] = _STORE_OPT, level: str = _LEVEL_OPT,
                       network: Optional[str] = _NETWORK_OPT,
                       tuning: Optional[str] = _TUNING_OPT, dtype: Optional[str] = _DTYPE_OPT,
                       algorithm: Optional[str] = _ALG_OPT,
                       compression: Optional[str] = _COMP_OPT, as_json: bool = _JSON_OPT):
    """Linear regression of a metric on parameters: standardised coefficients and R²."""
    from dlas_predict.analysis import frames as A

    A.check_metric(metric, level)
    default = ("C,K,H,R,stride,depthwise,algorithm,compression,sparsity" if level == "kernel"
               else "net_macs,conv_layers,algorithm,compression,ratio")
    names = [p.strip() for p in (params or default).split(",") if p.strip()]
    for p in names:
        A.check_parameter(p, level)
    frame, corpus = _analysis_frame(device, store, level, network, tuning, dtype,
                                    algorithm, compression)
    result = A.regression(frame, metric, names, level)
    A.plot_regression(result, out, A._subtitle(frame, corpus=corpus))
    if as_json:
        _print_json(result.to_dict())
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

    A.check_parameter(color, "kernel")
    frame, corpus = _analysis_frame(device, store, "kernel", network, tuning, dtype,
                                    algorithm, compression)
    frame, dev = A.unique_kernels(frame), corpus.device
    A.plot_roofline(frame, dev, out, color, A._subtitle(frame, " (unique kernels)", corpus))
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
        _print_json(summary)
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
                    store: Optional[Path] = _STORE_OPT, level: str = _LEVEL_OPT,
                    network: Optional[str] = _NETWORK_OPT, tuning: Optional[str] = _TUNING_OPT,
                    dtype: Optional[str] = _DTYPE_OPT, algorithm: Optional[str] = _ALG_OPT,
                    compression: Optional[str] = _COMP_OPT,
                    log: Optional[bool] = typer.Option(None, "--log/--linear",
                                                       help="y scale (default: log when the "
                                                       "values span over 100x)."),
                    as_json: bool = _JSON_OPT):
    """Distribution and variability of a metric per group of a parameter."""
    from dlas_predict.analysis import frames as A

    A.check_parameter(by, level)
    A.check_metric(metric, level)
    frame, corpus = _analysis_frame(device, store, level, network, tuning, dtype,
                                    algorithm, compression)
    result, samples = A.boxplot_stats(frame, metric, by, level)
    A.plot_boxplot(result, samples, out, A._subtitle(frame, corpus=corpus), log)
    if as_json:
        _print_json(result.to_dict())
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
    from dlas_predict.analysis.report import write_report

    rep, page = write_report(device, store, out)
    if as_json:
        _print_json(rep.to_dict())
        return
    typer.echo(rep.whose)
    for o in rep.observations:
        typer.echo(f"{o.number + ')':6s} {o.verdict:14s} {o.claim}")
    verdicts = [o.verdict for o in rep.observations]
    typer.echo(f"\n{verdicts.count('holds')} hold, {verdicts.count('does not hold')} do not, "
               f"{verdicts.count('no data')} have no data on {rep.device.name}")
    typer.echo(f"wrote {page} ({len(rep.plots)} plots embedded) and {out / 'report.json'}")


# ---- demo -------------------------------------------------------------------------------
@app.command()
@handle_errors
def demo(store: Optional[Path] = typer.Option(None, "--store",
                                              help="Default: DLAS_HOME/demo.sqlite"),
         quiet: bool = typer.Option(False, "--quiet", "-q"),
         recommend_too: bool = typer.Option(True, "--recommend/--no-recommend",
                                            help="Then recommend for zoo:resnet18-cifar "
                                                 "and validate the top 3."),
         device: str = typer.Option("local", "--device", help="Where to measure (a device "
                                    "other than this machine needs --tracker)."),
         tracker: Optional[str] = _TRACKER_OPT, rpc_key: Optional[str] = _RPC_KEY_OPT,
         allow_remote_tracker: bool = _ALLOW_REMOTE_OPT,
         boards: Optional[int] = _BOARDS_OPT, tries: int = _TRIES_OPT,
         calibrate_minutes: float = typer.Option(
             2.5, "--calibrate-minutes", help="On a CPU without a model of its own and not "
             "yet calibrated: calibrate it first for about this long (0: do not).")):
    """The embedded default: the shipped demo CNN's conv layers × the whole untuned grid,
    measured on the local CPU (the fastest algorithm per layer and compression); on a CPU
    without a model of its own, `calibrate`; then a recommendation for zoo:resnet18-cifar,
    its top 3 built and timed."""
    from dlas_predict.paths import dlas_home
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.render import format_table

    store = store or dlas_home() / "demo.sqlite"
    remote = (tracker, rpc_key, allow_remote_tracker, boards, tries)
    _collect([str(DEMO_NETWORK)], store, device, "all", "all", 0.9, False, 150, 1.0, 300.0,
             False, quiet, remote=remote)
    with CorpusStore(store, must_exist=True) as db:
        fastest = db.fastest_per_layer(device)
    table = [{"conv": r.conv.to_spec(), "compression": r.variant.compression.value,
              "layer sparsity": r.variant.ratio or "", "fastest algorithm":
              r.variant.algorithm.value, "median ms": round(r.median_s * 1e3, 4),
              "GFLOP/s": round(r.gflops, 1)} for r in fastest]
    typer.echo("\nFastest algorithm per layer and compression (measured; pruned at 0.9 "
               "globally, each layer at its own sparsity):")
    typer.echo(format_table(table))
    if recommend_too and device != "local":
        typer.echo(f"\nno recommendation: the shipped cost model is local's, not {device}'s")
    elif recommend_too:
        from dlas_predict.recommend.search import recommend as run

        from dlas_predict.space.devices import get_device

        rpc = _rpc(get_device(device), *remote, 300.0)  # None without a tracker
        from dlas_predict.recommend import calibrate as cal

        if rpc is None and calibrate_minutes > 0 and cal.needed("local"):
            typer.echo(f"\nThis CPU has no model of its own: calibrating it (about "
                       f"{calibrate_minutes:g} min; `dlas-predict calibrate` does the same)")
            rep = cal.run("local", calibrate_minutes, None,
                          log=None if quiet else (lambda line: typer.echo(line, err=True)))
            typer.echo(f"calibrated: {rep.kernels} kernels, {len(rep.network_rows)} "
                       f"whole-network runs in {rep.seconds / 60:.1f} min ({rep.saved})")

        typer.echo("\nRecommendation for zoo:resnet18-cifar from the shipped model, the top 3 "
                   "built and timed:")
        log = None if quiet else (lambda line: typer.echo(line, err=True))
        _show_recommendation(run("zoo:resnet18-cifar", "local", ELBOW_DROP_PP, None, 5, 3,
                                 log=log, network_runner=_network_runner("local", rpc)),
                             5, ELBOW_DROP_PP)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
