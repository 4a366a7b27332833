"""``demo``: the embedded default, measured and recommended on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dlas_predict.space.config import ELBOW_DROP_PP
from dlas_predict.paths import DEMO_NETWORK
from dlas_predict.cli.common import (ALLOW_REMOTE_OPT, BOARDS_OPT, RPC_KEY_OPT, TRACKER_OPT,
                                     TRIES_OPT, app, handle_errors, make_rpc, open_network_runner)
from dlas_predict.cli.measuring import collect_into
from dlas_predict.cli.recommending import show_recommendation

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
         tracker: Optional[str] = TRACKER_OPT, rpc_key: Optional[str] = RPC_KEY_OPT,
         allow_remote_tracker: bool = ALLOW_REMOTE_OPT,
         boards: Optional[int] = BOARDS_OPT, tries: int = TRIES_OPT,
         calibrate_minutes: float = typer.Option(
             2.5, "--calibrate-minutes", help="On a CPU without a model of its own (or a "
             "host of its id at other roofs, measured once) and not yet calibrated: "
             "calibrate it first for about this long (0: do not).")):
    """The embedded default: the shipped demo CNN's conv layers × the whole untuned grid,
    measured on the local CPU (the fastest algorithm per layer and compression); on a CPU
    without a model of its own, or a host of its CPU id at other roofs, `calibrate`; then a
    recommendation for zoo:resnet18-cifar, its top 3 built and timed."""
    from dlas_predict.paths import dlas_home
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.render import format_table

    store = store or dlas_home() / "demo.sqlite"
    remote = (tracker, rpc_key, allow_remote_tracker, boards, tries)
    collect_into([str(DEMO_NETWORK)], store, device, "all", "all", 0.9, False, 150, 1.0, 300.0,
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

        rpc = make_rpc(get_device(device), *remote, 300.0)  # None without a tracker
        from dlas_predict.recommend import calibrate as cal

        log = None if quiet else (lambda line: typer.echo(line, err=True))
        drift = cal.host_drift("local", log or (lambda line: None)) \
            if rpc is None and calibrate_minutes > 0 else None
        if rpc is None and calibrate_minutes > 0 and (drift or cal.needed("local")):
            why = "This host's roofs lie off those of its CPU id's model: calibrating it" \
                if drift else "This CPU has no model of its own: calibrating it"
            typer.echo(f"\n{why} (about {calibrate_minutes:g} min; `dlas-predict calibrate` "
                       "does the same)")
            rep = cal.run("local", calibrate_minutes, None, log=log)
            typer.echo(f"calibrated: {rep.kernels} kernels, {len(rep.network_rows)} "
                       f"whole-network runs in {rep.seconds / 60:.1f} min ({rep.saved})")

        typer.echo("\nRecommendation for zoo:resnet18-cifar from the cost models, the top 3 "
                   "built and timed:")
        show_recommendation(run("zoo:resnet18-cifar", "local", ELBOW_DROP_PP, None, 5, 3,
                                 log=log, network_runner=open_network_runner("local", rpc)),
                             5, ELBOW_DROP_PP)
