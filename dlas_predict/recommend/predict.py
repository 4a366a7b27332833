"""Batch prediction on any device, and few-shot adaptation from a user's measurements.

A device is answered from the cross-device model of the data source its targets belong to:

- single convolutions (``conv:C=..,H=..``) from the kernel corpora: the profiles of this
  CPU (untuned kernels of our three algorithms) for x86 devices, TopHub (tuned kernels) for
  the others;
- NAS-Bench-201 networks (``nasbench201:ARCH``, or a file ``generate nasbench201`` wrote)
  from HELP's 21 devices.

The latency's source says how the device is known: ``trained`` (the device is one of the
source's devices: its loading was fitted on its own data), ``adapted`` (``adapt`` fitted it
from the user's measurements; saved under ``DLAS_HOME/adapted``) or ``zero-shot`` (its
spec, or the mean device). Any other whole network (an ONNX file, ``zoo:NAME``) is priced
by ``recommend``'s engine (the device's models, or a reference's mapped to it:
:func:`predict_network`), or, on a device adapted on another runtime's whole networks and
on HELP's devices, from its layers by kind (:mod:`~dlas_predict.crossdev.layerwise`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from dlas_predict.crossdev.evaluate import placed_zero_shot
from dlas_predict.crossdev.latent import (DevicePosterior, LatentModel, interval_scale, select,
                                          zero_shot_scale)
from dlas_predict.models.base import Z80
from dlas_predict.crossdev.sources import LatencyMatrix, load
from dlas_predict.errors import ConfigError, DeviceError, DlasError, param
from dlas_predict.paths import cache_dir
from dlas_predict.space.config import ELBOW_DROP_PP
from dlas_predict.crossdev.adapted import read_adapted

#: The answer of a device adapted on whole networks of another runtime, or one HELP
#: measured, for any network: its layers priced by kind (:mod:`~dlas_predict.crossdev.layerwise`).
LAYERWISE = "layerwise"
#: The runtimes our engine prices itself.
ENGINE_RUNTIMES = ("tvm", "onnxruntime")
MIN_ROWS = 3
DISAGREE = 2.0


@dataclass(frozen=True)
class Target:
    """What to predict: a conv, a NAS-Bench-201 cell, or another network."""

    text: str
    kind: str       # "conv" | "nasbench201" | "network"
    key: str        # the conv's canonical spec, the architecture string, or the model


@dataclass(frozen=True)
class ConfigChoice:
    """``COMPRESSION[@RATIO][/ALGORITHM][/tuned]``; None parts are chosen (the fastest)."""

    compression: str | None = None
    ratio: float | None = None
    algorithm: str | None = None
    tuning: str | None = None

    @property
    def text(self) -> str:
        out = self.compression or "*"
        if self.ratio:
            out += f"@{self.ratio:g}"
        return out + f"/{self.algorithm or '*'}" + (f"/{self.tuning}" if self.tuning else "")


@dataclass
class Prediction:
    target: str
    config: str
    predicted_ms: float
    low_ms: float
    high_ms: float
    source: str
    basis: str
    #: The runtime whose latency this is: ``tvm`` (our builds), ``onnxruntime``, or the
    #: runtime a device was adapted on (whatever the measurements' ``runtime`` column said).
    runtime: str = "tvm"

    def to_dict(self) -> dict:
        return asdict(self)


def parse_target(text: str) -> Target:
    """``conv:SPEC``, ``nasbench201:ARCH`` or a ``generate nasbench201`` file; anything
    else is named as not (yet) predictable across devices."""
    from dlas_predict.space.config import ConvSpec
    from dlas_predict.networks.nasbench201 import parse_arch

    t = text.strip()
    if t.startswith("conv:"):
        return Target(text, "conv", ConvSpec.parse(t[5:]).to_spec())
    if t.startswith("nasbench201:"):
        return Target(text, "nasbench201", parse_arch(t[len("nasbench201:"):]).string)
    name = Path(t).name
    if name.startswith("nasbench201-") and name.endswith(".onnx"):
        arch = _arch_of_file(Path(t))
        return Target(text, "nasbench201", arch)
    from dlas_predict.networks import zoo

    if t.startswith(zoo.ZOO_PREFIX):
        zoo.get(t)  # an unknown name is an error that lists the zoo
        return Target(text, "network", t)
    if t.endswith(".onnx"):
        if not Path(t).is_file():
            raise ConfigError(f"network file not found: {t}")
        return Target(text, "network", t)
    raise ConfigError(f"cannot predict {text!r}: targets are conv:C=..,H=..,W=..,K=..,R=..,"
                      "S=..[,stride=..][,pad=..][,groups=..], nasbench201:ARCH, an ONNX file "
                      "or zoo:NAME")


def _arch_of_file(path: Path) -> str:
    from dlas_predict.networks.nasbench201 import parse_arch

    if path.is_file():
        try:
            import onnx
            doc = onnx.load(str(path), load_external_data=False).graph.doc_string
            if doc:
                return parse_arch(doc).string
        except Exception:  # noqa: BLE001 - an unreadable file falls back to its name
            pass
    return parse_arch(path.name).string


def parse_config(text: str | None) -> ConfigChoice:
    """``COMPRESSION[@RATIO][/ALGORITHM][/tuned]``; ``*`` or an omitted part: choose."""
    from dlas_predict.space.config import Compression, PlanAlgorithm

    if text is None or not text.strip():
        return ConfigChoice()
    t = text.strip().lower()
    parts = t.split("/")
    comp = parts[0]
    ratio = None
    if "@" in comp:
        comp, r = comp.split("@", 1)
        try:
            ratio = float(r)
        except ValueError:
            raise ConfigError(f"config {text!r}: ratio {r!r} is not a number") from None
        if not 0 < ratio < 1:
            raise ConfigError(f"config {text!r}: a pruning ratio lies in (0, 1)")
    alg = tuning = None
    for p in parts[1:]:
        if p in ("tuned", "untuned"):
            tuning = p
        elif p in ("*", ""):
            continue
        else:
            alg = PlanAlgorithm.parse(p).value
    comp_v = None if comp in ("*", "") else Compression.parse(comp).value
    if ratio is not None and comp_v not in ("weight_pruning", "channel_pruning"):
        raise ConfigError(f"config {text!r}: only weight_pruning and channel_pruning take a "
                          "ratio")
    return ConfigChoice(comp_v, ratio, alg, tuning)


# ---- the bases ------------------------------------------------------------------------------
def _basis_of(target: Target, device: str) -> tuple[str, str]:
    """(source, level) that answers ``target`` on ``device``: HELP for NAS-Bench-201 cells
    on HELP's devices and devices adapted on them, the grid engine (``recommend``'s models)
    for every other network, the kernel data for convs."""
    if target.kind in ("nasbench201", "network"):
        adapted = read_adapted(device)
        if adapted is not None and adapted["source"] == LAYERWISE:
            return LAYERWISE, "network"
        if target.kind == "nasbench201" and (
                _help_device(device) or (adapted is not None and adapted["source"] == "help")):
            return "help", "network"
        if target.kind == "network" and _help_device(device):
            return LAYERWISE, "network"  # HELP measured it: its costs per layer kind
        return "engine", "network"
    from dlas_predict.crossdev.transfer import of_this_machine, own_model
    from dlas_predict.space.devices import get_device

    if own_model(device):
        return "engine", "kernel"  # the device's own layer model
    if of_this_machine(device):
        # this CPU (or a profile of it) whose shipped data and model are another machine's:
        # a trained reference mapped to it, zero-shot or by its adapted map, as `recommend`
        # prices it (the kernel data's column of that name is the other machine)
        return "engine", "kernel"
    adapted = read_adapted(device)
    if adapted is not None and adapted["level"] == "kernel":
        return adapted["source"], adapted["level"]
    if device in _registry():
        if getattr(get_device(device, with_target=False), "tophub_model", None) \
                and _tophub_found():
            return "tophub", "kernel"  # TopHub measured it: its own (tuned) kernels
        return "engine", "kernel"  # a trained reference, mapped by the spec (zero-shot)
    return ("profiles" if is_x86(device) else "tophub"), "kernel"


def _tophub_found() -> bool:
    """Whether TopHub's logs are in the public data folder (else a TopHub device's convs
    are priced as any registry device's: a trained reference, mapped)."""
    from dlas_predict.crossdev.sources import shared_folder

    try:
        shared_folder("tophub", None)
    except DlasError:
        return False
    return True


def _registry() -> list[str]:
    from dlas_predict.space.devices import device_names
    return device_names()


def _check_known(device: str) -> None:
    """A device is a registry entry, one HELP measured, or one `adapt` fitted."""
    if device in _registry() or _help_device(device) or read_adapted(device) is not None:
        return
    raise DeviceError(f"unknown device {device!r}: it has neither a spec (`devices add`) nor "
                      f"measurements (`adapt --device {device} --measurements FILE.csv`)")


def _help_device(device: str) -> bool:
    return device not in _registry() and device in _help_devices()


def _help_devices() -> frozenset[str]:
    from dlas_predict.paths import shared_data
    from dlas_predict.publicdata import fetched_root

    return _help_devices_in(str(shared_data()), str(fetched_root()))


@functools.lru_cache(maxsize=4)
def _help_devices_in(shared: str, fetched: str) -> frozenset[str]:
    """HELP's devices, in whichever public data folder holds its table (the arguments key
    the cache: where the folders are)."""
    try:
        from dlas_predict.crossdev.sources import help_table
        return frozenset(help_table(None).device.unique())
    except DlasError:
        return frozenset()


def is_x86(device: str) -> bool:
    from dlas_predict.space.devices import device_names, get_device

    if device not in device_names():
        return True
    d = get_device(device, with_target=False)
    triple = str(d.target.get("mtriple", "")) or str(d.target.get("host", {}).get("mtriple", ""))
    return d.kind == "cpu" and (triple.startswith("x86") or d.measured_here)


@functools.lru_cache(maxsize=8)
def basis(source: str, level: str, data: str | None = None) -> tuple[LatencyMatrix, LatentModel]:
    """The source's matrix and its model fitted on every device; the inner choice of (k,
    noise) and the intervals' scale are cached under DLAS_HOME by the data's shape."""
    mat = load(source, level, Path(data) if data else None)
    key = (f"{source}-{level}-{len(mat.targets)}x{len(mat.devices)}-"
           f"{int(np.isfinite(mat.log_ms).sum())}-scaled-zero-shot-spreads")
    path = cache_dir("crossdev") / "selection.json"
    try:
        chosen = json.loads(path.read_text())
    except (OSError, ValueError):
        chosen = {}
    if key not in chosen:
        k, noise = select(mat)
        chosen[key] = [k, noise, interval_scale(mat, k, noise),
                       zero_shot_scale(mat, k, noise, placed_zero_shot)]
        path.write_text(json.dumps(chosen, indent=1))
    k, noise, scale, zero_scale = chosen[key]
    model = LatentModel().fit_at(mat, int(k), float(noise))
    model.interval_scale_, model.zero_shot_scale_ = float(scale), float(zero_scale)
    return mat, model


def posterior_of(device: str, source: str, level: str, mat: LatencyMatrix,
               model: LatentModel) -> DevicePosterior:
    adapted = read_adapted(device)
    if adapted is not None and adapted["source"] == source and adapted.get("targets"):
        rows, y = rows_of(mat, model, adapted["targets"]), np.array(adapted["log_ms"])
        return model.adapt(rows, y, placed_zero_shot(model, device))
    if device in model.devices_:
        j = model.devices_.index(device)
        return DevicePosterior(model.loadings_[j], np.zeros_like(model.prior_cov_), "trained",
                               int(np.isfinite(mat.column(device)).sum()))
    from dlas_predict.space.devices import device_names

    if device not in device_names():
        if adapted is not None:
            raise DeviceError(f"device {device!r} was adapted on {adapted['source']}'s "
                              f"{adapted['level']}s only; adapt it on {source}'s "
                              f"{level}s too (`adapt --device {device} --measurements "
                              "FILE.csv`)")
        raise DeviceError(f"unknown device {device!r}: it has neither a spec (`devices add`) "
                          f"nor measurements (`adapt --device {device} --measurements "
                          "FILE.csv`)")
    return placed_zero_shot(model, device)


def rows_of(mat: LatencyMatrix, model: LatentModel, keys: list[str]) -> np.ndarray:
    """z of target keys: learned rows where the matrix has them, else from features."""
    idx = [model.index_.get(k) for k in keys]
    if all(i is not None and np.isfinite(model.Z_[i]).all() for i in idx):
        return model.Z_[np.array(idx)]
    if mat.level != "kernel":
        missing = next(k for k, i in zip(keys, idx) if i is None)
        raise DlasError(f"{missing!r} is not in {mat.source}'s data")
    return np.vstack([model.Z_[i] if i is not None and np.isfinite(model.Z_[i]).all()
                      else _kernel_z(model, k) for k, i in zip(keys, idx)])


def _kernel_z(model: LatentModel, key: str) -> np.ndarray:
    from dlas_predict.crossdev.sources import kernel_features
    from dlas_predict.space.config import ConvSpec

    conv, alg, comp, tuning = key.split("|")
    comp, _, ratio = comp.partition("@")
    spec = ConvSpec.parse(conv)
    f = kernel_features([spec], [alg if alg != "tuned" else "direct"], [comp],
                         [float(ratio or 0)])
    z = model.z_from_features(f)[0]
    group = f"{comp}/{alg}" if model.source_ == "profiles" else comp
    g = [float(group == n) for n in model.group_names_[1:]]
    return np.r_[z, g]


# ---- predict ------------------------------------------------------------------------------
def _kernel_keys(mat: LatencyMatrix, spec: str, cfg: ConfigChoice) -> list[str]:
    """The kernel targets ``cfg`` allows for one conv: every (algorithm, compression,
    tuning) the source knows; pruning at the ratio named, else the study's 0.9."""
    from dlas_predict.space.config import DEFAULT_RATIO

    variants = sorted({(alg, comp.partition("@")[0], tuning) for alg, comp, tuning in
                       (t.split("|")[1:] for t in mat.targets)})
    out = []
    for alg, comp, tuning in variants:
        if cfg.compression and comp != cfg.compression:
            continue
        if cfg.algorithm and alg not in (cfg.algorithm, "tuned"):
            continue
        if cfg.tuning and tuning != cfg.tuning:
            continue
        tag = f"{comp}@{cfg.ratio or DEFAULT_RATIO:g}" if comp.endswith("_pruning") else comp
        out.append(f"{spec}|{alg}|{tag}|{tuning}")
    if not out:
        raise ConfigError(f"config {cfg.text} is not in {mat.source}'s grid; it has: "
                          + ", ".join(sorted({_config_of("|".join(v)) for v in variants})))
    return out


def _config_of(variant: str) -> str:
    alg, comp, tuning = variant.split("|")
    return f"{comp}/{alg}/{tuning}" if alg != "tuned" else f"{comp}/tuned"


def predict(targets: list[str], device: str, config: str | None = None,
            data: Path | None = None, runtime: str | None = None,
            max_accuracy_drop: float = ELBOW_DROP_PP) -> list[Prediction]:
    """Predicted latency of each target on ``device`` (the fastest allowed configuration
    where ``config`` leaves a part open; where it names no compression, a network's within
    ``max_accuracy_drop`` points of top-1, as `recommend` ranks it), in ``runtime``
    (default: the runtime the device was adapted on, else our TVM builds or onnxruntime as
    ``config`` names)."""
    if not max_accuracy_drop >= 0:
        raise ConfigError(f"the accuracy budget must be >= 0 points, got {max_accuracy_drop}")
    cfg = parse_config(config)
    if runtime == "onnxruntime" and cfg.algorithm in (None, "onnxruntime"):
        cfg = replace(cfg, algorithm="onnxruntime")
    elif runtime == "tvm" and cfg.algorithm == "onnxruntime":
        raise ConfigError(f"{param('runtime')} tvm prices our builds; the config names onnxruntime")
    parsed = [parse_target(t) for t in targets]
    _check_known(device)
    out: list[Prediction | None] = [None] * len(parsed)
    groups: dict[tuple[str, str], list[int]] = {}
    route: dict[str, tuple[str, str]] = {}  # by target kind: the same for every target
    for i, t in enumerate(parsed):
        if t.kind not in route:
            route[t.kind] = _runtime_route(_basis_of(t, device), device, cfg, runtime)
        groups.setdefault(route[t.kind], []).append(i)
    for (source, level), idx in groups.items():
        if source == LAYERWISE:
            for i in idx:
                out[i] = _predict_layerwise(parsed[i], device, cfg, data)
            continue
        if source == "engine":
            for i, pred in zip(idx, _engine([parsed[i] for i in idx], device, cfg, level,
                                            tvm_only=runtime == "tvm",
                                            max_accuracy_drop=max_accuracy_drop)):
                out[i] = pred
            continue
        mat, model = basis(source, level, str(data) if data else None)
        post = posterior_of(device, source, level, mat, model)
        if level == "network":
            if cfg.compression not in (None, "dense") or cfg.algorithm or cfg.tuning:
                raise ConfigError("NAS-Bench-201 latencies (HELP) are of dense float32 "
                                  "networks in their framework; the config is dense")
            keys = [parsed[i].key for i in idx]
            Z = rows_of(mat, model, keys)
            mean, sd = model.predict(post, Z=Z)
            for j, i in enumerate(idx):
                out[i] = _prediction(parsed[i].text, "dense", mean[j], sd[j], post, source)
            continue
        for i in idx:
            keys = _kernel_keys(mat, parsed[i].key, cfg)
            mean, sd = model.predict(post, Z=rows_of(mat, model, keys))
            b = int(np.argmin(mean))
            out[i] = _prediction(parsed[i].text, _config_of(keys[b].split("|", 1)[1]),
                                 mean[b], sd[b], post, source)
    return [p for p in out if p is not None]


#: Distinct networks a batch needs before ``predict`` shares it among this machine's cores.
PARALLEL_FROM = 32

_FORKED: tuple | None = None  # (the pricing function, the targets) of the batch being shared


def _price_forked(i: int) -> Prediction:
    one, targets = _FORKED  # type: ignore[misc]
    return one(targets[i])


def _engine(targets: list[Target], device: str, cfg: ConfigChoice,
            level: str, tvm_only: bool = False,
            max_accuracy_drop: float = ELBOW_DROP_PP) -> list[Prediction]:
    """Each target priced by the grid engine, a repeated one once. A batch of at least
    :data:`PARALLEL_FROM` distinct networks per core is shared among the cores: the first
    network is priced here (loading the models), then forked processes, which inherit
    them, price the rest."""
    from dlas_predict.space.devices import local_cores

    one = functools.partial(predict_network, device=device, cfg=cfg, tvm_only=tvm_only,
                            max_accuracy_drop=max_accuracy_drop) \
        if level == "network" else functools.partial(_predict_conv, device=device, cfg=cfg)
    first: dict[tuple[str, str], int] = {}
    for i, t in enumerate(targets):
        first.setdefault((t.kind, t.key), i)
    distinct = list(first.values())
    workers = min(local_cores(), len(distinct) // PARALLEL_FROM) if level == "network" else 1
    priced = {distinct[0]: one(targets[distinct[0]])}
    rest = distinct[1:]
    if workers >= 2:
        import multiprocessing

        global _FORKED
        _FORKED = (one, targets)  # what the forked processes price: inherited, not sent
        try:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                priced.update(zip(rest, pool.map(_price_forked, rest, chunksize=max(
                    1, len(rest) // (4 * workers)))))
        finally:
            _FORKED = None
    else:
        priced.update((i, one(targets[i])) for i in rest)
    return [replace(priced[first[(t.kind, t.key)]], target=t.text) for t in targets]


def _network_file(t: Target) -> str:
    """An ONNX file or zoo name for the engine (NAS-Bench-201 cells are generated into
    DLAS_HOME's cache once)."""
    if t.kind != "nasbench201":
        return t.key
    from dlas_predict.networks import nasbench201 as nb

    arch = nb.parse_arch(t.key)
    path = cache_dir("nasbench201") / arch.file_name
    if not path.is_file():
        nb.generate([arch], path.parent)
    return str(path)


def predict_network(t: Target, device: str, cfg: ConfigChoice,
                     own_models: bool = False, tvm_only: bool = False,
                     max_accuracy_drop: float = ELBOW_DROP_PP) -> Prediction:
    """A whole network priced by the grid engine (``recommend``'s models, trained,
    adapted or zero-shot): the configuration ``cfg`` names, its fastest candidate where a
    part is left open. Where ``cfg`` names no compression, the answer is `recommend`'s
    first: within ``max_accuracy_drop`` points of top-1, a candidate of unknown accuracy
    never before the dense reference. ``tvm_only``: our builds only. ``own_models``: the
    device's own trained models, unmapped, wherever they were trained (a reference's raw
    predictions)."""
    from dlas_predict.paths import MODELS_STORE
    from dlas_predict.recommend.search import recommend
    from dlas_predict.space.config import DEFAULT_RATIO, Compression

    ratio = cfg.ratio or DEFAULT_RATIO
    tuning = cfg.tuning or "all"
    # dense is always priced: the grid's speedups are relative to it
    comps = ({Compression.DENSE, Compression(cfg.compression)} if cfg.compression
             else set(Compression))
    budget = max_accuracy_drop if cfg.compression is None else float("inf")
    rec = recommend(_network_file(t), device, max_accuracy_drop=budget, top=0,
                    ratios=(ratio,), tuning=tuning, compressions=tuple(comps),
                    predict_accuracy=cfg.compression is None,
                    models_dir=MODELS_STORE / device if own_models else None)
    ok = [c for c in rec.candidates
          if (cfg.compression is None or c.compression.value == cfg.compression)
          and (cfg.algorithm is None or c.algorithm == cfg.algorithm)
          and not (tvm_only and c.algorithm == "onnxruntime")
          and (cfg.ratio is None or c.ratio is None or abs(c.ratio - cfg.ratio) < 1e-9)]
    if not ok:
        raise ConfigError(f"{t.text}: no candidate matches {cfg.text} on {device} (the "
                          f"grid had {len(rec.candidates)}; skipped: "
                          + "; ".join(f"{a}: {b}" for a, b in rec.skipped[:3]) + ")")
    # the ranking where the compression is chosen (the budget's), else the fastest
    best = ok[0] if cfg.compression is None else min(ok, key=lambda c: c.predicted_s)
    label = best.compression.value + (f"@{best.ratio:g}" if best.ratio else "") + \
        f"/{best.algorithm}/{best.tuning.value}"
    return Prediction(t.text, label, best.predicted_s * 1e3, best.low_s * 1e3,
                      best.high_s * 1e3, best.source, "engine:" + str(
                          (rec.mapping or {}).get("reference") or rec.device),
                      "onnxruntime" if best.algorithm == "onnxruntime" else "tvm")


def _runtime_route(route: tuple[str, str], device: str, cfg: ConfigChoice,
                   runtime: str | None) -> tuple[str, str]:
    """``route`` checked against the runtime asked for: a device adapted on another runtime
    answers in it (layer kinds), or in our engine's runtimes (its map) where the config or
    ``runtime`` names them."""
    if route[0] != LAYERWISE:
        if runtime is not None and runtime not in ENGINE_RUNTIMES:
            raise ConfigError(f"{device} was not adapted on {runtime!r} latencies: its "
                              "answers are our engine's (tvm, onnxruntime)")
        return route
    adapted = read_adapted(device)
    own = adapted["runtime"] if adapted is not None else "help"
    if runtime in ENGINE_RUNTIMES or (runtime is None and cfg.algorithm not in (None, own)) \
            or (runtime is None and cfg.tuning):
        if adapted is None or not adapted.get("recommend_map"):
            raise ConfigError(f"{device}'s latencies are {own}'s; it has no map of our "
                              f"engine's (tvm, onnxruntime) to price {cfg.text}")
        return "engine", route[1]
    if runtime is not None and runtime != own:
        raise ConfigError(f"{device} was adapted on {own} latencies, not {runtime!r} ones "
                          f"(adapt it on {runtime} measurements, or ask for "
                          f"{param('runtime')} {own})")
    return route


def _layerwise_fit(device: str, data: Path | None):
    """(the fit, its runtime, the configuration it prices, source) of a device adapted on
    another runtime's whole networks, or of a device HELP measured."""
    from dlas_predict.crossdev import layerwise as lw

    adapted = read_adapted(device)
    if adapted is not None and adapted["source"] == LAYERWISE:
        return lw.FewShotFit.from_dict(adapted["fit"]), adapted["runtime"], \
            adapted["config"], "adapted"
    return lw.help_basis(data).own_fit(f"help:{device}"), "help", "dense", "trained"


def _predict_layerwise(t: Target, device: str, cfg: ConfigChoice,
                       data: Path | None) -> Prediction:
    from dlas_predict.crossdev import layerwise as lw

    fit, runtime, config, source = _layerwise_fit(device, data)
    if cfg.compression not in (None, config.split("@")[0]) or (
            cfg.ratio and f"{config.split('@')[0]}@{cfg.ratio:g}" != config):
        raise ConfigError(f"{device}'s {runtime} latencies are of {config} networks; it "
                          f"prices {config}, not {cfg.text}")
    X = lw.cell_terms(t.key) if t.kind == "nasbench201" else lw.network_terms(t.key)
    mid = float(fit.predict(X)[0])
    low, high = (float(v[0]) for v in fit.predict_interval(X))
    a, b = fit.scales
    basis = f"layerwise:{fit.basis_device}" + (
        "" if a == b == 1.0 else f" ×{a:.3g}" if a == b else f" ×{a:.3g}/×{b:.3g}")
    return Prediction(t.text, f"{config}/{runtime}", mid, low, high, source, basis, runtime)


def _predict_conv(t: Target, device: str, cfg: ConfigChoice) -> Prediction:
    """A conv priced by a trained layer model (the device's own, else a reference's mapped
    to the device): its fastest variant ``cfg`` allows (untuned unless ``tuned`` is named;
    pruning at the named ratio, else 0.9)."""
    from dlas_predict.crossdev.transfer import (answering_meta, device_map, model_meta,
                                                own_model, reference_predictions)
    from dlas_predict.models.costmodel import learned_algorithms
    from dlas_predict.space.config import (DEFAULT_RATIO, GRID_ALGORITHMS, Compression,
                                           ConvSpec, PlanAlgorithm, winograd_skip)

    spec = ConvSpec.parse(t.key)
    if cfg.algorithm == "onnxruntime":
        raise ConfigError(f"{t.text}: onnxruntime is priced per whole network (its model "
                          "knows no single conv); give an ONNX file or zoo:NAME")
    own = own_model(device)
    # one conv's per-layer plan is its fastest algorithm: Winograd too, untuned, where it
    # applies and the layer model that prices the device learned it (the device's own
    # model, of this CPU id where it has one, else the map's reference)
    chosen = None if cfg.algorithm == PlanAlgorithm.PER_LAYER.value else cfg.algorithm
    winograd = chosen is None and "winograd" in learned_algorithms(
        answering_meta(device) if own else model_meta(device_map(device)[2].name))
    tuning = cfg.tuning or "untuned"
    rows = []
    for comp in ([cfg.compression] if cfg.compression else [c.value for c in Compression]):
        r = (cfg.ratio or DEFAULT_RATIO) if comp.endswith("_pruning") else 0.0
        algs = [chosen] if chosen else [a.value for a in GRID_ALGORITHMS]
        if winograd and winograd_skip(spec, comp, tuning=tuning) is None:
            algs.append("winograd")
        rows.extend((spec, alg, comp, r, tuning) for alg in algs)
    if own:  # the device's own model (on this machine, this machine's), as recommend's
        from dlas_predict.space.devices import model_dir

        mid, low, high = reference_predictions(device, rows, model_dir(device))
        source, model = "trained", device
    else:  # the map recommend uses: a trained reference scaled to the device
        m, dev, ref = device_map(device)
        mid, low, high = m.map_kernels(ref, dev, [(t.key, r[1], r[2]) for r in rows],
                                       *reference_predictions(ref.name, rows))
        source, model = m.source, ref.name
    b = int(np.argmin(mid))
    _, alg, comp, r, tuning = rows[b]
    label = (f"{comp}@{r:g}" if r else comp) + f"/{alg}/{tuning}"
    return Prediction(t.text, label, float(mid[b] * 1e3), float(low[b] * 1e3),
                      float(high[b] * 1e3), source, f"engine:{model}")


def _prediction(text, config, mean, sd, post, source) -> Prediction:
    return Prediction(text, config, float(np.exp(mean)), float(np.exp(mean - Z80 * sd)),
                      float(np.exp(mean + Z80 * sd)), post.source, source,
                      {"help": "help", "tophub": "tvm"}.get(source, "tvm"))
