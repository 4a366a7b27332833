"""``recommend``: the grid ranked, the top candidates validated, the table shown."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dlas_predict.space.choices import TuningChoice
from dlas_predict.space.config import ELBOW_DROP_PP
from dlas_predict.errors import DlasError
from dlas_predict.cli.common import (ALLOW_REMOTE_OPT, BOARDS_OPT, DATA_LIMIT_OPT,
                                     INPUT_SIZE_OPT, MEAN_OPT, QUIET_WAIT_OPT, RPC_KEY_OPT,
                                     SHAPE_OPT, STD_OPT, TRACKER_OPT, TRIES_OPT, TUNING_DB_OPT,
                                     app, check_quiet_wait, data_options, fail, handle_errors,
                                     make_rpc, open_network_runner, print_json, shaped)

def _accuracy_cell(c) -> str:
    if c.accuracy is not None:
        return f"{c.accuracy:.1%}"
    if c.accuracy_drop_pp is None:
        return "—"
    if c.accuracy_drop_pp == 0 and c.accuracy_drop_high_pp is None:
        return "no drop"
    if c.accuracy_drop_high_pp is not None:
        return f"-{c.accuracy_drop_pp:.1f} pt (≤{c.accuracy_drop_high_pp:.1f})"
    return f"-{c.accuracy_drop_pp:.1f} pt"


def accuracy_line(rec) -> str:
    """One line: how many candidates' accuracy was checked against the budget, and how."""
    counts = rec.accuracy_counts()
    over = len(rec.dropped)
    return ("accuracy of the kept candidates: "
            + ", ".join(f"{n} {kind}" for kind, n in counts.items())
            + (f"; {over} dropped as over the budget" if over else "")
            + ("; unchecked ones rank after the reference" if "unchecked" in counts else ""))


def show_recommendation(rec, top: int, max_accuracy_drop: float) -> None:
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
               "accuracy": _accuracy_cell(c),
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
    typer.echo(f"{rec.network} on {rec.device}: {len(rec.candidates)} candidates kept, "
               f"{len(rec.dropped)} over the accuracy budget ({max_accuracy_drop:g} points), "
               f"{len(rec.skipped)} grid points skipped; {rec.seconds:.1f} s")
    typer.echo(accuracy_line(rec))
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
        noisy = [c for c in rec.validated if (c.measured_note or "").startswith("noisy")]
        if noisy:
            typer.echo("timed on a busy machine (their times are of it, time them again when "
                       "it is quiet): " + "; ".join(f"{c.label}: {c.measured_note}"
                                                  for c in noisy))
        failed = [c for c in rec.validated if c.measured_s is None]
        if failed:
            fail(f"{len(failed)} validated candidates failed to build or run: "
                  + "; ".join(f"{c.label}: {c.measured_note}" for c in failed))


@app.command()
@handle_errors
def recommend(
    model: str = typer.Argument(..., help="ONNX file or zoo:NAME."),
    device: str = typer.Option("local", "--device", help="Device name (see `devices`)."),
    shape: Optional[str] = SHAPE_OPT,
    max_accuracy_drop: float = typer.Option(
        ELBOW_DROP_PP, "--max-accuracy-drop",
        help="Drop candidates more than this many top-1 points below dense."),
    data: Optional[str] = typer.Option(None, "--data",
                                       help="digits | NPZ | CSV | image folder: measure "
                                            "accuracy on it (else the shipped curves, else "
                                            "predicted from the weights)."),
    data_limit: Optional[int] = DATA_LIMIT_OPT,
    mean: Optional[str] = MEAN_OPT,
    std: Optional[str] = STD_OPT,
    input_size: Optional[str] = INPUT_SIZE_OPT,
    fine_tune: int = typer.Option(0, "--fine-tune", help="Measure pruned candidates after "
                                  "this many epochs of fine-tuning, as the study does (zoo "
                                  "networks and ONNX files; on digits' training split, or on "
                                  "half of other --data, the rest measuring)."),
    top: int = typer.Option(10, "--top", help="Candidates to print."),
    validate: str = typer.Option("0", "--validate",
                                 help="Build and time the top K whole networks (K | all)."),
    models_dir: Optional[Path] = typer.Option(None, "--models",
                                              help="Model directory (default: "
                                                   "models_store/DEVICE)."),
    tuning: TuningChoice = typer.Option(TuningChoice.ALL, "--tuning", help="The halves of "
                                        "the grid to rank (tuned ones with their search "
                                        "time)."),
    trials: int = typer.Option(64, "--trials", help="Trial budget per kernel the tuned "
                               "candidates' search time is predicted for (and, with "
                               "--validate, the budget their schedules were tuned with)."),
    tuning_db: Optional[Path] = TUNING_DB_OPT,
    as_json: bool = typer.Option(False, "--json"),
    tracker: Optional[str] = TRACKER_OPT, rpc_key: Optional[str] = RPC_KEY_OPT,
    allow_remote_tracker: bool = ALLOW_REMOTE_OPT, boards: Optional[int] = BOARDS_OPT,
    tries: int = TRIES_OPT,
    timeout: float = typer.Option(300.0, "--timeout", help="--validate through RPC: seconds "
                                  "to wait for a free board."),
    quiet_wait: float = QUIET_WAIT_OPT,
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
    check_quiet_wait(quiet_wait)
    log = None if as_json else (lambda line: typer.echo(line, err=True))
    rpc = None
    if k and tracker_given(tracker):
        rpc = make_rpc(get_device(device), tracker, rpc_key, allow_remote_tracker, boards, tries,
                   timeout)
    options = data_options(data_limit, mean, std, input_size)
    model = shaped(model, shape)
    if models_dir is None and rpc is None:
        from dlas_predict.networks import zoo
        from dlas_predict.networks.graph import read_network
        from dlas_predict.recommend.calibrate import host_drift, roofs_first

        read_network(zoo.resolve(model))  # a bad file fails before anything is measured
        say = lambda line: typer.echo(line, err=True)  # noqa: E731
        if not roofs_first(device, say):
            host_drift(device, say)  # a model of this CPU id: this host's roofs, once
    rec = run(model, device, max_accuracy_drop, data, top, k, models_dir=models_dir, log=log,
              data_options=options, finetune_epochs=fine_tune,
              tuning=tuning.value, trials=trials, tuning_db=str(tuning_db) if tuning_db else None,
              network_runner=open_network_runner(device, rpc, quiet_wait) if k else None)
    if as_json:
        print_json(rec.to_dict(top if not k else max(top, min(k, len(rec.candidates)))))
        return
    show_recommendation(rec, top, max_accuracy_drop)
