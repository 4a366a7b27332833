"""The model commands: ``train``, ``evaluate``, ``predict``, ``adapt``, ``active-learn`` and
``calibrate``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dlas_predict.space.choices import Criterion, Level
from dlas_predict.space.config import ELBOW_DROP_PP
from dlas_predict.errors import DlasError
from dlas_predict.cli.common import (ALLOW_REMOTE_OPT, QUIET_WAIT_OPT, RPC_KEY_OPT, TRACKER_OPT,
                                     app, fail, handle_errors, make_protocol, make_rpc, print_json)

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
        print_json(report.to_dict())
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
    if report.onnxruntime_skipped:
        typer.echo(f"no onnxruntime model: {report.onnxruntime_skipped}")
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
             level: Level = typer.Option(Level.KERNEL, "--level"),
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
        return _evaluate_devices(source, level.value, shots, draws, data, device, seed, as_json)
    if store is None:
        fail("--store is needed (or --leave-one-device-out)")
    from dlas_predict.models.evaluation import MODELS, WHOLE_MODELS, evaluate_store
    from dlas_predict.render import format_table

    ev = evaluate_store(store, device or "local", seed)
    if as_json:
        print_json(ev.to_dict())
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
        print_json(rep.to_dict())
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
                         "80% holds": pct(sc.coverage),
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
    covers = [(n, rep.mean("model", n, "coverage")) for n in rep.shots]
    if any(v == v for _, v in covers):  # NaN: no interval (a sibling's measurements)
        typer.echo("mean share of truths inside the 80 % interval: " + "; ".join(
            f"{n} shots " + (f"{v:.0%}" if v == v else "—") for n, v in covers))


@app.command()
@handle_errors
def predict(targets: List[str] = typer.Argument(..., help="conv:C=..,H=..,W=..,K=..,R=..,S=.."
                                                "[,stride=..][,pad=..][,groups=..], "
                                                "nasbench201:ARCH, or a `generate "
                                                "nasbench201` file."),
            device: str = typer.Option(..., "--device", help="Any registry device, a HELP "
                                       "device, or one `adapt` fitted."),
            config: List[str] = typer.Option([], "--config", help="COMPRESSION[@RATIO]"
                                             "[/ALGORITHM][/tuned]; an omitted part: the "
                                             "fastest predicted (repeatable: each target "
                                             "under each)."),
            data: Optional[Path] = typer.Option(None, "--data", help="Folder of the public "
                                                "data (default $DLAS_SHARED_DATA, else the "
                                                "public data folder beside the checkout)."),
            runtime: Optional[str] = typer.Option(None, "--runtime", help="The runtime whose "
                                                  "latency to predict: tvm, onnxruntime, or "
                                                  "the one the device was adapted on (its "
                                                  "default)."),
            max_accuracy_drop: float = typer.Option(
                ELBOW_DROP_PP, "--max-accuracy-drop", help="Where --config names no "
                "compression: the network's answer is the first that recommend ranks within "
                "this many points of top-1 (a compression of unknown accuracy never before "
                "dense)."),
            as_json: bool = typer.Option(False, "--json")):
    """Batch prediction on any device from the cross-device models: the latency, its 80 %
    interval, the runtime it is of, and where it comes from (trained, adapted or
    zero-shot)."""
    from dlas_predict.recommend.predict import predict as run
    from dlas_predict.render import format_table

    preds = [p for c in (list(dict.fromkeys(config)) or [None])
             for p in run(list(targets), device, c, data, runtime, max_accuracy_drop)]
    if as_json:
        print_json([{k: v for k, v in p.to_dict().items() if k != "basis"} for p in preds])
        return
    typer.echo(format_table([{"target": p.target, "config": p.config,
                              "predicted ms": f"{p.predicted_ms:.4g}",
                              "80% interval": f"{p.low_ms:.4g}–{p.high_ms:.4g}",
                              "runtime": p.runtime, "source": p.source, "model": p.basis}
                             for p in preds]))
    if any(p.source == "zero-shot" for p in preds):
        typer.echo(f"zero-shot: {device} has no measurement here; `dlas-predict adapt --device "
                   f"{device} --measurements FILE.csv` (or active-learn) makes it better")


@app.command()
@handle_errors
def adapt(device: str = typer.Option(..., "--device", help="A registry device, or a new "
                                     "name (registered by its measurements alone)."),
          measurements: Path = typer.Option(..., "--measurements", help="CSV: target, "
                                            "config (default dense), latency_ms, and "
                                            "optionally runtime (tflite, onnxruntime, ...; "
                                            "one for every row)."),
          data: Optional[Path] = typer.Option(None, "--data", help="Folder of the public "
                                              "data."),
          as_json: bool = typer.Option(False, "--json")):
    """Few-shot calibration: fit a device's loading on latencies measured on it, in any
    runtime; saved under DLAS_HOME (never over the shipped models)."""
    from dlas_predict.recommend.adapt import adapt as run

    rep = run(device, measurements, data)
    if as_json:
        print_json(rep.__dict__)
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
                 criterion: Criterion = typer.Option(
                     Criterion.VARIANCE, "--criterion", help="variance (the "
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
                 quiet_wait: float = QUIET_WAIT_OPT,
                 tracker: Optional[str] = TRACKER_OPT, rpc_key: Optional[str] = RPC_KEY_OPT,
                 allow_remote_tracker: bool = ALLOW_REMOTE_OPT,
                 as_json: bool = typer.Option(False, "--json")):
    """Measure the kernels that most reduce the uncertainty about your networks, refit, and
    repeat; draws the learning curve against random choice (with --replay)."""
    import numpy as np

    from dlas_predict.recommend import active

    log = None if as_json else (lambda m: typer.echo(m, err=True))
    if replay is not None:
        if store is not None or tracker:
            fail("--replay measures nothing: drop --store and --tracker")
        rep = active.learn_replay(device, replay, list(network), budget, criterion.value, seed,
                                  target_interval, random_runs, plot, log)
    else:
        from dlas_predict.measure.execution.farm import kernel_runner
        from dlas_predict.space.devices import get_device

        dev = get_device(device)
        proto = make_protocol(max_repeats, time_budget, quiet_wait)
        rpc = make_rpc(dev, tracker, rpc_key, allow_remote_tracker, None, 3, timeout)
        if rpc is None and not dev.measured_here:
            fail(f"{device} is measured through a tracker: pass --tracker HOST:PORT (or "
                  "--replay recorded measurements)")
        rep = active.learn_live(device, list(network),
                                lambda: kernel_runner(dev, proto, timeout, rpc, log), budget,
                                criterion.value, seed, target_interval, store, plot, log)
    if as_json:
        print_json(rep.to_dict())
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
                                                "CNN, resnet18-cifar, mobilenetv2-cifar, "
                                                "and, while time remains, the builds of "
                                                "mobilenetv1-cifar and vgg16-cifar)."),
              as_json: bool = typer.Option(False, "--json")):
    """This CPU calibrated in minutes: kernels by active learning, then whole networks of
    both backends; recommend and predict then answer for it as adapted. Resumable."""
    import numpy as np

    from dlas_predict.recommend import calibrate as cal

    rep = cal.run(device, minutes, list(network) or None,
                  log=lambda m: typer.echo(m, err=True))
    if as_json:
        print_json(rep.to_dict())
        return
    typer.echo(f"{device} calibrated on {rep.cpu_model} (fingerprint {rep.fingerprint}) in "
               f"{rep.seconds / 60:.1f} min: {rep.kernels} kernels (reference "
               f"{rep.reference}), {len(rep.network_rows)} whole-network runs")
    for label, loo, offs in (("our builds", rep.network_loo, rep.network_offsets),
                             ("onnxruntime", rep.onnxruntime_loo, rep.onnxruntime_offsets)):
        if offs:
            err = np.abs(np.expm1(np.asarray(loo))) if loo else np.array([])
            scales = (f"per-op costs ×{rep.onnxruntime_scales[0]:.2f}, the rest "
                      f"×{rep.onnxruntime_scales[1]:.2f}; " if label == "onnxruntime" and
                      tuple(rep.onnxruntime_scales) != (1.0, 1.0) else "")
            typer.echo(f"  {label}: {scales}offsets " + ", ".join(
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
    intervals = any(s.coverage is not None for s in report.overall.values())
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
            if intervals:
                row["80% holds"] = pct(r.coverage, ".0%")
            rows.append(row)
    return rows
