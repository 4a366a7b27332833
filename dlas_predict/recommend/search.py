"""``recommend``: the fastest accurate configuration of a network, predicted from the learned
cost models, and optionally proved by building and timing whole networks.

The grid: dense, float16, int8, and weight and channel pruning at each ratio of
:data:`~dlas_predict.space.config.DEFAULT_CURVE_RATIOS` (each layer at its own sparsity after
global pruning), × the three algorithms, untuned; plus, per compression, a *per-layer*
candidate in which every layer runs the kernel the layer model predicts fastest for it (any
algorithm; for pruned layers dense or CSR). A channel-pruned network is priced as what is
built: the network with its zeroed filters removed, each layer on its smaller shape.

Every latency is a prediction of the models in ``models_store/DEVICE`` (layer model summed
over the conv layers, times the network-level residual), with an 80 % interval; every
accuracy says where it comes from.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlas_predict.space.config import (COMPRESSION_KERNEL, DEFAULT_CURVE_RATIOS, ELBOW_DROP_PP,
                                       GRID_ALGORITHMS, Algorithm, Compression, Tuning,
                                       winograd_skip)
from dlas_predict.errors import DlasError, param
from dlas_predict.measure.networks.plans import ONNXRUNTIME, PER_LAYER

from dlas_predict.paths import MODELS_STORE
from dlas_predict.space.devices import model_dir
from dlas_predict.models.device import features_device, load_models
from dlas_predict.recommend.accuracy import Accuracies
from dlas_predict.recommend.candidates import Candidate, Recommendation
from dlas_predict.recommend.tuning import (searched_trials, tuning_model, tuning_seconds,
                                          tuning_verdict, without_dominated_tuning)
from dlas_predict.recommend.validate import validate_top


# ---- models ----------------------------------------------------------------------------------
# ---- the recommender ---------------------------------------------------------------------------
@dataclass(frozen=True)
class GridPoint:
    """One compression of the grid: each conv layer's kernel ratio, and for channel pruning
    the layers and summary of the network with its zeroed filters removed."""

    compression: Compression
    ratio: float | None
    layer_ratios: tuple[float, ...]
    specs: tuple | None = None       # ConvSpec per layer; None: the network's own
    summary: Any = None              # NetworkSummary; None: the network's own
    #: channel pruning none of whose zeroed filters could be removed (an MLP's neurons, a
    #: filter reaching a residual add): the network's own layers, zeroed filters kept
    nothing_removed: bool = False


def _grid(convs, model: str, ratios: tuple[float, ...], skipped: list,
          compressions: tuple[Compression, ...] = tuple(Compression)) -> list[GridPoint]:
    """Every point of the grid (of the given compressions)."""
    from dlas_predict.compression.compress import cached_channel_removed, cached_pruned_sparsities
    from dlas_predict.compression.netplan import kernel_ratio
    from dlas_predict.networks.summary import NetworkSummary

    points = [GridPoint(c, None, (0.0,) * len(convs)) for c in
              (Compression.DENSE, Compression.FLOAT16, Compression.INT8) if c in compressions]
    pruning = [c for c in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING)
               if c in compressions]
    if not pruning:
        return points
    try:
        sp = cached_pruned_sparsities(model, {c: ratios for c in pruning})
        removed = (cached_channel_removed(model, ratios)
                   if Compression.CHANNEL_PRUNING in pruning else {})
    except DlasError as exc:
        skipped.append(("weight_pruning, channel_pruning", str(exc)))
        return points
    for (comp, r), layer_sp in sp.items():
        if len(layer_sp) != len(convs):
            skipped.append((f"{comp.value}@{r:g}", f"{len(layer_sp)} conv layers with "
                            f"constant weights, {len(convs)} conv layers: pruning needs "
                            "constant weights"))
            continue
        if not any(kernel_ratio(s) for s in layer_sp):
            skipped.append((f"{comp.value}@{r:g}", "prunes no weight of any conv layer (no "
                            "prunable layer, or the ratio rounds to nothing)"))
            continue
        if comp is Compression.CHANNEL_PRUNING:
            layers, summary = removed[float(r)]
            specs = tuple(spec for spec, _ in layers)
            points.append(GridPoint(comp, r, tuple(kernel_ratio(s) for _, s in layers),
                                    specs, NetworkSummary(**summary),
                                    specs == tuple(c.spec for c in convs)))
        else:
            points.append(GridPoint(comp, r, tuple(kernel_ratio(s) for s in layer_sp)))
    return points


@dataclass(frozen=True)
class LayerOption:
    """One kernel a layer may run: its algorithm, whether it is the CSR kernel, and the row
    of its features in the prediction batch."""

    algorithm: str
    sparse: bool
    row: int


@dataclass(frozen=True)
class Plan:
    """A candidate's kernels, layer by layer, before the network model prices them."""

    compression: Compression
    ratio: float | None
    algorithm: str                  # an Algorithm value or PER_LAYER
    layers: tuple[LayerOption, ...]
    tuning: Tuning
    summary: Any = None             # the network's NetworkSummary where not su.net's


@dataclass
class _Setup:
    """What the stages of :func:`recommend` share: the device, its models, the network."""

    dev: Any
    feat_dev: Any                   # the device as the layer model's features see it
    layer_model: Any
    net_model: Any
    info: dict
    tuning_model: Any
    net: Any
    name: str
    entry: Any                      # the zoo entry, for zoo networks
    tunings: list[Tuning]
    notes: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    mapping: Any = None             # a DeviceMap when the models are a reference device's
    ref_dev: Any = None
    ort_model: Any = None           # the onnxruntime latency model, where trained
    ort_here: bool = False          # ... trained on this very machine
    ort_elsewhere: bool = False     # ... on another machine, its fingerprint recorded
    ort_machine: str = ""           # ... the machine it was trained on, as described
    matrix: bool = False            # a matrix network, its fully connected layers as convs
    recurrent_kept: list[str] = field(default_factory=list)  # recurrent ops left as they are

    @functools.cached_property
    def family(self) -> str:
        """The network's family as calibration offsets group it: ``recurrent`` (recurrent
        layers, unrolled or kept), ``transformer`` (fully connected layers and products of
        two activations: attention), ``mlp`` (fully connected layers, no such product),
        or ``""`` (a conv network)."""
        from dlas_predict.networks.recurrent import is_step_product
        from dlas_predict.networks.summary import NetworkSummary

        if self.recurrent_kept or any(is_step_product(c.name) for c in self.net.convs()):
            return "recurrent"
        if not self.matrix:
            return ""
        return "transformer" if NetworkSummary.of(self.net).nonconv_macs > 0 else "mlp"


def recommend(model: str, device: str = "local", max_accuracy_drop: float = ELBOW_DROP_PP,
              data: str | None = None, top: int = 10, validate: int = 0,
              ratios: tuple[float, ...] = DEFAULT_CURVE_RATIOS, models_dir: Path | None = None,
              log=None, tuning: str = "all", trials: int = 64,
              tuning_db: str | None = None, network_runner=None,
              compressions: tuple[Compression, ...] = tuple(Compression),
              data_options=None, finetune_epochs: int = 0,
              predict_accuracy: bool = True) -> Recommendation:
    """Predict every grid point of ``model`` on ``device``, drop what breaks the accuracy
    budget, rank the rest; with ``validate`` > 0, build and time the top ones (local only)
    with the whole-network runner ``network_runner()`` opens (default: the local CPU's).

    ``tuning`` (untuned | tuned | all) picks the halves of the grid, ``compressions`` its
    rows (dense among them: speedups are relative to it); a tuned candidate also carries the
    predicted search time for ``trials`` trials per kernel. ``data_options``
    (:class:`~dlas_predict.compression.data.DataOptions`): how ``data`` is read;
    ``finetune_epochs``: pruned candidates are measured after that much fine-tuning, masks
    held (a zoo network on its torch definition, an ONNX file imported into torch; on the
    digits training split, or on one half of other ``data``, every candidate then measured
    on the other half); ``predict_accuracy=False``:
    no accuracy-cost model is asked (a caller that needs no accuracy figure)."""
    from dlas_predict.measure.execution.runner import TuningOptions

    t0 = time.time()
    if max_accuracy_drop < 0:
        raise DlasError(f"{param('max_accuracy_drop')} must be >= 0 points, got "
                        f"{max_accuracy_drop}")
    if validate < 0:
        raise DlasError(f"{param('validate')} must be a count >= 0 or 'all', got {validate}")
    if finetune_epochs < 0:
        raise DlasError(f"{param('finetune_epochs')} must be 0 or more epochs, got "
                        f"{finetune_epochs}")
    if finetune_epochs and not data:
        raise DlasError(f"{param('finetune_epochs')} measures the fine-tuned candidates: give "
                        f"{param('data')} (digits: its training split fine-tunes; other "
                        "labelled images: one half fine-tunes, the other is measured)")
    if finetune_epochs and data != "digits":
        from dataclasses import replace

        from dlas_predict.compression.data import DataOptions

        data_options = replace(data_options or DataOptions(), finetune_split=True)
    tuned_opts = TuningOptions(budget=trials, db=tuning_db)  # checks --trials
    if Compression.DENSE not in compressions:
        raise DlasError("the grid's speedups are relative to dense: compressions must "
                        "include dense")
    su = _setup(model, device, validate, models_dir, tuning)
    convs = su.net.convs()
    points = _grid(convs, model, tuple(ratios), su.skipped, tuple(compressions))
    if Tuning.TUNED in su.tunings and not su.info.get("tuned_kernels"):
        whose = (f"{su.mapping.reference}'s cost model (the reference this device is mapped "
                 "from)" if su.mapping is not None else "the cost model of this device")
        su.skipped.append(("tuned", f"{whose} learned from no tuned kernel: collect some "
                           "with `dlas-predict tune --network zoo:resnet18-cifar --store S` "
                           "(a GPU: `dlas-predict bundle ... --trials 8`), then "
                           "`dlas-predict train --store S`"))
        su.tunings = [t for t in su.tunings if t is not Tuning.TUNED]
    if not su.tunings:
        raise DlasError("nothing to recommend: " + su.skipped[-1][1])
    X, kernels, options = _kernel_rows(convs, points, su.tunings, su.feat_dev,
                                       su.layer_model.knows(Algorithm.WINOGRAD.value))
    mid = own = su.layer_model.predict(X)
    low, high = su.layer_model.predict_interval(X)
    if su.mapping is not None:
        mid, low, high = _mapped(su, kernels, mid, low, high)
    searched, ms_trials = searched_trials(su.tuning_model, su.dev.kind == "gpu")
    if searched and searched != trials and Tuning.TUNED in su.tunings:
        also = (f"; where MetaSchedule searches of {ms_trials} trials ran too, the faster "
                "kernel is priced" if ms_trials else "")
        su.notes.append(f"{device}'s tuned kernels come from knob searches of {searched} "
                        f"trials, not {trials}: tuned latencies and search times are for "
                        f"{searched} trials a kernel{also}")
        trials = searched
    # a mapped device's search time is unknown, but for another host of the model's CPU id
    tune_s = tuning_seconds(su.tuning_model, X, kernels, trials) \
        if su.mapping is None or su.ref_dev.fingerprint == su.dev.fingerprint else None
    plans = _plans(points, su.tunings, options, mid, su.skipped)
    cands = _price(plans, su, X, (mid, low, high), tune_s, own)
    _calibrate_networks(cands, su)
    dense = [c for c in cands if c.compression is Compression.DENSE and c.algorithm != PER_LAYER
             and c.tuning is Tuning.UNTUNED] or [
        c for c in cands if c.compression is Compression.DENSE and c.algorithm != PER_LAYER]
    ort = _onnxruntime_candidates(points, su)
    _map_onnxruntime(ort, su, kernels, own, (mid, low, high))
    if su.recurrent_kept and ort:
        su.skipped.append(("tvm (every configuration)", "recurrent layers our kernels cannot "
                           f"build (not unrolled: {'; '.join(su.recurrent_kept)}); "
                           "onnxruntime runs them"))
        cands = []
        dense = [c for c in ort if c.compression is Compression.DENSE]
    elif su.recurrent_kept:
        raise DlasError(f"{su.name} has recurrent layers our kernels cannot build "
                        f"({'; '.join(su.recurrent_kept)}), and the device has no "
                        "onnxruntime model")
    cands += ort
    dense_best = min(c.predicted_s for c in dense)
    dropped: list[tuple[str, str]] = []
    unpredictable = ("its weights are random (nothing to predict from)"
                     if su.entry is not None and not su.entry.trained
                     else None if predict_accuracy else "no accuracy was asked for")
    acc = Accuracies(model, su.entry.name if su.entry else su.name, data, log,
                     unpredictable=unpredictable, options=data_options,
                     finetune_epochs=finetune_epochs)
    kept = _within_budget(cands, acc, max_accuracy_drop, dropped, su)
    reference = next((c for c in ort if c.compression is Compression.DENSE), None)
    _rank(kept, reference)
    if len(su.tunings) == 2:
        su.notes.append(tuning_verdict(kept, trials))
        kept = without_dominated_tuning(kept, su.skipped)
    rec = Recommendation(su.name, su.dev.name, kept, dropped, su.skipped, dense_best, su.info,
                         su.notes)
    rec.reference, rec.family = reference, su.family
    if su.mapping is not None:
        rec.source, rec.mapping = su.mapping.source, su.mapping.to_dict()
        for c in cands:
            if c.backend == "tvm":
                c.source = su.mapping.source
    if validate:
        rec.validated = validate_top(rec, model, su.dev, validate, log, tuned_opts,
                                  network_runner)
    rec.seconds = time.time() - t0
    return rec


#: A candidate predicted less than this much faster than the reference gains nothing the
#: models can tell: it ranks after the reference.
NO_GAIN = 0.01


def _rank(kept: list[Candidate], reference: Candidate | None) -> None:
    """Sort ``kept`` by predicted latency, the reference (onnxruntime fp32; without one,
    the fastest dense candidate) before any candidate predicted less than :data:`NO_GAIN`
    faster and before every candidate whose accuracy is unchecked
    (:attr:`Candidate.unchecked`: what a compression costs is unknown, so it is never the
    first answer); flag each candidate
    ranked before the reference whose 80 % interval reaches the reference's predicted time:
    the model cannot tell that it is faster."""
    if reference is None or not np.isfinite(reference.predicted_s):
        dense = [c for c in kept if c.compression is Compression.DENSE]
        reference = min(dense, key=lambda c: c.predicted_s) if dense else None
    if reference is None:
        kept.sort(key=lambda c: c.predicted_s)
        return
    ref_s = reference.predicted_s

    def key(c: Candidate) -> tuple[float, int, float]:
        if c is not reference and (c.unchecked and c.predicted_s <= ref_s
                                   or (1 - NO_GAIN) * ref_s <= c.predicted_s <= ref_s):
            return ref_s, 1, c.predicted_s
        return c.predicted_s, int(c is not reference), c.predicted_s

    kept.sort(key=key)
    name = "onnxruntime fp32" if reference.backend == "onnxruntime" else reference.label
    for c in kept:
        if c is reference:
            break
        if c.high_s >= ref_s:
            c.warning = (f"not surely faster than {name}: its 80 % interval "
                         f"reaches {c.high_s * 1e3:.3g} ms, the reference is predicted "
                         f"{ref_s * 1e3:.3g} ms")


def _setup(model: str, device: str, validate: int, models_dir: Path | None,
           tuning: str) -> _Setup:
    """Stage 1: the device and its models, the network, and the notes they call for."""
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network
    from dlas_predict.space.devices import get_device

    from dlas_predict.crossdev.transfer import (device_map, foreign_calibration, model_machine,
                                                own_model, reference_dir)

    tunings = Tuning.parse_list(tuning)
    mapping = ref_dev = None
    if models_dir is None and not own_model(device):
        # no model of its own: a reference device's models, mapped (zero-shot or adapted)
        mapping, dev, ref_dev = device_map(device)
        if validate > 0 and not dev.target:
            raise DlasError(f"{param('validate')} measures on the device; {device} is known by "
                            "measurements alone (no target to build for)")
        if validate > 0:
            dev = get_device(device, with_target=True)
    else:
        dev = get_device(device, with_target=validate > 0)
    if validate > 0 and dev.kind == "gpu":
        raise DlasError(f"{param('validate')} builds and times whole networks on this machine's "
                        "CPU; "
                        f"{dev.name} is a GPU, whose whole networks are not built yet")
    # a reference answers with its shipped models, as its data was measured (data_spec)
    models = (load_models(dev.name, models_dir) if ref_dev is None else
              load_models(ref_dev.name, models_dir or reference_dir(ref_dev.name)))
    layer_model, net_model, info = models.layer, models.network, models.info
    tuner = tuning_model(info, models_dir, dev.name)
    path = zoo.resolve(model)
    entry = zoo.get(model) if str(model).startswith(zoo.ZOO_PREFIX) else None
    name = entry.name if entry else Path(path).stem
    net = read_network(path, name)
    notes = []
    original = zoo.resolve(model, grid=False)
    matrix = path != original
    recurrent_kept = []
    if any(layer.kind == "recurrent" for layer in net.layers):
        from dlas_predict.networks.graph import read_proto
        from dlas_predict.networks.recurrent import kept

        recurrent_kept = kept(read_proto(path))
    if matrix:
        steps = any(layer.kind == "recurrent" for layer in read_network(original, name).layers)
        notes.append(f"{name} is a matrix network: its {len(net.convs())} fully connected "
                     + ("layers and recurrent products (every step's, its recurrent layers "
                        "unrolled) " if steps and not recurrent_kept else "layers ")
                     + "run as 1×1 convolutions, priced and built by the grid's conv "
                     "kernels"
                     + ("; the network model of matrix networks prices the rest"
                        if models.matrix_network is not None else
                        f"; no matrix network was measured for {dev.name}'s models, so the "
                        "network model of CNNs prices the rest (attention, normalisation, "
                        "the recurrent steps' gates): unproven for this network, time the "
                        "top rows (--validate)"))
        if models.matrix_network is not None:
            net_model = models.matrix_network
    # the user's own file: the grid form of a matrix network holds its weights reshaped
    matched = zoo.match(original) if entry is None else None
    if matched is not None:
        notes.append(f"{Path(original).name} holds the weights of zoo:{matched.name} (matched "
                     "by hash): its measured accuracy curve applies")
        entry = matched
    if not net.convs():
        raise DlasError(f"{model} has no convolution and no fully connected layer with "
                        "constant weights: the grid (conv and matrix kernels, pruning of "
                        "their weights) does not apply to it"
                        + (f" (its recurrent layers cannot be unrolled into products: "
                           f"{'; '.join(recurrent_kept)})" if recurrent_kept else ""))
    net.one_input(str(model))
    if net.batch != 1:
        raise DlasError(f"{model} has batch {net.batch}; the models predict batch 1")
    if getattr(net_model, "meta_", {}).get("scope") == "conv sum":
        notes.append(f"{dev.name} has no whole-network measurements: each latency is the sum "
                     "of the network's conv kernels as the layer model predicts them (other "
                     "operators and launch gaps left out, so a lower bound of the network)")
    if models_dir is not None and info.get("device_fingerprint") and dev.name == "local" \
            and info["device_fingerprint"] != dev.fingerprint:  # --models of another machine
        notes.append(f"the local model was trained on another machine (fingerprint "
                     f"{info['device_fingerprint']}, this one {dev.fingerprint}); latencies "
                     "are predictions for a machine like that one")
    if mapping is not None:
        what = ("its spec (zero-shot: no measurement of it here; intervals from the map's "
                "leave-one-device-out error)" if mapping.source == "zero-shot" else
                f"{mapping.shots} of its measurements (adapted)")
        elsewhere = (MODELS_STORE / device / "layer.json").is_file()
        why = (f"{dev.name}'s model was trained on another host of this CPU id "
               f"(fingerprint {dev.fingerprint}), and this one is calibrated"
               if elsewhere and model_machine(device) == dev.fingerprint else
               f"{dev.name}'s model was trained on another machine (fingerprint "
               f"{model_machine(device)}; this one is {dev.fingerprint})" if elsewhere
               else f"{dev.name} has no trained model")
        ref_what = ("its models" if ref_dev.fingerprint == dev.fingerprint else
                    f"{ref_dev.name}'s models (trained on {ref_dev.description})"
                    if ref_dev.name == dev.name else f"{ref_dev.name}'s models")
        notes.append(f"{why}: {ref_what} price the grid and each kernel is mapped to "
                     f"{dev.name} by {what}")
        if mapping.source == "zero-shot":
            from dlas_predict.crossdev.transfer import fit_transfer

            note = fit_transfer(dev.kind).note
            if note:
                notes.append(f"the zero-shot map was {note}")
        if mapping.source == "zero-shot" and dev.measured_here:
            notes.append(f"{dev.name} is zero-shot on this CPU: `dlas-predict calibrate` "
                         "measures it in minutes and makes it accurate")
        elif mapping.source == "zero-shot":
            notes.append(f"zero-shot: `dlas-predict active-learn --device {dev.name}` (or "
                         f"`adapt --device {dev.name} --measurements FILE.csv`) makes it "
                         "better")
        foreign = foreign_calibration(device) if mapping.source == "zero-shot" else None
        if foreign:
            notes.append(f"the calibration of {dev.name} in DLAS_HOME was measured on another "
                         f"machine (fingerprint {foreign}; this one is {dev.fingerprint}): "
                         "not used; `dlas-predict calibrate` measures this one")
    elif models_dir is None and dev.measured_here:
        from dlas_predict.crossdev.transfer import roof_drift

        drift = roof_drift(device)
        if drift:
            notes.append(f"{drift}: latencies are predicted for that host; `dlas-predict "
                         "calibrate` measures this one in minutes")
    feat_dev = features_device(ref_dev or dev, info)
    su = _Setup(dev, feat_dev, layer_model, net_model, info, tuner, net, name, entry,
                tunings, notes, mapping=mapping, ref_dev=ref_dev, matrix=matrix,
                recurrent_kept=recurrent_kept)
    _onnxruntime_setup(su, models_dir)
    return su


#: The note on onnxruntime rows priced as another machine's, unscaled.
_ORT_ELSEWHERE = ("the onnxruntime model was trained on another machine ({}); its latencies "
                  "are that machine's")


def _onnxruntime_setup(su: _Setup, models_dir: Path | None) -> None:
    """The device's onnxruntime model (beside its other models), or why there is none."""
    from dlas_predict.models.ortmodel import FILE, OrtLatencyModel

    directory = Path(models_dir) if models_dir else model_dir(su.dev.name)
    if not (directory / FILE).is_file():
        su.skipped.append(("onnxruntime", f"no onnxruntime model for {su.dev.name} in "
                           f"{directory} (onnxruntime is timed on this machine and its "
                           "native-ISA profiles: `dlas-predict collect --whole-network "
                           "--backends onnxruntime`, then `train`)"))
        return
    su.ort_model = OrtLatencyModel.load(directory)
    where = su.ort_model.meta_.get("onnxruntime_fingerprints") or []
    su.ort_here = bool(su.dev.fingerprint and su.dev.fingerprint in where)
    su.ort_machine = su.ort_model.meta_.get("cpu_model") or ", ".join(where)
    su.ort_elsewhere = bool(su.dev.fingerprint and where and not su.ort_here)
    # with a map, :func:`_map_onnxruntime` scales its rows and says so
    if su.mapping is None and su.ort_elsewhere:
        su.notes.append(_ORT_ELSEWHERE.format(su.ort_machine))


def _onnxruntime_candidates(points, su: _Setup) -> list[Candidate]:
    """Each grid point run by onnxruntime, priced by the onnxruntime model: pruned models
    in float32 (channel pruning with its zeroed filters removed), float16, static QDQ int8."""
    if su.ort_model is None or Tuning.UNTUNED not in su.tunings:
        return []
    from dlas_predict.networks.summary import NetworkSummary
    from dlas_predict.models.ortmodel import OrtInputs, model_mode, nchwc_block, ort_terms
    from dlas_predict.networks.matrix import is_matrix_layer
    from dlas_predict.networks.recurrent import is_step_product

    su.skipped.extend((f"{p.compression.value}@{p.ratio:g} onnxruntime",
                       "no zeroed filter could be removed: onnxruntime runs the dense network, "
                       "less accurate" if p.nothing_removed else "onnxruntime has no sparse "
                       "kernel: a weight-pruned model runs as fast as the dense one there, "
                       "less accurate") for p in points
                      if p.nothing_removed or p.compression is Compression.WEIGHT_PRUNING)
    points = [p for p in points if p.compression is not Compression.WEIGHT_PRUNING
              and not p.nothing_removed]
    convs = su.net.convs()
    specs = [c.spec for c in convs]
    matrix = [is_matrix_layer(c.name) for c in convs]
    summary = NetworkSummary.of(su.net)
    modes = [model_mode(p.compression) for p in points]
    block = nchwc_block(su.dev)
    steps = [is_step_product(c.name) for c in convs]
    # a channel-pruned matrix network runs as its grid form (1×1 convs): a CNN's terms
    X = np.array([ort_terms(p.specs or specs, p.layer_ratios, p.summary or summary, mode,
                            False, block, *((None, None) if mode == "channel_pruning"
                                            else (matrix, steps)), su.ort_model.l2_bytes)
                  for p, mode in zip(points, modes)])
    recurrent = any(steps)
    inputs = OrtInputs(X, modes, (recurrent,) * len(X), (any(matrix),) * len(X))
    mid, low, high = su.ort_model.predict_all(inputs)
    fixed = su.ort_model.fixed_share(inputs)
    return [Candidate(p.compression, p.ratio, ONNXRUNTIME, (), float(m), float(lo), float(hi),
                      fixed_share=float(f), ort_mode=mode)
            for p, m, lo, hi, f, mode in zip(points, mid, low, high, fixed, modes)]


def _map_onnxruntime(ort: list[Candidate], su: _Setup, kernels: list[tuple], own,
                     mapped: tuple) -> None:
    """Where the layer model is a reference device's, mapped to this one, and onnxruntime's
    model was trained on that reference, not here: each onnxruntime row is scaled by the
    network's own ratio of mapped to reference time of its dense float32 untuned kernels
    (every algorithm, summed), so that both backends move together, and its interval widens
    by the map's. One ratio for every mode: onnxruntime's CPU kernels are not ours, and its
    float16 runs in float32 between casts. onnxruntime runs each CPU's own instruction set,
    so where ours are built for another on either machine (a profile of a lower x86-64
    level, or ``DLAS_FORCE_ISA``), the work in its prediction (not its per-op costs,
    :meth:`~dlas_predict.models.ortmodel.OrtLatencyModel.fixed_share`) also moves by the
    map's compute term between the two
    (:func:`~dlas_predict.crossdev.transfer.onnxruntime_roof_ratio`). Rows so priced are
    the map's (zero-shot or adapted)."""
    from dlas_predict.crossdev.offsets import scaled_by_parts
    from dlas_predict.crossdev.transfer import onnxruntime_roof_ratio

    if su.mapping is None or su.ort_model is None \
            or (su.ort_here and not su.mapping.onnxruntime_offsets):
        return
    if ort and su.mapping.onnxruntime_offsets:  # calibrated here: not our kernels' ratio
        _calibrate_onnxruntime(ort, su)
        return
    rows = [i for i, k in enumerate(kernels)
            if k[2] is Compression.DENSE and k[4] is Tuning.UNTUNED]
    own = np.asarray(own, float)[rows]
    mid, low, high = (np.asarray(a, float)[rows] for a in mapped)
    if not ort or not rows or own.sum() <= 0 or mid.sum() <= 0:
        if su.ort_elsewhere:  # not scaled: as without a map
            su.notes.append(_ORT_ELSEWHERE.format(su.ort_machine))
        return
    # onnxruntime runs each CPU's own instruction set, whatever code our kernels are built
    # for: the map's compute term between the two instruction sets, on each side, moves
    # its work; its per-op costs (the model's fixed terms) are no wider on wider vectors
    isa = (onnxruntime_roof_ratio(su.ref_dev) / onnxruntime_roof_ratio(su.dev)) \
        ** su.mapping.alpha
    r = mid.sum() / own.sum()
    lo, hi = min(low.sum() / mid.sum(), 1.0), max(high.sum() / mid.sum(), 1.0)
    for c in ort:
        f = r * scaled_by_parts(1.0, c.fixed_share or 0.0, (1.0, isa))
        c.basis_s = c.predicted_s
        c.predicted_s, c.low_s, c.high_s = c.predicted_s * f, c.low_s * f * lo, c.high_s * f * hi
        c.source = su.mapping.source
    own_isa = (f", and its work (not its per-op costs) by ×{isa:.2f} for the instruction "
               "sets onnxruntime runs there and here (each CPU's own, not our kernels' "
               "code)" if abs(isa - 1) > 0.02 else "")
    su.notes.append(f"the onnxruntime model was trained on another machine "
                    f"({su.ort_machine}): its latencies are scaled by ×{r:.2f}, this "
                    f"network's ratio of its dense float32 kernels' times mapped to "
                    f"{su.dev.name} to that machine's ({su.mapping.source}){own_isa}")


def _offset_rows(cands: list[Candidate], offsets: list[float], q: tuple[float, float],
                 source: str) -> None:
    """Each candidate's prediction moved by its calibrated log offset; its interval is the
    calibration's own 10-90 % error on this machine (``q``, log), not the reference
    model's, which is of another machine's spread and far wider than the calibrated
    error."""
    for c, off in zip(cands, offsets):
        f = float(np.exp(off))
        c.basis_s = c.predicted_s
        c.predicted_s *= f
        c.low_s = c.predicted_s * float(np.exp(min(q[0], 0.0)))
        c.high_s = c.predicted_s * float(np.exp(max(q[1], 0.0)))
        c.source = source


def _calibrate_networks(cands: list[Candidate], su: _Setup) -> None:
    """A calibrated map's whole-network offsets on our builds (by compression; mixed
    per-layer plans apart)."""
    m = su.mapping
    if m is None or not m.network_offsets:
        return
    _offset_rows(cands, [m.network_offset(c.compression.value, c.mixed, su.family)
                         for c in cands],
                 tuple(m.network_q), m.source)
    su.notes.append(f"{su.dev.name} is calibrated on this machine: our builds' latencies "
                    "are moved by the offsets its whole networks were measured at, by "
                    "network family and compression, mixed per-layer plans apart")


def _calibrate_onnxruntime(ort: list[Candidate], su: _Setup) -> None:
    """onnxruntime rows priced by the reference's onnxruntime model, its per-op costs and
    the rest each scaled by its calibrated scale, and moved by the offsets of its runs
    here, by network family and mode (fp32, float16, int8, channel-pruned): its kernels
    are not ours, so our kernels' map does not move them."""
    from dlas_predict.crossdev.offsets import scaled_by_parts
    from dlas_predict.models.ortmodel import model_mode

    m = su.mapping
    _offset_rows(ort, [float(np.log(scaled_by_parts(1.0, c.fixed_share or 0.0,
                                                    m.onnxruntime_scales)))
                       + m.onnxruntime_offset(c.ort_mode or model_mode(c.compression),
                                              su.family)
                       for c in ort],
                 tuple(m.onnxruntime_q), m.source)
    su.notes.append(f"onnxruntime rows: its model of {su.ort_machine or 'another machine'}, "
                    "its per-op costs and the rest scaled apart, then moved by the offsets "
                    "of onnxruntime's runs on this machine, by network family and mode "
                    "(calibrated)")


def _mapped(su: _Setup, kernels: list[tuple], mid, low, high):
    """The reference device's kernel latencies mapped to the device."""
    return su.mapping.map_kernels(su.ref_dev, su.dev,
                                  [(k[0].to_spec(), k[1].value, k[2].value) for k in kernels],
                                  mid, low, high)


#: Feature rows by (device, kernel): a batch of networks shares most of its layers.
_FEATURES: dict[tuple, list[float]] = {}
_FEATURES_MAX = 200_000


def _kernel_rows(convs, points, tunings: list[Tuning], feat_dev, winograd: bool = False):
    """Stage 2: one feature row per distinct (layer, algorithm, kernel) the grid needs; with
    ``winograd`` (a layer model that learned it), a layer's untuned dense kernels include
    Winograd's where it applies.

    Returns the feature matrix, each row's (spec, algorithm, compression, ratio, tuning),
    and per (grid point, tuning) the options of every layer."""
    from dlas_predict.compression.netplan import layer_kernel, layer_sparse
    from dlas_predict.models.features import features
    from dlas_predict.corpus.kernels import KernelConfig

    rows: dict[tuple, int] = {}
    X: list = []
    kernels: list[tuple] = []
    dev_key = repr(feat_dev)
    if len(_FEATURES) > _FEATURES_MAX:
        _FEATURES.clear()

    def row(spec, alg: Algorithm, comp: Compression, ratio: float, tn: Tuning) -> int:
        key = (spec, alg, comp, ratio, tn)
        if key not in rows:
            rows[key] = len(X)
            kernels.append(key)
            memo = (dev_key, key)
            if memo not in _FEATURES:
                _FEATURES[memo] = features(KernelConfig(*key), feat_dev)
            X.append(_FEATURES[memo])
        return rows[key]

    options: list[tuple[Tuning, list[list[LayerOption]]]] = []
    layer_opts: dict[tuple, list[LayerOption]] = {}
    for tn in tunings:
        for p in points:
            per_layer = []
            for i, lr in enumerate(p.layer_ratios):
                spec = p.specs[i] if p.specs else convs[i].spec
                sparse = layer_sparse(p.compression, lr)
                comp, lr = layer_kernel(p.compression, lr if sparse else 0.0)
                same = (spec, comp, lr, tn)  # layers of one shape share options
                opts = layer_opts.get(same)
                if opts is None:
                    opts = [LayerOption(a.value, sparse, row(spec, a, comp, lr, tn))
                            for a in GRID_ALGORITHMS]
                    if sparse:  # a pruned layer may also run the dense kernel on its zeros
                        opts += [LayerOption(a.value, False,
                                             row(spec, a, Compression.DENSE, 0.0, tn))
                                 for a in GRID_ALGORITHMS]
                    dense = Compression.DENSE if sparse else comp
                    if winograd and winograd_skip(spec, dense, feat_dev.kind, tn) is None:
                        opts.append(LayerOption(Algorithm.WINOGRAD.value, False,
                                                row(spec, Algorithm.WINOGRAD, dense, 0.0, tn)))
                    layer_opts[same] = opts
                per_layer.append(opts)
            options.append((tn, per_layer))
    return np.array(X), kernels, options


def _plans(points, tunings: list[Tuning], options, mid: np.ndarray,
           skipped: list[tuple[str, str]]) -> list[Plan]:
    """Stage 3: each grid point's uniform plans (one algorithm everywhere) and its per-layer
    plan (each layer on its fastest predicted kernel)."""
    from dlas_predict.compression.netplan import config_label

    plans = []
    by_kind: dict[int, dict] = {}   # each (shared) option list by (algorithm, sparse)
    fastest: dict[int, LayerOption] = {}
    for (p, (tn, per_layer)) in zip(points * len(tunings), options):
        comp, ratio = p.compression, p.ratio
        for opts in per_layer:
            if id(opts) not in by_kind:
                by_kind[id(opts)] = {(o.algorithm, o.sparse): o for o in reversed(opts)}
                fastest[id(opts)] = min(opts, key=lambda o: mid[o.row])
        for a in GRID_ALGORITHMS:  # CSR on each layer that has a CSR option, as the study ran it
            chosen = tuple(by_kind[id(opts)].get((a.value, True))
                           or by_kind[id(opts)][a.value, False] for opts in per_layer)
            plans.append(Plan(comp, ratio, a.value, chosen, tn, p.summary))
        best = tuple(fastest[id(opts)] for opts in per_layer)
        if (comp is Compression.WEIGHT_PRUNING or p.nothing_removed) and \
                not any(o.sparse for o in best):
            skipped.append((f"{config_label(comp, ratio)} {PER_LAYER}"
                            + (" tuned" if tn is Tuning.TUNED else ""),
                            ("no zeroed filter could be removed and " if p.nothing_removed
                             else "") + "every layer is predicted fastest on a dense kernel: "
                            "the same network as dense per_layer, less accurate"))
        else:
            plans.append(Plan(comp, ratio, PER_LAYER, best, tn, p.summary))
    return plans


def _price(plans: list[Plan], su: _Setup, X: np.ndarray, layer_pred, tune_s,
           own: np.ndarray) -> list[Candidate]:
    """Stage 4: the network model's latency (and interval) of every plan, and the predicted
    search time of the tuned ones. ``own``: the layer model's kernel times on its own device
    (``layer_pred``'s middle where the device is not mapped), which the network model's
    correction reads."""
    from dlas_predict.models.features import FEATURE_NAMES, weight_bytes
    from dlas_predict.models.netmodel import NetworkInputs, net_features, net_terms
    from dlas_predict.networks.summary import NetworkSummary

    mid, low, high = layer_pred
    conv_mid = np.array([sum(mid[o.row] for o in p.layers) for p in plans])
    conv_low = np.array([sum(low[o.row] for o in p.layers) for p in plans])
    conv_high = np.array([sum(high[o.row] for o in p.layers) for p in plans])
    wbytes = weight_bytes(X)
    sparsity = X[:, FEATURE_NAMES.index("sparsity")]
    summary = NetworkSummary.of(su.net)
    cache, corrected = su.net_model.cache_bytes, su.net_model.corrected
    NX, NF, NO = [], [], []
    for p in plans:
        kinds = [(o.algorithm, o.sparse) for o in p.layers]
        wb = [wbytes[o.row] for o in p.layers]
        NX.append(net_terms(p.summary or summary, [mid[o.row] for o in p.layers], p.compression,
                            kinds, wb, cache))
        if not corrected:  # only the correction reads the features and own-device terms
            continue
        mine = [float(own[o.row]) for o in p.layers]
        NO.append(NX[-1] if su.mapping is None else
                  net_terms(p.summary or summary, mine, p.compression, kinds, wb, cache))
        NF.append(net_features(p.summary or summary, sum(mine), p.compression, kinds,
                               [float(sparsity[o.row]) for o in p.layers], su.feat_dev))
    inputs = NetworkInputs(np.array(NX), conv_mid, conv_low, conv_high,
                           np.array(NF) if corrected else None,
                           np.array(NO) if corrected else None)
    pm = su.net_model.predict(inputs)
    pl, ph = su.net_model.predict_interval(inputs)
    cands = []
    for p, m, lo, hi, cs in zip(plans, pm, pl, ph, conv_mid):
        search = None
        if p.tuning is Tuning.TUNED and tune_s is not None:  # each distinct kernel tuned once
            search = float(sum(tune_s[r] for r in {o.row for o in p.layers}))
        cands.append(Candidate(p.compression, p.ratio, p.algorithm,
                               tuple((o.algorithm, o.sparse) for o in p.layers),
                               float(m), float(lo), float(hi), tuning=p.tuning,
                               tuning_s=search, conv_s=float(cs)))
    return cands


def _within_budget(cands: list[Candidate], acc: Accuracies, max_accuracy_drop: float,
                   dropped: list[tuple[str, str]], su: _Setup) -> list[Candidate]:
    """Stage 5: each candidate's accuracy; those over the budget are dropped with the reason
    (a predicted drop is checked at its 80 % interval's upper end: kept with 90 %
    confidence)."""
    acc.measure_all(dict.fromkeys((c.compression, c.ratio) for c in cands))
    kept = []
    unknown = 0
    for c in cands:
        fig = acc.get(c.compression, c.ratio)
        c.accuracy, c.accuracy_source, c.accuracy_drop_pp = fig.value, fig.source, fig.drop_pp
        c.accuracy_drop_high_pp = fig.high_pp
        drop = fig.checked_drop
        if drop is not None and drop > max_accuracy_drop + 1e-9:
            what = ("predicted drop up to" if fig.high_pp is not None else "accuracy drop")
            dropped.append((c.label, f"{what} {drop:.1f} points > {max_accuracy_drop:g}"))
            continue
        if c.unchecked:
            unknown += 1
        kept.append(c)
    if unknown:
        su.notes.append(f"{unknown} candidates have no accuracy figure: they are kept but "
                        "unchecked against the accuracy budget, and ranked after the dense "
                        "reference however fast; pass --data digits|PATH to measure")
    if su.entry is not None and not su.entry.trained:
        su.notes.append("this zoo network has random weights (nothing can be downloaded): "
                        "accuracy figures for it are chance level")
    return kept
