"""The measuring commands: ``measure`` (one workload), ``collect`` (a corpus), ``bundle``
(kernels for a GPU no tracker reaches) and ``tune``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dlas_predict.space.choices import Tuner, TuningChoice
from dlas_predict.errors import DlasError
from dlas_predict.cli.common import (ALLOW_REMOTE_OPT, BOARDS_OPT, EARLY_STOP_OPT, QUIET_WAIT_OPT,
                                     RPC_KEY_OPT, TRACKER_OPT, TRIALS_OPT, TRIES_OPT, TUNING_DB_OPT,
                                     app, fail, handle_errors, make_protocol, make_rpc, make_tuning,
                                     parse_backends, print_board_progress, print_json)

@app.command()
@handle_errors
def measure(
    conv: str = typer.Option(..., "--conv", help="Conv workload, e.g. "
                             "C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1[,groups=G]"),
    device: str = typer.Option("local", "--device", help="Device name (see `devices`)."),
    algorithm: str = typer.Option("all", "--algorithm",
                                  help="all (direct,gemm,spatial_pack) | comma list of "
                                  "those and winograd (dense and float16 3x3 stride-1 "
                                  "convs, untuned)"),
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
    quiet_wait: float = QUIET_WAIT_OPT,
    tuning: TuningChoice = typer.Option(TuningChoice.UNTUNED, "--tuning", help="tuned: "
                                        "MetaSchedule for dense kernels, a knob search "
                                        "for CSR."),
    trials: int = TRIALS_OPT, early_stop: int = EARLY_STOP_OPT,
    tuning_db: Optional[Path] = TUNING_DB_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per variant."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    tracker: Optional[str] = TRACKER_OPT, rpc_key: Optional[str] = RPC_KEY_OPT,
    allow_remote_tracker: bool = ALLOW_REMOTE_OPT, boards: Optional[int] = BOARDS_OPT,
    tries: int = TRIES_OPT,
    emulated: bool = typer.Option(False, "--emulated", help="RPC: the boards are emulators "
                                  "(qemu-user): outputs are verified, timings are labelled "
                                  "emulated and never stored."),
):
    """Measure one conv workload across algorithms × compressions (× tuning) on a device."""
    from dlas_predict.space.config import (Algorithm, Compression, ConvSpec, check_ratio,
                                           variant_grid, winograd_skip)
    from dlas_predict.render import format_table
    from dlas_predict.corpus.collect import collect_kernels as run_collect
    from dlas_predict.measure.execution.farm import kernel_runner
    from dlas_predict.measure.execution.runner import MeasureTask
    from dlas_predict.space.devices import get_device

    spec = ConvSpec.parse(conv)
    algorithms = Algorithm.parse_list(algorithm)
    compressions = Compression.parse_list(compression)
    check_ratio(ratio)
    proto = make_protocol(max_repeats, time_budget, quiet_wait)
    tunings, opts = make_tuning(tuning.value, trials, early_stop, tuning_db)
    dev = get_device(device)
    if emulated and store is not None:
        raise DlasError("timings on an emulated board are not the device's: the corpus "
                        "refuses them (drop --store)")
    rpc = make_rpc(dev, tracker, rpc_key, allow_remote_tracker, boards, tries, timeout, emulated)
    if emulated and rpc is None:
        raise DlasError("--emulated is for boards reached through --tracker")
    variants, skipped = [], []
    for v in (v for t in tunings for v in variant_grid(algorithms, compressions, ratio, t)):
        why = winograd_skip(spec, v.compression, dev.kind, v.tuning) \
            if v.algorithm is Algorithm.WINOGRAD else None
        if why:
            skipped.append({"algorithm": v.algorithm.value, "compression": v.compression.value,
                            "tuning": v.tuning.value, "skipped": why})
        else:
            variants.append(v)
    for s in skipped if not as_json else ():
        typer.echo(f"skipped {s['algorithm']} {s['compression']} ({s['tuning']}): "
                   f"{s['skipped']}", err=True)
    if not variants:
        raise DlasError(f"nothing to measure for {spec.to_spec()}: "
                        + "; ".join(sorted({s['skipped'] for s in skipped})))
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
        print_board_progress(runner)
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
        print_json(out + skipped)
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
        fail(f"{len(bad)} of {len(results)} variants failed or did not verify "
              "(see the error column)")


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
    network: List[str] = typer.Option([], "--network",
                                      help="ONNX file or zoo:NAME (repeatable)."),
    store: Path = typer.Option(..., "--store", help="Corpus store (SQLite), created if new."),
    calibration_set: bool = typer.Option(
        False, "--calibration-set",
        help="This machine as data: the kernels (every algorithm and compression) and "
             "whole networks (both backends) of five networks (the calibration networks, "
             "mobilenetv1-cifar, vgg16-cifar), timed with fewer runs (30, 0.5 s a kernel "
             "unless --max-repeats/--time-budget say otherwise); resumable."),
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
    max_repeats: Optional[int] = typer.Option(None, "--max-repeats",
                                              help="Timed runs a kernel at most (default 150)."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget",
                                                help="Seconds of runs a kernel (default 3)."),
    timeout: float = typer.Option(300.0, "--timeout"),
    quiet_wait: float = QUIET_WAIT_OPT,
    tuning: TuningChoice = typer.Option(TuningChoice.UNTUNED, "--tuning"),
    trials: int = TRIALS_OPT, early_stop: int = EARLY_STOP_OPT,
    tuning_db: Optional[Path] = TUNING_DB_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    tracker: Optional[str] = TRACKER_OPT, rpc_key: Optional[str] = RPC_KEY_OPT,
    allow_remote_tracker: bool = ALLOW_REMOTE_OPT, boards: Optional[int] = BOARDS_OPT,
    tries: int = TRIES_OPT,
):
    """Measure the grid over every unique conv layer of the networks; resumable.

    Pruned networks are pruned globally at --ratio and each layer's kernels are measured at
    that layer's own sparsity."""
    from dlas_predict.corpus.collect import (CALIBRATION_BUDGET_S, CALIBRATION_REPEATS,
                                             CALIBRATION_SET, calibration_networks)

    if calibration_set:
        network = calibration_networks(CALIBRATION_SET) + list(network)
        whole_network = True
        max_repeats = CALIBRATION_REPEATS if max_repeats is None else max_repeats
        time_budget = CALIBRATION_BUDGET_S if time_budget is None else time_budget
    elif not network:
        raise DlasError("give the networks to measure (--network FILE.onnx or zoo:NAME, "
                        "repeatable), or --calibration-set")
    collect_into(network, store, device, algorithms, compressions, ratio, retry_failures,
             150 if max_repeats is None else max_repeats,
             3.0 if time_budget is None else time_budget, timeout, as_json, quiet,
             per_layer=not uniform, whole_network=whole_network,
             tuning=make_tuning(tuning.value, trials, early_stop, tuning_db), quiet_wait=quiet_wait,
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
           tuner: Tuner = typer.Option(Tuner.KNOB_SEARCH, "--tuner", help="With --trials: "
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
    from dlas_predict.measure.records import METASCHEDULE

    tuner = tuner.value
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
    trials: int = TRIALS_OPT, early_stop: int = EARLY_STOP_OPT,
    tuning_db: Optional[Path] = TUNING_DB_OPT,
    store: Optional[Path] = typer.Option(None, "--store", help="Corpus store the tuned "
                                         "records go to (default: DLAS_HOME/corpus.sqlite)."),
    algorithms: str = typer.Option("all", "--algorithms", help="all | comma list."),
    compressions: str = typer.Option("all", "--compressions", help="all | comma list."),
    ratio: float = typer.Option(0.9, "--ratio", help="Global pruning ratio in (0, 1)."),
    retry_failures: bool = typer.Option(False, "--retry-failures"),
    max_repeats: int = typer.Option(150, "--max-repeats"),
    time_budget: float = typer.Option(3.0, "--time-budget"),
    quiet_wait: float = QUIET_WAIT_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    tracker: Optional[str] = TRACKER_OPT, rpc_key: Optional[str] = RPC_KEY_OPT,
    allow_remote_tracker: bool = ALLOW_REMOTE_OPT, boards: Optional[int] = BOARDS_OPT,
    tries: int = TRIES_OPT,
    timeout: float = typer.Option(300.0, "--timeout", help="RPC: seconds to wait for a free "
                                  "board."),
):
    """Auto-schedule every unique conv layer of the networks: MetaSchedule for dense kernels,
    a measured knob search for CSR kernels. Resumable: what the store or the tuning database
    already holds is not tuned again."""
    from dlas_predict.paths import default_store_path

    collect_into(network, store or default_store_path(), device, algorithms, compressions, ratio,
             retry_failures, max_repeats, time_budget, timeout, as_json, quiet,
             tuning=make_tuning("tuned", trials, early_stop, tuning_db), quiet_wait=quiet_wait,
             remote=(tracker, rpc_key, allow_remote_tracker, boards, tries))


def collect_into(networks, store, device, algorithms, compressions, ratio, retry_failures,
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
    proto = make_protocol(max_repeats, time_budget, quiet_wait)
    tunings, opts = tuning or ([Tuning.UNTUNED], None)
    dev = get_device(device)
    rpc = make_rpc(dev, *remote, timeout)
    chatty = not quiet and not as_json
    log = (lambda line: typer.echo(line, err=True)) if chatty else None
    whole = ((lambda: network_runner(dev, proto, max(timeout, 600.0), rpc, log))
             if whole_network else None)
    chosen = parse_backends(backends)
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
        print_board_progress(runner)
    summary = rep.kernels
    if as_json:
        print_json(rep.to_dict())
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
        fail(f"{summary.failed} kernels and {rep.network_failures} whole networks failed; "
              f"each failure is recorded with its error (dlas-predict corpus stats --store "
              f"{store})")
    return summary


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
