"""A device without a trained model, answered from a reference device that has one.

``recommend NET --device D`` needs a layer and a network model. Where ``D`` has none, the
models of a reference device ``R`` (the nearest trained device of the same kind, by spec)
price the grid, and every kernel's latency is mapped to ``D``:

    log t_D = a + log t_R + α · log(peak_R[dtype] / peak_D[dtype])
              + β · s · log(bw_R / bw_D),   s = min(1, bytes / LLC)

where, between two GPUs, ``bytes`` is what the kernel touches (input, weights, output) and
``LLC`` the smaller L2 of the two: a kernel timed again and again whose data stays in the
L2 of both reads little from memory, so their memory bandwidths hardly matter to it
(between CPUs, s = 1).

- **zero-shot**: ``a = 0``; α and β are fitted on every pair of devices that measured the
  same kernels (the local CPU and its profiles, shipped; TopHub's devices where the public
  data lies), and the interval is the 10-90 % range of the leave-one-device-out error of
  that fit (each device's pairs predicted with α, β fitted without it);
- **adapted**: ``a`` and a slope on ``log t_R`` (in log milliseconds) are fitted on the
  user's measurements (``adapt``, ``active-learn``: convs; or whole networks priced by the
  reference's engine, which fit offsets only), shrunk towards the zero-shot map, with the
  interval of its leave-one-out residuals;
- **trained**: the device's own models; no map.
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from dlas_predict.crossdev.offsets import offset_of, onnxruntime_groups
from dlas_predict.errors import DlasError
from dlas_predict.paths import MODELS_STORE, cache_dir

#: Compression → the data type whose peak scales it.
DTYPE = {"dense": "float32", "weight_pruning": "float32", "channel_pruning": "float32",
         "float16": "float16", "int8": "int8"}


def kernel_bytes(conv, compression: str) -> float:
    """Bytes a conv kernel touches: its input, weights and output at the compression's data
    type; ``compression`` may carry the pruning ratio (``weight_pruning@0.9``: the CSR
    weights' nonzeros with their column indices)."""
    from dlas_predict.models.features import DTYPE_BYTES
    from dlas_predict.space.config import ConvSpec, DType

    comp, _, ratio = str(compression).partition("@")
    b = DTYPE_BYTES[DType.parse(DTYPE.get(comp, "float32"))]
    spec = conv if isinstance(conv, ConvSpec) else ConvSpec.parse(str(conv))
    total = float(spec.bytes_moved(b))
    if comp == "weight_pruning" and ratio:  # dense weights out, CSR nonzeros and indices in
        total += b * spec.params * ((1.0 - float(ratio)) * (b + 4) / b - 1.0)
    return total


def memory_share(nbytes: float | None, ref, dev) -> float:
    """How much of the bandwidth term applies to a GPU kernel of ``nbytes``: 1 where it does
    not fit the smaller L2 of the two GPUs (or one is unknown), its share of that L2 where it
    fits. CPU kernels keep the whole term: weighting it so lowered the CPU map's held-out
    share within ±25 % from 53 % to 39 % (benchmarks/README.md)."""
    if nbytes is None or ref.kind != "gpu" or dev.kind != "gpu":
        return 1.0
    llc = [max((d.caches or {}).values(), default=0) for d in (ref, dev)]
    if min(llc) <= 0:
        return 1.0
    return float(min(1.0, nbytes / (1024.0 * min(llc))))


#: The zero-shot map's prior (α, β): a kernel half compute-, half bandwidth-bound.
PRIOR = np.array([0.5, 0.5])


@dataclass
class TransferFit:
    """α, β of the zero-shot map, and its leave-one-device-out error (log ratios)."""

    alpha: float
    beta: float
    q10: float
    q90: float
    within_25pct: float
    pairs: int
    devices: list[str]
    per_device: dict[str, dict] = field(default_factory=dict)
    #: What the fit was made of, where it is not the devices of its own kind alone.
    note: str = ""


#: The whole-network offset group of a per-layer plan whose layers run more than one kernel:
#: its layout changes between layers and its choice of each layer's fastest prediction are
#: priced apart from one algorithm's plan.
MIXED = "mixed"


@dataclass
class DeviceMap:
    """How a reference device's kernel latencies become ``device``'s."""

    device: str
    reference: str
    source: str            # "zero-shot" | "adapted"
    #: log ms (device) = offset + slope · log ms (reference) + spec term (+ group and conv
    #: offsets): every map is of log milliseconds
    alpha: float
    beta: float
    q10: float
    q90: float
    offset: float = 0.0
    slope: float = 1.0
    shots: int = 0
    #: adapted: an offset per kernel group (``compression/algorithm``)
    group_offsets: dict[str, float] = field(default_factory=dict)
    #: adapted on these conv shapes: an offset per shape, for every group of it
    conv_offsets: dict[str, float] = field(default_factory=dict)
    #: calibrated: the machine fingerprint the measurements were taken on (a map of another
    #: machine's local CPU is not used)
    fingerprint: str = ""
    #: calibrated on whole networks: log offsets of our whole-network builds over the mapped
    #: layer and network models, by compression ("*": any other; "mixed": a plan whose
    #: layers run more than one kernel), and the 10-90 % log error of a new network: their
    #: leave-one-out error and the kernel map's, in quadrature
    network_offsets: dict[str, float] = field(default_factory=dict)
    network_q: tuple[float, float] = (0.0, 0.0)
    #: calibrated on onnxruntime runs: log offsets over the reference's onnxruntime model,
    #: by run mode (fp32, float16, int8, channel_pruning; "*": any other)
    onnxruntime_offsets: dict[str, float] = field(default_factory=dict)
    onnxruntime_q: tuple[float, float] = (0.0, 0.0)
    #: calibrated on onnxruntime runs: the scales of the reference model's per-op costs and
    #: of the rest (:data:`~dlas_predict.models.ortmodel.FIXED_TERMS`), before the offsets
    onnxruntime_scales: tuple[float, float] = (1.0, 1.0)

    def log_scale(self, ref, dev, compression: str, conv=None) -> float:
        """The spec term of a kernel of ``compression`` (of ``conv``: its bandwidth term
        weighted by :func:`memory_share`; without it, the whole term)."""
        comp = str(compression).partition("@")[0]
        dt = DTYPE.get(comp, "float32")
        peak = np.log(_peak(ref, dt) / _peak(dev, dt))
        bw = np.log(ref.mem_bandwidth_gbs / dev.mem_bandwidth_gbs) \
            if ref.mem_bandwidth_gbs and dev.mem_bandwidth_gbs else 0.0
        share = memory_share(None if conv is None else kernel_bytes(conv, compression),
                             ref, dev)
        return float(self.alpha * peak + self.beta * bw * share)

    def map_kernels(self, ref, dev, kernels: list[tuple[str, str, str]], mid, low, high):
        """(conv spec, algorithm, compression) rows' latencies on ``ref`` (median, 10 %,
        90 %; seconds) mapped to ``dev`` (seconds), the interval widened by the map's own
        error; a device with no spec takes no spec term. The map is of log milliseconds,
        the unit it is fitted in: an adapted slope pivots there."""
        scale = {(str(k[0]), k[2]): self.log_scale(ref, dev, k[2], k[0])
                 if dev.peak_gflops else 0.0 for k in kernels}
        ls = np.array([scale[str(k[0]), k[2]] for k in kernels])
        bits = getattr(dev, "simd_bits", None)
        groups = [group_of(k[2], k[1], k[0], bits) for k in kernels]
        convs = [k[0] for k in kernels]

        def mapped(seconds, widen: float = 0.0):
            log_ms = self.apply(np.log(np.asarray(seconds) * 1e3), ls, groups, convs)
            return np.exp(log_ms + widen) / 1e3

        return mapped(mid), mapped(low, self.q10), mapped(high, self.q90)

    def apply(self, log_t_ref: np.ndarray, log_scale: np.ndarray,
              groups: list[str] | None = None, convs: list[str] | None = None) -> np.ndarray:
        out = self.offset + self.slope * log_t_ref + log_scale
        if self.group_offsets and groups is not None:
            out = out + np.array([self.group_offsets.get(g, 0.0) for g in groups])
        if self.conv_offsets and convs is not None:
            out = out + np.array([self.conv_offsets.get(c, 0.0) for c in convs])
        return out

    def network_offset(self, compression: str, mixed: bool = False,
                       family: str = "") -> float | None:
        """The whole-network offset of a compression, or of a mixed plan where one was
        calibrated, for a network of ``family`` (:func:`offset_of`; None: not calibrated
        on networks)."""
        if not self.network_offsets:
            return None
        comp = str(compression).partition("@")[0]
        return offset_of(self.network_offsets, ([MIXED] if mixed else []) + [comp], family)

    def onnxruntime_offset(self, mode: str, family: str = "") -> float | None:
        """The onnxruntime offset of a run mode for a network of ``family``
        (:func:`onnxruntime_groups`; None: not calibrated on onnxruntime)."""
        if not self.onnxruntime_offsets:
            return None
        return offset_of(self.onnxruntime_offsets, onnxruntime_groups(mode), family)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceMap":
        """A saved map; a field this version does not know is an error (the caller says
        which file)."""
        d = dict(d)
        for k in ("network_q", "onnxruntime_q", "onnxruntime_scales"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


def _peak(dev, dtype: str) -> float:
    p = dev.peak_gflops
    return float(p.get(dtype) or p.get("float32"))


def trained_devices() -> list[str]:
    """Every device with a shipped (or trained) model, this machine's or another's."""
    return sorted(p.parent.name for p in MODELS_STORE.glob("*/layer.json"))


def reference_dir(name: str) -> Path:
    """The model ``name`` answers with as a reference for another device: its shipped one
    (``models_store/NAME``), of the machine its corpus and :func:`data_spec` describe, even
    where this machine answers ``name`` itself with a model of its own."""
    return MODELS_STORE / name


def model_meta(name: str) -> dict:
    """The layer model's sidecar of ``name`` as a reference (:func:`reference_dir`)."""
    return _layer_meta(reference_dir(name))


def answering_meta(name: str) -> dict:
    """The layer model's sidecar of the model ``name`` is answered with here
    (:func:`dlas_predict.space.devices.model_dir`: of this CPU id, where it has its own)."""
    from dlas_predict.space.devices import model_dir

    return _layer_meta(model_dir(name))


def _layer_meta(directory: Path) -> dict:
    """The layer model's sidecar in ``directory`` ({} where there is none)."""
    path = directory / "layer.json"
    try:
        return _read_meta(path, path.stat().st_mtime_ns)
    except OSError:
        return {}


@functools.lru_cache(maxsize=64)
def _read_meta(path: Path, _mtime: int) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def of_this_machine(name: str) -> bool:
    from dlas_predict.space.devices import LOCAL, is_profile_name

    return name == LOCAL or is_profile_name(name)


def _corpus_fingerprint(name: str) -> str | None:
    """The machine fingerprint most of ``name``'s shipped kernel corpus was measured on."""
    from dlas_predict.paths import CORPUS_SNAPSHOTS

    path = CORPUS_SNAPSHOTS / f"{name}.parquet"
    if not path.is_file():
        return None
    return _read_fingerprint(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _read_fingerprint(path: Path, _mtime: int) -> str | None:
    import pyarrow.parquet as pq

    # ParquetFile reads the one column without importing pyarrow.dataset (and pandas)
    col = pq.ParquetFile(path).read(columns=["fingerprint"]).column("fingerprint").to_pylist()
    col = [c for c in col if c]
    return max(set(col), key=col.count) if col else None


def model_machine(name: str) -> str | None:
    """The fingerprint of the machine that trained the model ``name`` is answered with here
    (:func:`dlas_predict.space.devices.model_dir`; None: not recorded, or no model)."""
    return answering_meta(name).get("device_fingerprint") or None


def own_model(name: str) -> bool:
    """``name`` has a trained model of the machine it names. The local CPU's and its
    profiles' models are this machine's only when they were trained on it (the models
    shipped for this very machine, :func:`~dlas_predict.space.devices.model_dir`, or
    ``models_store``'s own); on another machine, ``local`` is a device without a model
    (answered from a reference, mapped)."""
    from dlas_predict.space.devices import model_dir

    if not (model_dir(name) / "layer.json").is_file():
        return False
    if not of_this_machine(name):
        return True
    from dlas_predict.space.devices import get_device

    trained_on = model_machine(name)
    fp = get_device(name, with_target=False).fingerprint
    # a calibration of this very machine wins: a host of the same CPU id can run at
    # other roofs than the one the model was trained on (:func:`roof_drift`)
    return (trained_on is None or fp == trained_on) and not calibrated_here(name, fp)


def calibrated_here(name: str, fingerprint: str | None) -> bool:
    """``name`` (this machine or a profile of it) has a ``calibrate`` map of this very
    machine (``fingerprint``) under DLAS_HOME."""
    from dlas_predict.crossdev.adapted import calibrated_on

    if not fingerprint or not of_this_machine(name):
        return False
    return calibrated_on(name) == fingerprint


#: How far (relative) this machine's float32 roof or memory bandwidth, measured here, may
#: lie from those its own model was trained with before :func:`roof_drift` tells: the
#: spread of collections on a quiet machine.
ROOF_DRIFT = 0.10


def roof_drift(name: str) -> str | None:
    """Where ``name``'s own model is of this CPU id (its fingerprint) but the roofs
    measured on this host (``devices --measure-peaks``, kept under DLAS_HOME) lie more than
    :data:`ROOF_DRIFT` from those the model was trained with (a host of another clock,
    cache or memory share), a sentence that says so; None otherwise, or where this host's
    roofs are not measured yet."""
    from dlas_predict.space.devices import get_device, peaks_measured_here

    if not of_this_machine(name):
        return None
    meta = answering_meta(name)
    roofs = meta.get("device_roofs") or {}
    dev = get_device(name, with_target=False)
    if not roofs or meta.get("device_fingerprint") != dev.fingerprint \
            or not peaks_measured_here(dev.fingerprint):
        return None
    pairs = [(dev.peak_gflops.get("float32"), roofs.get("peak_gflops", {}).get("float32")),
             (dev.mem_bandwidth_gbs, roofs.get("mem_bandwidth_gbs"))]
    if all(a and b and abs(np.log(a / b)) <= np.log1p(ROOF_DRIFT) for a, b in pairs):
        return None
    (here_f, model_f), (here_b, model_b) = pairs
    return (f"this host's roofs, measured here ({here_f or 0:.1f} GFLOP/s float32, "
            f"{here_b or 0:.1f} GB/s), lie off those {name}'s model was trained with on its "
            f"CPU id ({model_f or 0:.1f} GFLOP/s, {model_b or 0:.1f} GB/s)")


def data_spec(name: str):
    """``name`` as its data was measured: the local CPU and its profiles on the machine of
    their model (or, without one, of their corpus), with that machine's measured roofs and
    SIMD width (this machine's entry where it is that machine); the model's own roofs where
    it recorded them; any other device, its registry entry."""
    from dlas_predict.models.device import features_device
    from dlas_predict.space.devices import corpus_device, get_device

    meta = model_meta(name)
    if of_this_machine(name):
        fp = meta.get("device_fingerprint") or _corpus_fingerprint(name)
        dev = corpus_device(name, fp) if fp else get_device(name, with_target=False)
    else:
        dev = get_device(name, with_target=False)
    return features_device(dev, meta)


def onnxruntime_roof_ratio(dev) -> float:
    """The float32 roof onnxruntime's kernels run at on ``dev``'s CPU over ``dev``'s own.
    onnxruntime picks the CPU's own instruction set whatever code our kernels are built for:
    on a profile of a lower x86-64 level, or on this CPU under ``DLAS_FORCE_ISA``, it runs
    wider vectors than ours. Both roofs measured where they are (the CPU's own at ``dev``'s
    threads: its ``local``, or its native one-thread profile), else the ratio of the two
    vector widths; 1 where ``dev``'s code is its CPU's own or as wide, or its CPU is not
    known."""
    from dlas_predict.space import devices as D

    if dev.kind != "cpu" or not dev.simd_bits or not of_this_machine(dev.name):
        return 1.0
    level, threads = D.profile_code(dev.name) or (None, dev.cores)
    if dev.fingerprint == D.fingerprint_here(dev.name):  # this CPU, forced or a profile
        level = level or D.forced_isa()
        machine, cores, simd = D.native_fingerprint(), D.local_cores(), D.native_simd_bits()
    else:  # a device of the shipped data: a profile of the machine its `local` is of
        own = data_spec(D.LOCAL)
        machine, cores, simd = own.fingerprint, own.cores, own.simd_bits
        if level is None or dev.fingerprint != D.profile_fingerprint(machine, level, threads):
            return 1.0
    if level is None or level.mcpu is None or not simd or level.simd_bits >= simd:
        return 1.0  # the CPU's own code, or its own vector width (an AVX2-only CPU's AVX2)
    measured = D.measured_peaks(D.native_fingerprint_at(machine, threads, cores)) or {}
    peak = (measured.get("peak_gflops") or {}).get("float32")
    if peak and dev.source == "measured" and dev.peak_gflops.get("float32"):
        # never below 1: where the wider vectors add no throughput (a Zen 4 runs AVX-512 as
        # two 256-bit halves) the two roofs measure level, and what parts them is noise
        return max(1.0, float(peak / dev.peak_gflops["float32"]))
    return simd / dev.simd_bits


def same_code(ref, device) -> bool:
    """``ref`` is ``device``'s processor with the same code: a CPU of the same model and
    vector width (another thread count or clock)."""
    return (device.kind == ref.kind == "cpu" and bool(device.cpu_model)
            and bool(device.simd_bits)
            and (ref.cpu_model, ref.simd_bits) == (device.cpu_model, device.simd_bits))


def reference_for(device, candidates: list[str] | None = None) -> str:
    """The trained device (of ``candidates``, default every trained one) nearest ``device``
    in spec (same kind: CPU or GPU), each as its data was measured (:func:`data_spec`):
    peak, bandwidth, SIMD width and, for a CPU, threads (a reference of other threads
    scales its layers and pays its launches otherwise). A trained device of the same
    processor and vector width (a CPU of another thread count or clock) comes before any
    other."""
    best, best_d = None, np.inf
    for name in trained_devices() if candidates is None else candidates:
        ref = data_spec(name)
        if ref.kind != device.kind or not ref.peak_gflops:
            continue
        d = abs(np.log(_peak(ref, "float32") / _peak(device, "float32")))
        if ref.mem_bandwidth_gbs and device.mem_bandwidth_gbs:
            d += abs(np.log(ref.mem_bandwidth_gbs / device.mem_bandwidth_gbs))
        if ref.simd_bits and device.simd_bits:  # code of another vector width: a doubling
            d += abs(np.log2(ref.simd_bits / device.simd_bits))  # counts 1 (a peak's: ln 2)
        if device.kind == "cpu" and ref.cores and device.cores:  # threads: how a layer
            d += abs(np.log(ref.cores / device.cores))  # scales, what a launch costs
        if not same_code(ref, device):
            d += 100.0
        if d < best_d:
            best, best_d = name, d
    if best is None:
        raise DlasError(f"no trained {device.kind} model to answer {device.name} from; "
                        f"trained: {', '.join(trained_devices())}")
    return best


def _pairs(mat, specs: dict) -> list[tuple[str, str, np.ndarray, np.ndarray, np.ndarray]]:
    """(R, D, y = log t_D - log t_R, peak term, bandwidth term) per ordered device pair."""
    comps = [t.split("|")[2].split("@")[0] for t in mat.targets]
    dts = np.array([DTYPE.get(c, "float32") for c in comps])
    out = []
    for r, d in itertools.permutations([x for x in mat.devices if x in specs], 2):
        R, D = specs[r], specs[d]
        if not (R.mem_bandwidth_gbs and D.mem_bandwidth_gbs):
            continue
        rows = np.flatnonzero(np.isfinite(mat.column(r)) & np.isfinite(mat.column(d)))
        if len(rows) < 10:
            continue
        peak = np.array([np.log(_peak(R, t) / _peak(D, t)) for t in dts[rows]])
        share = np.array([memory_share(kernel_bytes(mat.targets[i].split("|")[0],
                                                    mat.targets[i].split("|")[2]), R, D)
                          for i in rows])
        bw = np.log(R.mem_bandwidth_gbs / D.mem_bandwidth_gbs) * share
        out.append((r, d, mat.column(d)[rows] - mat.column(r)[rows], peak, bw))
    return out


def fit_transfer(kind: str = "cpu", data: Path | None = None,
                 exclude: str | None = None) -> TransferFit:
    """α, β on every device pair of ``kind`` with shared kernels, and the map's
    leave-one-device-out error; cached under DLAS_HOME by the data files and the devices'
    specs, so a cached fit is found before any data is read."""
    from dlas_predict.crossdev import sources
    from dlas_predict.paths import CORPUS_SNAPSHOTS
    from dlas_predict.space.devices import device_names

    every = {n: data_spec(n) for n in device_names()}
    files = sorted(CORPUS_SNAPSHOTS.glob("*.parquet"))
    try:
        files += sorted(sources.shared_folder("tophub", data).glob("*.jsonl"))
    except DlasError:
        pass  # the public data is optional: the shipped profiles alone
    key = json.dumps([MAP_FORMAT, kind, exclude, [(str(f), f.stat().st_size,
                                                   f.stat().st_mtime_ns)
                                      for f in files],
                      {n: [d.kind, d.peak_gflops, d.mem_bandwidth_gbs, d.caches]
                       for n, d in every.items()}], sort_keys=True)
    path = cache_dir("crossdev") / "transfer.json"
    if (str(path), key) in _FITS:
        return _FITS[str(path), key]
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if key in cached:
        _FITS[str(path), key] = TransferFit(**cached[key])
        return _FITS[str(path), key]
    mats = [sources.profiles_matrix("kernel")]
    missing = ""
    try:
        mats.append(sources.tophub_matrix(data))
    except DlasError as exc:
        missing = f" (TopHub's kernels of other devices were not read: {exc})"

    def pairs_of(kinds: set[str]) -> list:
        out = []
        for mat in mats:
            specs = {d: every[d] for d in mat.devices if d in every and every[d].kind in kinds}
            out += _pairs(mat, specs)
        return [p for p in out if exclude not in (p[0], p[1])]

    pairs, note = pairs_of({kind}), ""
    if len({r for r, *_ in pairs} | {d for _, d, *_ in pairs}) < 3:
        # too few devices of this kind for a map and its leave-one-device-out interval
        # (no public data): the shipped CPUs' and GPUs' pairs together
        gpus = sources.gpu_corpus_devices()
        if gpus:
            mats.append(sources.profiles_matrix("kernel", devices=gpus))
        pairs = pairs_of({"cpu", "gpu"})
        note = (f"fitted on the shipped corpora's CPU and GPU pairs together: too few {kind} "
                f"devices with shared kernels alone{missing}")
    if not pairs:
        raise DlasError(f"no pair of {kind} devices measured the same kernels: no zero-shot "
                        f"map can be fitted{missing}")
    devices = sorted({r for r, *_ in pairs} | {d for _, d, *_ in pairs})

    def fit(use):
        y = np.concatenate([p[2] for p in use])
        X = np.c_[np.concatenate([p[3] for p in use]), np.concatenate([p[4] for p in use])]
        w = np.concatenate([np.full(len(p[2]), 1.0 / len(p[2])) for p in use])  # pairs equal
        A = X * w[:, None]
        # a prior as strong as one device pair: half compute-, half bandwidth-bound, which
        # pairs of near-identical devices (whose spec ratios are ~0) leave in place
        return np.linalg.solve(X.T @ A + np.eye(2), A.T @ y + PRIOR)

    alpha, beta = fit(pairs)
    errs, per = [], {}
    for dev in devices:
        rest = [p for p in pairs if dev not in (p[0], p[1])]
        mine = [p for p in pairs if p[1] == dev]
        if not rest or not mine:
            continue
        a, b = fit(rest)
        e = np.concatenate([p[3] * a + p[4] * b - p[2] for p in mine])
        # each held-out device weighs the same in the interval
        errs.append(np.quantile(e, np.linspace(0.005, 0.995, 200)))
        per[dev] = {"median_log_error": float(np.median(e)),
                    "within_25pct": float(np.mean(np.abs(np.exp(e) - 1) <= 0.25))}
    if not errs:
        raise DlasError(f"too few {kind} devices with shared kernels for a "
                        "leave-one-device-out interval")
    allq = np.concatenate(errs)
    q10, q90 = np.quantile(allq, [0.1, 0.9])
    fitres = TransferFit(float(alpha), float(beta), float(q10), float(q90),
                         float(np.mean(np.abs(np.exp(allq) - 1) <= 0.25)),
                         int(sum(len(p[2]) for p in pairs)), devices, per, note)
    cached[key] = asdict(fitres)
    path.write_text(json.dumps(cached, indent=1))
    _FITS[str(path), key] = fitres
    return fitres


#: The map's terms: a cached fit of other terms is fitted again.
MAP_FORMAT = 4

#: Fits found in a process, by (cache file, key).
_FITS: dict[tuple[str, str], TransferFit] = {}


def zero_shot_map(device, reference: str, data: Path | None = None) -> DeviceMap:
    t = fit_transfer(device.kind, data)
    return DeviceMap(device.name, reference, "zero-shot", t.alpha, t.beta, t.q10, t.q90)


@functools.lru_cache(maxsize=None)
def group_of(compression: str, algorithm: str, conv=None, simd_bits: int | None = None) -> str:
    """A kernel's group of the map's offsets: ``compression/algorithm``, and, given its
    ``conv`` (a ConvSpec or its text) and the vector width of the CPU that runs it, a group
    of its own for a layer whose kernel is other code than its algorithm's others (a
    float32 pointwise GEMM, ``…/pointwise``; a depthwise direct layer of any dtype, not
    CSR, ``…/depthwise``): a reference's corpus may have timed those layers on other code
    than the device runs. Kept per kernel: a map groups the same kernels again and again,
    and parsing a conv's text costs more than the rest."""
    from dlas_predict.measure.kernels.knobs import pointwise_tile
    from dlas_predict.space.config import COMPRESSION_KERNEL, Compression, ConvSpec

    group = f"{compression}/{algorithm}"
    if conv is None:
        return group
    spec = conv if isinstance(conv, ConvSpec) else ConvSpec.parse(str(conv))
    sparse, dtype, _ = COMPRESSION_KERNEL[Compression.parse(str(compression).partition("@")[0])]
    if sparse:
        return group
    if algorithm == "gemm" and pointwise_tile(spec, dtype, simd_bits) is not None:
        return f"{group}/pointwise"
    if algorithm == "direct" and spec.depthwise:
        return f"{group}/depthwise"
    return group


#: How strongly ``adapted_map`` shrinks each fitted term to the zero-shot map, as many rows
#: of measurements as each prior weighs. The overall offset, which every measurement informs,
#: is held least: with a prior of five rows against each conv shape's half row, ten
#: measurements of six shapes left most of a machine's common offset in the shapes' own
#: offsets, and every unmeasured kernel kept it (`benchmarks/README.md`, active learning).
PRIOR_ROWS = {"offset": 0.5, "slope": 5.0, "group": 2.0, "conv": 2.0}


def adapted_map(device, reference: str, log_ref: np.ndarray, log_scale: np.ndarray,
                log_meas: np.ndarray, groups: list[str], base: DeviceMap | None = None,
                data: Path | None = None, convs: list[str] | None = None,
                x_var: float | None = None, fit_slope: bool = True) -> DeviceMap:
    """An offset, a slope on the reference's log latency and an offset per kernel group
    (compression/algorithm: a device may run float16 or one algorithm unlike the
    reference), fitted on the user's measurements; the offset is shrunk to the zero-shot
    map's, the slope to 1 and the group offsets to 0 by the priors of :data:`PRIOR_ROWS`.
    With ``convs``, each measured conv shape also gets an offset (shrunk to 0), shared by
    its kernels of every group: what one measurement of a layer says about its other
    configurations. ``x_var``: the spread of the reference's log latencies over every kernel
    that will be predicted (default: over the measured ones), which scales the slope's
    prior so that a few measurements of similar kernels cannot tilt it. ``fit_slope=False``
    keeps the slope at 1: a map fitted on whole networks is applied to each of their kernels,
    and a power of a sum is not the sum of the powers of its terms (with a slope under 1
    every small kernel would be priced up)."""
    if base is None:
        base = zero_shot_map(device, reference, data) if device.peak_gflops else \
            DeviceMap(device.name, reference, "zero-shot", 0.0, 0.0, -1.0, 1.0)
    x, y = log_ref, log_meas - log_scale
    extra = sorted(set(groups))
    shapes = sorted(set(convs)) if convs else []
    xm = x.mean()

    slopes = 1 if fit_slope else 0  # the slope's column, where it is fitted
    y_fit = y if fit_slope else y - x  # slope 1: the offsets fit what is left

    def design(idx):
        return np.c_[np.ones(len(idx)), (x[idx] - xm)[:, None][:, :slopes],
                     [[float(groups[i] == g) for g in extra] for i in idx],
                     [[float(convs[i] == c) for c in shapes] for i in idx]
                     if shapes else np.zeros((len(idx), 0))]

    def fit(idx):
        A = design(idx)
        P = np.diag([PRIOR_ROWS["offset"]]
                    + [PRIOR_ROWS["slope"] * max(np.var(x) if x_var is None else x_var, 1e-3)]
                    * slopes + [PRIOR_ROWS["group"]] * len(extra)
                    + [PRIOR_ROWS["conv"]] * len(shapes))
        # the prior is the zero-shot map: y = x, i.e. xm at the centre, slope 1, no offsets
        target = np.r_[xm if fit_slope else 0.0, [1.0] * slopes,
                       np.zeros(len(extra) + len(shapes))]
        return np.linalg.solve(A.T @ A + P, A.T @ y_fit[idx] + P @ target)

    every = np.arange(len(x))
    coef = fit(every)
    loo = np.array([design([i])[0] @ fit(np.delete(every, i)) for i in every]) - y_fit
    q10, q90 = (np.quantile(loo, [0.1, 0.9]) if len(loo) >= 5 else (base.q10, base.q90))
    slope = float(coef[1]) if fit_slope else 1.0
    offset = float(coef[0] - slope * xm) if fit_slope else float(coef[0])
    rest = coef[1 + slopes:]
    return DeviceMap(device.name, reference, "adapted", base.alpha, base.beta,
                     float(min(q10, -0.05)), float(max(q90, 0.05)), offset, slope, len(x),
                     {g: float(v) for g, v in zip(extra, rest[:len(extra)])},
                     {c: float(v) for c, v in zip(shapes, rest[len(extra):])})


def reference_predictions(reference: str, kernels: list[tuple], directory: Path | None = None
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds (median, 10 % and 90 %) of (spec, algorithm, compression, ratio, tuning)
    rows as ``reference``'s trained layer model predicts them (its features see the roofs it
    was trained with): its model as a reference (:func:`reference_dir`), as ``recommend``
    maps it, or the model in ``directory`` (a device's own, where it has one)."""
    from dlas_predict.models.features import features
    from dlas_predict.corpus.kernels import KernelConfig
    from dlas_predict.models.device import features_device, load_models
    from dlas_predict.space.config import Algorithm, Compression, Tuning
    from dlas_predict.space.devices import get_device

    models = load_models(reference, directory or reference_dir(reference))
    layer, info = models.layer, models.info
    dev = features_device(get_device(reference, with_target=False), info)
    X = np.array([features(KernelConfig(spec, Algorithm.parse(a), Compression.parse(c),
                                        float(r), Tuning.parse(t)), dev)
                  for spec, a, c, r, t in kernels])
    mid = layer.predict(X)
    low, high = layer.predict_interval(X)
    return mid, low, high


def reference_log_latency(reference: str, kernels: list[tuple]) -> np.ndarray:
    """log seconds of the rows on ``reference`` (:func:`reference_predictions`)."""
    return np.log(reference_predictions(reference, kernels)[0])


def measured_only(name: str, ref, shots: int = 0):
    """A device known by measurements alone: the reference's entry under its name, with no
    spec, target or fingerprint (none is invented)."""
    from dataclasses import replace

    return replace(ref, name=name, description=f"known by {shots} measurements (adapt)",
                   target={}, peak_gflops={}, mem_bandwidth_gbs=None, fingerprint="",
                   origin="adapted", profile_of=None, rpc_key=None)


def device_map(name: str):
    """(map, device, reference device) of a device with no trained model: the map ``adapt``
    fitted, else the zero-shot map from its spec. Remembered in a process while the files
    it comes from (the adapted map, the user's registry, the measured roofs) are unchanged."""
    from dlas_predict.crossdev.adapted import adapted_path
    from dlas_predict.paths import dlas_home

    def stamp(path: Path):
        try:
            return path.stat().st_mtime_ns
        except OSError:
            return None

    home = dlas_home()
    peaks = home / "cache" / "devices"  # roofs measured here (devices --measure-peaks)
    key = (name, str(home), stamp(adapted_path(name)),
           stamp(home / "devices.json"),
           tuple((p.name, stamp(p)) for p in sorted(peaks.glob("*.json"))))
    if key not in _MAPS:
        if len(_MAPS) > 256:
            _MAPS.clear()
        _MAPS[key] = _device_map(name)
    return _MAPS[key]


#: device_map's answers, by the device and the stamps of its files.
_MAPS: dict[tuple, tuple] = {}


def _device_map(name: str):
    from dlas_predict.crossdev.adapted import read_adapted
    from dlas_predict.errors import DeviceError
    from dlas_predict.space.devices import device_names, get_device

    adapted = read_adapted(name)
    saved = _saved_map(name, adapted)
    if name in device_names():
        dev = get_device(name, with_target=False)
        if saved is not None and not foreign_map(saved, dev):
            return saved, dev, data_spec(saved.reference)
        ref = reference_for(dev)
        return zero_shot_map(dev, ref), dev, data_spec(ref)
    if saved is not None:
        m = saved
        ref = data_spec(m.reference)
        return m, measured_only(name, ref, m.shots), ref
    if adapted:
        raise DeviceError(f"device {name!r} was adapted on {adapted['source']}'s "
                          f"{adapted['level']}s; `recommend` needs conv or whole-network "
                          f"measurements (`adapt "
                          f"--device {name} --measurements FILE.csv` with conv: targets)")
    from dlas_predict.crossdev.adapted import adapted_devices

    known = device_names() + [d for d in adapted_devices() if d not in device_names()]
    raise DeviceError(f"unknown device {name!r}: it has neither a spec (`devices add`) nor "
                      f"measurements (`adapt --device {name} --measurements FILE.csv`); "
                      f"known: {', '.join(known)}")


def _saved_map(name: str, adapted: dict | None) -> DeviceMap | None:
    from dlas_predict.crossdev.adapted import adapted_path

    saved = (adapted or {}).get("recommend_map")
    if not saved:
        return None
    try:
        return DeviceMap.from_dict(saved)
    except (TypeError, ValueError) as exc:
        raise DlasError(f"adapted model {adapted_path(name)} is unreadable "
                        f"({exc}); run `calibrate` or `adapt` again") from None


def foreign_map(m: DeviceMap, dev) -> bool:
    """``m`` was calibrated on another machine than the one ``dev`` is measured on (this
    machine's CPU and its profiles: another fingerprint)."""
    return bool(m.fingerprint and dev.fingerprint and m.fingerprint != dev.fingerprint)


def foreign_calibration(name: str) -> str | None:
    """The fingerprint of ``name``'s saved calibration where it is of another machine and so
    not used here (None otherwise)."""
    from dlas_predict.crossdev.adapted import read_adapted
    from dlas_predict.space.devices import device_names, get_device

    if name not in device_names():
        return None
    m = _saved_map(name, read_adapted(name))
    dev = get_device(name, with_target=False)
    return m.fingerprint if m is not None and foreign_map(m, dev) else None
