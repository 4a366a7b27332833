"""``adapt``: a device fitted on latencies measured on it, in any runtime, and saved under
DLAS_HOME (never over the shipped models). Convs load on the latent model of the kernel
data (TopHub's tuned kernels for tuned rows) and fit the map `recommend` uses; whole
networks timed by our builds fit the engine's map; whole networks timed in another runtime
are priced by their layer kinds (:mod:`~dlas_predict.crossdev.layerwise`); NAS-Bench-201
cells load on HELP's devices."""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlas_predict.crossdev.adapted import adapted_path, checked_name
from dlas_predict.crossdev.evaluate import placed_zero_shot
from dlas_predict.errors import DlasError
from dlas_predict.recommend.predict import (DISAGREE, LAYERWISE, MIN_ROWS, ConfigChoice, Target,
                                            basis, is_x86, parse_config, parse_target,
                                            predict_network, rows_of)


@dataclass
class AdaptReport:
    device: str
    source: str
    rows: int
    registered: bool
    path: str
    #: leave-one-out over the user's rows: Spearman and median absolute error
    loo_spearman: float
    loo_median_error: float
    loading: list[float]
    #: what ``loading`` holds
    parameters: str = "latent loading (intercept, mean-device slope, latent terms, groups)"
    #: the runtime the rows were timed in
    runtime: str = "tvm"


def read_measurements(path: Path) -> list[tuple[Target, ConfigChoice, float, int]]:
    """The CSV's rows (target, config, latency_ms); every bad row is an error naming it."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise DlasError(f"cannot read {path}: {exc.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    cols = reader.fieldnames or []
    if "target" not in cols or "latency_ms" not in cols:
        raise DlasError(f"{path}: the header needs target and latency_ms (and optionally "
                        f"config); found {', '.join(cols) or 'nothing'}")
    rows = []
    for n, r in enumerate(reader, start=2):
        if r.get(None):
            raise DlasError(f"{path}:{n}: more fields than the header; quote targets that "
                            'contain commas ("conv:C=64,H=56,...")')
        try:
            t = parse_target(r.get("target") or "")
            c = parse_config(r.get("config") or "dense")
        except DlasError as exc:
            raise DlasError(f"{path}:{n}: {exc}") from None
        if c.compression is None:
            raise DlasError(f"{path}:{n}: the config must name its compression")
        lat = (r.get("latency_ms") or "").strip()
        try:
            v = float(lat)
        except ValueError:
            raise DlasError(f"{path}:{n}: latency_ms {lat!r} is missing or not a number")
        if not np.isfinite(v) or v <= 0:
            raise DlasError(f"{path}:{n}: latency_ms must be positive (got {lat})")
        rows.append((t, c, v, n))
    if len(rows) < MIN_ROWS:
        raise DlasError(f"{path}: {len(rows)} measurement(s); adapt needs at least {MIN_ROWS}")
    kinds = {t.kind for t, *_ in rows}
    if len(kinds) > 1:
        raise DlasError(f"{path}: mixes " + " and ".join(sorted(kinds)) + " targets; adapt "
                        "one kind at a time")
    seen: dict[tuple, tuple[float, int]] = {}
    for t, c, v, n in rows:
        k = (t.key, c)
        if k in seen and max(v, seen[k][0]) / min(v, seen[k][0]) > DISAGREE:
            raise DlasError(f"{path}:{n}: {t.text} ({c.text}) disagrees with line {seen[k][1]}"
                            f" by more than {DISAGREE:g}x ({v} vs {seen[k][0]} ms)")
        seen.setdefault(k, (v, n))
    return rows


#: Algorithms of our engine: rows that name one were timed by our TVM builds.
_TVM_ALGORITHMS = ("direct", "gemm", "spatial_pack", "per_layer")


def measured_runtime(path: Path, rows) -> str:
    """The runtime ``rows`` (of the CSV ``path``) were timed in: the ``runtime`` column, one
    value for every row; else ``tvm`` where the rows name our algorithms, ``onnxruntime``
    where they name it, and ``foreign`` otherwise."""
    reader = csv.DictReader(Path(path).read_text().splitlines())
    if "runtime" in (reader.fieldnames or []):
        seen: dict[str, int] = {}
        for n, r in enumerate(reader, start=2):
            word = (r.get("runtime") or "").strip().lower() or "foreign"
            if not re.fullmatch(r"[a-z0-9_.+-]{1,32}", word):
                raise DlasError(f"{path}:{n}: runtime {word!r}: use one word (tflite, "
                                "onnxruntime, tensorrt, ...)")
            seen.setdefault(word, n)
        if len(seen) > 1:
            (a, na), (b, nb) = list(seen.items())[:2]
            raise DlasError(f"{path}:{nb}: runtime {b!r}, but line {na} is {a!r}: adapt one "
                            "runtime at a time")
        return next(iter(seen))
    algs = {c.algorithm for _, c, _, _ in rows}
    if algs & set(_TVM_ALGORITHMS):
        return "tvm"
    return "onnxruntime" if algs == {"onnxruntime"} else "foreign"


def adapt(device: str, measurements: Path, data: Path | None = None) -> AdaptReport:
    """Fit ``device``'s loading on its measurements and save it under DLAS_HOME."""
    from dlas_predict.space.devices import device_names

    checked_name(device)
    rows = read_measurements(measurements)
    kind = rows[0][0].kind
    runtime = measured_runtime(measurements, rows)
    if kind == "network" and runtime == "tvm":
        return _adapt_networks(device, measurements, rows)
    if kind == "network":
        return _adapt_layerwise(device, measurements, rows, runtime, data)
    tuned = {c.tuning == "tuned" for _, c, _, _ in rows} if kind == "conv" else {False}
    if tuned == {True, False}:
        raise DlasError(f"{measurements}: tuned and untuned kernels; adapt them apart (the "
                        "tuned ones on TopHub's tuned kernels)")
    source, level = ("help", "network") if kind == "nasbench201" else \
        (("tophub" if True in tuned or not is_x86(device) else "profiles"), "kernel")
    mat, model = basis(source, level, str(data) if data else None)
    keys = []
    for t, c, _, n in rows:
        if level == "network":
            if c.compression != "dense" or c.algorithm:
                raise DlasError(f"{measurements}:{n}: NAS-Bench-201 rows are dense")
            keys.append(t.key)
        else:
            # TopHub's kernels are its tuned templates, whichever algorithm they run
            alg = "tuned" if source == "tophub" else c.algorithm
            if alg is None:
                raise DlasError(f"{measurements}:{n}: name the algorithm of a conv "
                                "(e.g. dense/direct)")
            tag = f"{c.compression}@{c.ratio:g}" if c.ratio else c.compression
            tuning = c.tuning or ("tuned" if source == "tophub" else "untuned")
            keys.append(f"{t.key}|{alg}|{tag}|{tuning}")
    Z = rows_of(mat, model, keys)
    y = np.log([v for _, _, v, _ in rows])
    # aggregate duplicates (geometric mean), then fit
    uniq: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        uniq.setdefault(k, []).append(i)
    Zu = np.vstack([Z[v[0]] for v in uniq.values()])
    yu = np.array([y[v].mean() for v in uniq.values()])
    prior = placed_zero_shot(model, device) if device in device_names() else model.zero_shot()
    post = model.adapt(Zu, yu, prior)
    loo = np.array([Zu[i] @ model.adapt(np.delete(Zu, i, 0), np.delete(yu, i), prior,
                                       spread=False).mean
                    for i in range(len(yu))])
    from dlas_predict.crossdev.latent import spearman
    registered = device not in device_names()  # known by these measurements alone
    saved = {"device": device, "source": source, "level": level, "targets": list(uniq),
             "log_ms": yu.tolist(), "k": model.k_, "noise_var": model.noise_var_,
             "loading": post.mean.tolist(), "measurements": str(measurements)}
    if level == "kernel":
        saved["recommend_map"] = _recommend_map(device, list(uniq), yu)
    path = adapted_path(device)
    path.write_text(json.dumps(saved, indent=1))
    return AdaptReport(device, source, len(rows), registered, str(path),
                       spearman(loo, yu) if len(yu) >= 3 else float("nan"),
                       float(np.median(np.abs(np.exp(loo - yu) - 1))), post.mean.tolist())


def _engine_network_map(device: str, rows):
    """The reference device's engine prices each (network, configuration) of ``rows``, and
    the map from its latencies to the measured ones (what `recommend` uses for the device):
    (the map, its leave-one-out log predictions, the measured log latencies, the reference)."""
    from dlas_predict.crossdev import transfer
    from dlas_predict.space.devices import device_names, get_device

    registered = device not in device_names()
    dev = None if registered else get_device(device, with_target=False)
    ref = transfer.reference_for(dev) if dev is not None else "local"
    ref_dev = transfer.data_spec(ref)
    stub = dev if dev is not None else transfer.measured_only(device, ref_dev, len(rows))
    base = transfer.zero_shot_map(stub, ref) if stub.peak_gflops else None
    log_ref, scale, groups, y = [], [], [], []
    for t, c, v, n in rows:
        p = predict_network(t, ref, c, own_models=True)
        comp, alg = p.config.split("/")[0].split("@")[0], p.config.split("/")[1]
        log_ref.append(np.log(p.predicted_ms))
        scale.append(base.log_scale(ref_dev, stub, comp) if base else 0.0)
        groups.append(transfer.group_of(comp, alg))
        y.append(np.log(v))
    log_ref, scale, y = map(np.array, (log_ref, scale, y))
    # fitted on whole networks, applied to each of their kernels: offsets, no slope
    m = transfer.adapted_map(stub, ref, log_ref, scale, y, groups, base, fit_slope=False)
    loo = []
    for i in range(len(y)):
        keep = np.delete(np.arange(len(y)), i)
        mi = transfer.adapted_map(stub, ref, log_ref[keep], scale[keep], y[keep],
                                  [groups[j] for j in keep], base, fit_slope=False)
        loo.append(mi.apply(log_ref[i:i + 1], scale[i:i + 1], [groups[i]])[0])
    return m, np.array(loo), y, ref


def _adapt_networks(device: str, measurements: Path, rows) -> AdaptReport:
    """Whole networks timed by our TVM builds: the reference device's engine prices each
    (network, configuration), and the map from its latencies to the measured ones is what
    `recommend` and `predict` then use for the device."""
    from dlas_predict.crossdev.latent import spearman
    from dlas_predict.space.devices import device_names

    registered = device not in device_names()
    m, loo, y, ref = _engine_network_map(device, rows)
    path = adapted_path(device)
    path.write_text(json.dumps({
        "device": device, "source": "engine", "level": "network", "runtime": "tvm",
        "targets": [], "log_ms": [], "networks": [[t.text, c.text, v] for t, c, v, _ in rows],
        "recommend_map": m.to_dict(), "measurements": str(measurements)}, indent=1))
    return AdaptReport(device, f"{ref}'s models (whole networks)", len(rows), registered,
                       str(path), spearman(loo, y),
                       float(np.median(np.abs(np.exp(loo - y) - 1))),
                       [m.offset, *m.group_offsets.values()],
                       "map (offset, " + ", ".join(m.group_offsets) + " offsets; slope 1)")


def _adapt_layerwise(device: str, measurements: Path, rows, runtime: str,
                     data: Path | None) -> AdaptReport:
    """Whole networks timed in another runtime (``runtime``): each network's layers by kind,
    priced through the basis device whose costs explain the latencies best, scaled
    (:func:`~dlas_predict.crossdev.layerwise.fit_few_shot`). Its leave-one-out error is the
    procedure `predict` then runs, the basis device chosen again without each row. The
    engine's map is fitted too, for `recommend`'s grid."""
    from dlas_predict.crossdev import layerwise as lw
    from dlas_predict.crossdev.latent import spearman
    from dlas_predict.space.devices import device_names

    configs = {(c.compression, c.ratio) for _, c, _, _ in rows}
    if len(configs) > 1:
        (a, b) = sorted(configs, key=str)[:2]
        raise DlasError(f"{measurements}: rows of {_config_text(*a)} and {_config_text(*b)} "
                        f"networks: {runtime} latencies adapt one configuration at a time")
    for t, c, _, n in rows:
        if c.algorithm not in (None, runtime) or c.tuning:
            raise DlasError(f"{measurements}:{n}: {c.text} names our engine's build; rows "
                            f"timed in {runtime} name the configuration only (e.g. dense)")
    config = _config_text(*next(iter(configs)))
    terms: dict[str, np.ndarray] = {}
    for t, _, _, n in rows:
        if t.key not in terms:
            try:
                terms[t.key] = lw.network_terms(t.key)
            except DlasError as exc:
                raise DlasError(f"{measurements}:{n}: {exc}") from None
    by_key: dict[str, list[float]] = {}
    for t, _, v, _ in rows:
        by_key.setdefault(t.key, []).append(math.log(v))
    keys = list(by_key)
    X = np.array([terms[k] for k in keys])
    y = np.array([np.mean(by_key[k]) for k in keys])
    if len(keys) < MIN_ROWS:
        raise DlasError(f"{measurements}: {len(keys)} distinct network(s); adapt needs at "
                        f"least {MIN_ROWS}")
    basis, notes = lw.default_basis(data)
    fit = lw.fit_few_shot(basis, X, np.exp(y))
    saved = {"device": device, "source": LAYERWISE, "level": "network", "runtime": runtime,
             "config": config, "fit": fit.to_dict(), "targets": keys, "log_ms": y.tolist(),
             "networks": [[t.text, c.text, v] for t, c, v, _ in rows],
             "measurements": str(measurements), "notes": notes}
    try:
        m, _, _, _ = _engine_network_map(device, rows)
        saved["recommend_map"] = m.to_dict()
    except DlasError as exc:
        saved["notes"].append(f"no map of our engine's grid: {exc}")
    path = adapted_path(device)
    path.write_text(json.dumps(saved, indent=1))
    loo = y + np.array(fit.loo_log_errors)
    return AdaptReport(device, f"{runtime} latencies, layer kinds", len(rows),
                       device not in device_names(), str(path),
                       spearman(loo, y) if len(y) >= 3 else float("nan"),
                       float(np.median(np.abs(np.exp(loo - y) - 1))),
                       list(fit.blend_scales or fit.scales),
                       f"{fit.describe()} (chosen among {len(basis.devices)} basis devices "
                       "by leave-one-out error)", runtime)


def _config_text(compression: str, ratio: float | None) -> str:
    return f"{compression}@{ratio:g}" if ratio else compression


def _recommend_map(device: str, keys: list[str], log_ms: np.ndarray) -> dict | None:
    """The map `recommend` uses for ``device``: a trained reference's kernel latencies
    fitted to these measurements (TopHub's tuned templates have no reference: None)."""
    from dlas_predict.crossdev import transfer
    from dlas_predict.space.config import ConvSpec
    from dlas_predict.space.devices import device_names, get_device

    rows = []
    for k in keys:
        conv, alg, comp, tuning = k.split("|")
        if alg == "tuned":
            return None
        c, _, r = comp.partition("@")
        rows.append((ConvSpec.parse(conv), alg, c, float(r or 0), tuning))
    if device in device_names():
        dev = get_device(device, with_target=False)
        ref = transfer.reference_for(dev)
    else:
        dev, ref = None, "local"
    log_ref = transfer.reference_log_latency(ref, rows) + np.log(1e3)
    ref_dev = transfer.data_spec(ref)
    bits = dev.simd_bits if dev is not None else None
    groups = [transfer.group_of(r[2], r[1], r[0], bits) for r in rows]
    if dev is not None:
        m0 = transfer.zero_shot_map(dev, ref)
        scale = np.array([m0.log_scale(ref_dev, dev, f"{r[2]}@{r[3]:g}" if r[3] else r[2],
                                       r[0]) for r in rows])
        m = transfer.adapted_map(dev, ref, log_ref, scale, log_ms, groups, m0)
    else:
        stub = transfer.measured_only(device, ref_dev, len(rows))
        m = transfer.adapted_map(stub, ref, log_ref, np.zeros(len(rows)), log_ms, groups)
    return m.to_dict()


