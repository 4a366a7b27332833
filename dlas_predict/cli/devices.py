"""``devices``: the device registry, its roofs measured, devices added and removed."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Optional

import typer

from dlas_predict.space.choices import DeviceKind
from dlas_predict.cli.common import (ALLOW_REMOTE_OPT, PLAIN, RPC_KEY_OPT, TRACKER_OPT, app, fail,
                                     handle_errors, make_rpc, print_json)

# ---- devices ----------------------------------------------------------------------------
devices_app = typer.Typer(invoke_without_command=True, **PLAIN,
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
            tracker: Optional[str] = TRACKER_OPT, rpc_key: Optional[str] = RPC_KEY_OPT,
            allow_remote_tracker: bool = ALLOW_REMOTE_OPT,
            timeout: float = typer.Option(300.0, "--timeout", help="RPC: seconds to wait "
                                          "for a free board.")):
    """List the device registry: ``local`` and its profiles are detected on this machine,
    the others are shipped or added with ``devices add``."""
    from dlas_predict.space.devices import all_devices
    from dlas_predict.render import format_table

    if ctx.invoked_subcommand is not None:
        return
    if save_to is not None and not measure_peaks:
        fail("--save-to needs --measure-peaks", 2)
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
        print_json([{**d.to_dict(), "model": "trained" if d.name in trained else
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
    } for d in devs] + [{"name": m["name"], "kind": "-", "origin": "adapted",
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
                kind: DeviceKind = typer.Option(..., "--kind"),
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

    dev = add_device(name, kind.value, target, cores, peak_gflops, bandwidth_gbs, rpc_key,
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
    rpc = make_rpc(dev, tracker, rpc_key, allow_remote, 1, 1, timeout)
    if not as_json:
        where = f" through {rpc.tracker} (key {rpc.key})" if rpc else ""
        typer.echo(f"measuring the roofs of {dev.name} ({dev.description}){where}, about "
                   "30 s ...")
    peaks, path = measure_device_peaks(dev, lambda: LocalRunner(dev, timeout_s=600, rpc=rpc),
                                       save_to)
    if as_json:
        print_json(peaks.to_dict())
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
