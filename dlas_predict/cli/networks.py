"""The network commands: ``layers``, ``zoo``, ``export``, ``generate`` and ``accuracy``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dlas_predict.space.config import DEFAULT_CURVE_RATIOS, ELBOW_DROP_PP
from dlas_predict.cli.common import (DATA_LIMIT_OPT, INPUT_SIZE_OPT, MEAN_OPT, SHAPE_OPT,
                                     STD_OPT, app, data_options, fail, handle_errors,
                                     print_json, shaped)

# ---- networks ---------------------------------------------------------------------------
@app.command()
@handle_errors
def layers(model: str = typer.Argument(..., help="ONNX file or zoo:NAME."),
           shape: Optional[str] = SHAPE_OPT,
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Every layer of a network: op, shapes, MACs, parameters, bytes moved; and totals."""
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network
    from dlas_predict.render import format_table

    path = zoo.resolve(shaped(model, shape), grid=False)
    net = read_network(path, name=model.removeprefix(zoo.ZOO_PREFIX))
    if as_json:
        print_json(net.to_dict())
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
    """The zoo: the study's eight networks, their published size and their weights, and
    five networks of other families."""
    from dlas_predict.networks import zoo
    from dlas_predict.render import format_table

    entries = [e.to_dict() for e in zoo.ZOO.values()]
    if as_json:
        print_json(entries)
        return
    typer.echo(format_table([{
        "name": e["name"], "dataset": e["dataset"],
        "input": "×".join(map(str, e["input_shape"])), "classes": e["num_classes"],
        "family": e["family"],
        "paper params": "—" if e["paper_params"] is None else f"{e['paper_params'] / 1e6:.1f} M",
        "paper MACs": "—" if e["paper_macs"] is None else f"{e['paper_macs'] / 1e6:.0f} M",
        "weights": e["weights"],
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
            from dlas_predict.compression.data import load_data

            calib = load_data("digits", zoo.get(model).input_shape, "train").x[:128]
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
def generate(family: str = typer.Argument(..., help="fc | cnn | rnn | transformer | "
                                                     "nasbench201"),
             param: List[str] = typer.Option([], "--param", help="NAME=V1,V2,.. (repeatable; "
                                             "every family but nasbench201)"),
             arch: List[str] = typer.Option([], "--arch", help="nasbench201: an architecture "
                                            "string |op~0|+|op~0|op~1|+|op~0|op~1|op~2| "
                                            "(repeatable)."),
             index_file: Optional[Path] = typer.Option(None, "--index-file", help="nasbench201:"
                                                       " architectures one a line (strings, or "
                                                       "benchmark indices)."),
             out: Path = typer.Option(..., "-o", "--out", help="Output directory.")):
    """ParaDnn-style sweep (fc, cnn, rnn, transformer): one ONNX file per grid point, named
    by its parameters; or NAS-Bench-201 networks from their architecture strings."""
    if family == "nasbench201":
        from dlas_predict.networks import nasbench201 as nb

        if param:
            fail("nasbench201 takes --arch or --index-file, not --param")
        if not arch and index_file is None:
            fail("nasbench201 needs --arch STR or --index-file FILE")
        archs = [nb.parse_arch(a) for a in arch]
        if index_file is not None:
            from dlas_predict.crossdev.sources import help_arch_strings

            archs += nb.read_index_file(index_file, help_arch_strings)
        for path in nb.generate(archs, out):
            typer.echo(str(path))
        typer.echo(f"wrote {len(set(archs))} NAS-Bench-201 network(s) to {out}", err=True)
        return
    if arch or index_file is not None:
        fail("--arch and --index-file are for nasbench201")
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
    data: str = typer.Option("digits", "--data", help="digits | PATH (.npz, .csv of "
                             "PATH,LABEL rows, or an image folder of class subfolders)."),
    data_limit: Optional[int] = DATA_LIMIT_OPT,
    mean: Optional[str] = MEAN_OPT,
    std: Optional[str] = STD_OPT,
    input_size: Optional[str] = INPUT_SIZE_OPT,
    compression: str = typer.Option("dense", "--compression",
                                    help="dense | weight_pruning | channel_pruning | float16 "
                                         "| int8"),
    ratio: Optional[float] = typer.Option(None, "--ratio", help="Pruning ratio [0, 1)."),
    remove_channels: bool = typer.Option(False, "--remove-channels"),
    finetune_epochs: int = typer.Option(0, "--finetune-epochs",
                                        help="Fine-tune the pruned network, masks held "
                                             "(digits: its training split; other labelled "
                                             "data: one half, the other half measured)."),
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
    options = data_options(data_limit, mean, std, input_size)
    if not curve:
        res = accuracy.measure(model, data, compression, ratio, finetune_epochs,
                               remove_channels, log=log, options=options)
        if as_json:
            print_json(res.to_dict())
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
    rep = accuracy.pruning_curves(model, ratios, data, finetune_epochs, elbow_drop, log=log,
                                  options=options)
    if as_json:
        print_json(rep.to_dict())
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
