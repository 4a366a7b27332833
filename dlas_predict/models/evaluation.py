"""Training data from a corpus, and leave-one-network-out evaluation of the cost models.

A *configuration* of a network is one compression (pruned at one global ratio) with one
convolution algorithm for every layer, the study's unit. Its latency here is the sum of its
conv kernels' measured latencies (each the fastest timed run) — **conv layers only**:
whole-network latencies (non-conv ops, traffic between layers) come with the whole-network
build, and are not in this sum.

Leave-one-network-out: for each network, the models are trained on every kernel that the
network does not use (a workload shared with another network is held out too), and predict
the held-out network's kernels and configurations.

Whole networks (:func:`whole_network_lono`): the same, on measured whole-network latencies;
the network-level residual and the ranker are trained on the other networks' whole
measurements only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlas_predict.space.config import GRID_ALGORITHMS, ConvSpec
from dlas_predict.models.costmodel import (LayerCostModel, MacsLinearBaseline, RooflineBaseline,
                                           kendall_tau, mape, regret, top1_hit, within)
from dlas_predict.space.devices import Device, get_device
from dlas_predict.errors import DlasError
from dlas_predict.models.features import features
from dlas_predict.corpus.kernels import (KernelKey, config_from_row, kernel_key, modelled_seconds,
                                         other_schedule, preferred_records, untuned_simd)

MODELS = ("lightgbm", "stage", "roofline", "macs_linear")


@dataclass
class Corpus:
    """The successful measurements of one device, as features and targets."""

    device: Device
    keys: list[KernelKey]
    X: np.ndarray
    seconds: np.ndarray
    configs: list[dict] = field(default_factory=list)  # network_configs rows
    fingerprint: str = ""
    #: Which measurements the layer model learns from (all, if empty): not the records of
    #: an untuned kernel that ran another schedule than today's code builds
    #: (:func:`other_schedule`), which still pair with the whole networks built with them.
    learns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def learned(self) -> np.ndarray:
        """The indices of the measurements the layer model learns from."""
        if not len(self.learns):
            return np.arange(len(self.keys))
        return np.flatnonzero(self.learns)

    def index(self) -> dict[KernelKey, int]:
        return {k: i for i, k in enumerate(self.keys)}


def load_corpus(store: Path, device: str = "local") -> Corpus:
    """Read every verified, successful measurement of ``device`` from a corpus store."""
    import hashlib

    from dlas_predict.corpus.store import CorpusStore

    from dlas_predict.corpus.store import store_device
    from dlas_predict.space.devices import fingerprint_here

    get_device(device, with_target=False)  # an unknown name is one clear error
    # the roofs of the machine that measured the corpus, whichever machine trains
    dev = store_device(store, device, fingerprint_here(device))
    with CorpusStore(store, must_exist=True) as db:
        rows = [r for r in db.current_rows("error IS NULL AND device = ?", (dev.name,))
                if r["verified"] in (1, True, None)]
        configs = db.network_configs()
    dev = with_evidenced_isa(dev, rows)
    chosen = preferred_records(rows, dev)
    keys = list(chosen)
    cfgs = [config_from_row(r) for r in chosen.values()]
    rows_x = [features(c, dev) for c in cfgs]
    secs = [modelled_seconds(r) for r in chosen.values()]
    if not keys:
        raise DlasError(f"{store} holds no successful measurement for device {dev.name!r}; "
                        f"collect some with `dlas-predict collect --device {dev.name} "
                        f"--network zoo:resnet18-cifar --store {store}`")
    fp = hashlib.sha256(repr(sorted(zip(keys, secs))).encode()).hexdigest()[:16]
    learns = np.array([not other_schedule(r, dev, c) for r, c in zip(chosen.values(), cfgs)],
                      dtype=bool)
    return Corpus(dev, keys, np.array(rows_x, dtype=np.float64), np.array(secs), configs, fp,
                  learns)


def with_evidenced_isa(device: Device, rows: list[dict]) -> Device:
    """``device`` with AVX-512 VNNI among its ISA flags where its own verified kernel records
    prove it: a kernel built with the ``vnni`` knob ran there and matched the reference. The
    shipped roofs of another machine carry no flags, and the default knobs that decide which
    records are today's schedules (:func:`~dlas_predict.corpus.kernels.runs_today`) depend on
    them."""
    import json
    from dataclasses import replace

    if device.kind != "cpu" or device.vnni:
        return device
    for r in rows:
        knobs = r.get("knobs") or ""
        if '"vnni"' in knobs and json.loads(knobs).get("vnni"):
            return replace(device, isa_flags=(*device.isa_flags, "avx512_vnni"))
    return device


@dataclass(frozen=True)
class NetworkConfig:
    """One configuration of one network and the corpus rows of its conv layers."""

    network: str
    config: str  # e.g. "weight_pruning@0.9"
    algorithm: str
    rows: tuple[int, ...]


def network_configurations(corpus: Corpus, network: str,
                           algorithms=tuple(a.value for a in GRID_ALGORITHMS)) -> list[NetworkConfig]:
    """Every configuration of ``network`` whose conv kernels are all measured."""
    index = corpus.index()
    by_config: dict[str, list[dict]] = {}
    for r in corpus.configs:
        if r["network"] == network:
            by_config.setdefault(r["config"], []).append(r)
    out = []
    for label, layers in sorted(by_config.items()):
        for alg in algorithms:
            idx = [index.get(kernel_key(l["conv"], alg, l["compression"], l["ratio"]))
                   for l in layers]
            if all(i is not None for i in idx):
                out.append(NetworkConfig(network, label, alg, tuple(idx)))
    return out


def _fit_all(X: np.ndarray, y: np.ndarray, seed: int = 0) -> dict:
    model = LayerCostModel(seed=seed).fit(X, y)
    return {"lightgbm": model,
            "stage": model.stage_,  # the stage-cost model alone: what the trees add to it
            "roofline": RooflineBaseline().fit(X, y),
            "macs_linear": MacsLinearBaseline().fit(X, y)}


class HeldOutFits:
    """The models of each leave-one-network-out round, fitted once and shared by the
    conv-only and the whole-network evaluations: round N trains on every kernel that network
    N uses nowhere (neither in its configurations nor in its measured whole networks)."""

    def __init__(self, corpus: Corpus, whole: list | None = None, seed: int = 0):
        self.corpus, self.seed, self._fits = corpus, seed, {}
        self.used: dict[str, set[int]] = {}
        for net in {r["network"] for r in corpus.configs}:
            self.used[net] = {i for c in network_configurations(corpus, net) for i in c.rows}
        for r in whole or []:
            self.used.setdefault(r.network, set()).update(r.rows)

    def models(self, net: str) -> dict | None:
        """The models trained without ``net``'s kernels (None: too little left to train)."""
        if net not in self._fits:
            train = np.setdiff1d(self.corpus.learned(), sorted(self.used[net]))
            self._fits[net] = (None if len(train) < 10 else
                               _fit_all(self.corpus.X[train], self.corpus.seconds[train],
                                        self.seed))
        return self._fits[net]


@dataclass
class Scores:
    """One predictor's figures on held-out networks: MAPE and share within ±10 % (None for a
    ranker, which gives no seconds), Kendall τ, top-1 hit and regret; conv-level reports add
    the per-kernel MAPE, whole-network ones the top-3 gap (and, overall, the share of
    networks whose predicted top 3 holds a configuration within 5 % of the best)."""

    mape: float | None
    within_10pct: float | None
    kendall_tau: float
    top1_hit: float
    regret: float
    layer_mape: float | None = None
    top3_gap: float | None = None
    top3_within_5pct: float | None = None
    #: the share of measured times inside the predicted 80 % interval (whole networks priced
    #: as ``recommend`` prices them: the layers' intervals summed, widened by the network
    #: model's own error)
    coverage: float | None = None

    def to_dict(self) -> dict:
        out = {} if self.layer_mape is None else {"layer_mape": self.layer_mape}
        out.update(mape=self.mape, within_10pct=self.within_10pct,
                   kendall_tau=self.kendall_tau, top1_hit=self.top1_hit, regret=self.regret)
        if self.top3_gap is not None:
            out["top3_gap"] = self.top3_gap
        if self.top3_within_5pct is not None:
            out["top3_within_5pct"] = self.top3_within_5pct
        if self.coverage is not None:
            out["coverage"] = self.coverage
        return out


@dataclass
class HeldOutNetwork:
    """One held-out network: its configurations, and each predictor's scores on them."""

    configurations: int
    scores: dict[str, Scores]
    kernels_held_out: int | None = None
    kernels_trained: int | None = None

    def to_dict(self) -> dict:
        out: dict = {"configurations": self.configurations}
        if self.kernels_held_out is not None:
            out.update(kernels_held_out=self.kernels_held_out,
                       kernels_trained=self.kernels_trained)
        return {**out, **{m: s.to_dict() for m, s in self.scores.items()}}


@dataclass
class EvaluationReport:
    """Leave-one-network-out on one device: per held-out network and pooled overall."""

    device: str
    scope: str
    networks: dict[str, HeldOutNetwork]
    overall: dict[str, Scores]

    def to_dict(self) -> dict:
        return {"device": self.device, "scope": self.scope,
                "networks": {n: h.to_dict() for n, h in self.networks.items()},
                "overall": {m: s.to_dict() for m, s in self.overall.items()}}


def leave_one_network_out(corpus: Corpus, seed: int = 0, fits: HeldOutFits | None = None
                          ) -> EvaluationReport:
    """Per held-out network and overall, for each model: layer MAPE, and over the network's
    configurations (conv-layer sums) MAPE, share within ±10 %, Kendall τ, top-1 hit and
    regret."""
    fits = fits or HeldOutFits(corpus, seed=seed)
    networks = sorted({r["network"] for r in corpus.configs})
    if len(networks) < 2:
        raise DlasError("leave-one-network-out needs configurations of at least two networks "
                        "in the corpus (collect more networks)")
    per_net: dict[str, HeldOutNetwork] = {}
    pooled = {m: {"cfg_pred": [], "cfg_true": [], "layer_pred": [], "layer_true": []}
              for m in MODELS}
    for net in networks:
        cfgs = network_configurations(corpus, net)
        if len(cfgs) < 2:
            continue
        used = sorted({i for c in cfgs for i in c.rows})
        models = fits.models(net)
        if models is None:
            continue
        per_net[net] = HeldOutNetwork(len(cfgs), {}, len(fits.used[net]),
                                      int(len(corpus.keys) - len(fits.used[net])))
        for name, model in models.items():
            pred = model.predict(corpus.X[used])
            lookup = dict(zip(used, pred))
            p = np.array([sum(lookup[i] for i in c.rows) for c in cfgs])
            t = np.array([sum(corpus.seconds[i] for i in c.rows) for c in cfgs])
            per_net[net].scores[name] = Scores(
                mape=mape(p, t), within_10pct=within(p, t), kendall_tau=kendall_tau(p, t),
                top1_hit=top1_hit(p, t), regret=regret(p, t),
                layer_mape=mape(pred, corpus.seconds[used]))
            pooled[name]["cfg_pred"] += list(p)
            pooled[name]["cfg_true"] += list(t)
            pooled[name]["layer_pred"] += list(pred)
            pooled[name]["layer_true"] += list(corpus.seconds[used])
    if not per_net:
        raise DlasError("no network has two fully measured configurations to evaluate")
    overall = {}
    for name in MODELS:
        p, t = np.array(pooled[name]["cfg_pred"]), np.array(pooled[name]["cfg_true"])
        lp, lt = np.array(pooled[name]["layer_pred"]), np.array(pooled[name]["layer_true"])
        nets = [v.scores[name] for v in per_net.values()]
        overall[name] = Scores(
            mape=mape(p, t), within_10pct=within(p, t),
            kendall_tau=float(np.nanmean([n.kendall_tau for n in nets])),
            top1_hit=float(np.mean([n.top1_hit for n in nets])),
            regret=float(np.mean([n.regret for n in nets])), layer_mape=mape(lp, lt))
    return EvaluationReport(corpus.device.name, "conv layers only (sum of kernels)", per_net,
                            overall)


# ---- whole networks ------------------------------------------------------------------------
@dataclass(frozen=True)
class WholeRow:
    """One measured whole network and the corpus rows of the kernels it runs."""

    network: str
    config: str
    algorithm: str
    compression: str
    seconds: float
    summary: object  # netmodel.NetworkSummary
    rows: tuple[int, ...]
    plan: tuple[tuple[str, bool], ...]   # (algorithm, sparse) per conv layer
    ratios: tuple[float, ...]            # each conv layer's kernel ratio
    matrix: bool = False                 # a matrix network's (its layers fully connected)


#: Summary fields that a network's own stored summary without them (a channel-pruned build,
#: its zeroed filters removed) gets from the named network's, scaled by the two's non-conv
#: bytes: the pools' window reads scale with their channels, and the elements through
#: softmax and erf, and what attention's products write and compute, with their heads and
#: FFN neurons, as their bytes do.
SCALED_WITH_NONCONV_BYTES = frozenset({"pool_window_elems", "erf_softmax_elems",
                                       "product_out_elems", "product_narrow_macs"})
#: Summary fields that only an int8 run uses (onnxruntime's QDQ float convs, its quantized
#: average pools): a channel-pruned build's own summary without them has them zero (it is
#: never quantized), and so has a stored summary without them of a network not built again
#: by name.
INT8_ONLY = frozenset({"qdq_float_conv_macs", "qdq_float_conv_io_bytes",
                       "qdq_float_conv_params", "avgpool_window_elems"})
#: Summary fields that count a network's structure, which removing channels leaves as it
#: is, and that only the engine's rules read (:func:`unchanged_builds`), no cost model: a
#: stored summary without them has the named network's, or zero for a network not built
#: again by name.
STRUCTURE_ONLY = frozenset({"concat_inputs"})


def stored_summary(network: str, text: str | None):
    """The stored summary of a measured network; one stored before a field existed (or
    none) is computed again from the zoo network of that name, or from the generated network
    its name describes (built again: its weights are seeded by its name), and kept only if
    it agrees with every field stored. A channel-pruned network's own summary, its zeroed
    filters removed, is not the named network's: where it lacks only fields of
    :data:`SCALED_WITH_NONCONV_BYTES`, :data:`INT8_ONLY` and :data:`STRUCTURE_ONLY` they
    are the named network's scaled (zero, and as they are), else it is None (unusable)."""
    import json
    from dataclasses import asdict, fields

    from dlas_predict.networks.summary import NetworkSummary

    stored = json.loads(text) if text else {}
    missing = {f.name for f in fields(NetworkSummary)} - set(stored)
    if stored and not missing:
        return NetworkSummary(**stored)
    fresh = named_summary(network)
    if fresh is None:
        # a network not built again by name, stored before the int8-only or the structure
        # fields: they are zero (only an int8 onnxruntime run reads the former, and its
        # model leaves such rows out; only the engine's rules the latter, from the record)
        return NetworkSummary(**stored, **{k: 0 for k in missing}) \
            if stored and missing <= INT8_ONLY | STRUCTURE_ONLY else None
    named = asdict(fresh)
    if all(named.get(k, v) == v for k, v in stored.items()):
        return fresh
    if stored and missing <= SCALED_WITH_NONCONV_BYTES | INT8_ONLY | STRUCTURE_ONLY \
            and named["nonconv_bytes"] > 0:
        scale = stored.get("nonconv_bytes", 0) / named["nonconv_bytes"]
        return NetworkSummary(**stored, **{
            k: 0 if k in INT8_ONLY else named[k] if k in STRUCTURE_ONLY
            else round(named[k] * scale) for k in missing})
    return None


@functools.lru_cache(maxsize=None)
def named_summary(network: str):
    """The :class:`~dlas_predict.networks.summary.NetworkSummary` of the zoo network of that
    name, or of the generated network or NAS-Bench-201 cell its name describes; None for
    any other name. Kept per name: every record of a network asks for the same one."""
    from dlas_predict.networks.summary import NetworkSummary
    from dlas_predict.networks.zoo import named_network

    net = named_network(network)
    return None if net is None else NetworkSummary.of(net)


def layer_kernel_keys(layers: list[dict], plan: list) -> list[KernelKey]:
    """Kernel keys of a configuration's conv layers (``network_configs`` rows) under a plan
    of (algorithm, sparse) per layer; a dense kernel on a pruned layer is the dense one."""
    out = []
    for layer, (alg, sparse) in zip(layers, plan):
        pruned = layer["compression"] in ("weight_pruning", "channel_pruning")
        comp = layer["compression"] if (sparse or not pruned) else "dense"
        out.append(kernel_key(layer["conv"], alg, comp, layer["ratio"] if sparse else 0.0))
    return out


def drop_superseded(meas: list) -> list:
    """Whole-network records less those measured before the probes (no slowdown reading) whose
    network, configuration and algorithm also has a probed record. ``collect
    --retime-unprobed`` times such a configuration again, but a per-layer configuration whose
    kernels were timed again may pick another plan, stored beside the old one (a record is
    keyed by its plan): the old plan's unprobed time is superseded, not replaced."""
    probed = {(m.network, m.config, m.algorithm) for m in meas if m.slowdown is not None}
    return [m for m in meas if m.slowdown is not None
            or (m.network, m.config, m.algorithm) not in probed]


def channels_removed(layers: list[dict], dense: list[dict] | None) -> bool:
    """Whether a channel-pruning configuration's layers (``network_configs`` rows) are those
    of the network with its zeroed filters removed: some layer's shape differs from the
    dense network's. Stores collected before removal hold the dense shapes."""
    if not dense:
        return True
    shape = {r["layer_index"]: r["conv"] for r in dense}
    return any(shape.get(r["layer_index"]) != r["conv"] for r in layers)


def timed_these_layers(m, layers_of: dict[tuple, list[dict]]) -> bool:
    """Whether whole-network record ``m`` timed the network its configuration's layers
    describe: a channel-pruning build of an engine before
    :data:`~dlas_predict.measure.networks.plans.CHANNEL_REMOVAL_VERSION` ran the dense shapes (CSR
    over the zeroed filters), the later ones the removed network."""
    from dlas_predict.measure.networks.plans import ONNXRUNTIME, removes_channels

    if not m.config.startswith("channel_pruning") or m.algorithm == ONNXRUNTIME:
        return True
    layers = layers_of.get((m.network, m.config))
    if not layers:
        return True
    old = bool(m.version) and not removes_channels(m.version)
    return old != channels_removed(layers, layers_of.get((m.network, "dense")))


#: With our builds of at least this many networks timed by today's engine, the network
#: model learns from those alone: older engines' builds are left out, not mixed in.
MIN_CURRENT_ENGINE_NETWORKS = 20


def current_engine(m, unchanged=None) -> bool:
    """Whether whole-network record ``m`` was timed by today's engine (or carries no
    version): the CPU engine's version for its algorithm, or the GPU engine's; or a carried
    engine's (:data:`~dlas_predict.measure.networks.plans.CARRIED_VERSIONS`), where
    ``unchanged(m)`` says today's engine builds it the same way."""
    from dlas_predict.measure.networks.plans import (CARRIED_VERSIONS, GPU_NETWORK_VERSION,
                                                     NETWORK_VERSION, engine_version)

    today = engine_version(m.algorithm, m.tuned_layers is not None)
    if not m.version or m.version == GPU_NETWORK_VERSION or m.version == today:
        return True
    return (unchanged is not None and today == NETWORK_VERSION
            and m.version in CARRIED_VERSIONS and unchanged(m))


def drop_older_engines(meas: list, unchanged=None) -> list:
    """Whole-network records less those of an older engine version whose network,
    configuration and algorithm the current engine has measured; and, once today's engine
    has timed our builds of :data:`MIN_CURRENT_ENGINE_NETWORKS` networks, less every older
    engine's build (it ran other code). ``unchanged(m)``: whether today's engine builds a
    record of a carried engine the same way (it counts as today's)."""
    from dlas_predict.measure.networks.plans import ONNXRUNTIME

    now = {id(m): current_engine(m, unchanged) for m in meas}
    current = {(m.network, m.config, m.algorithm) for m in meas if now[id(m)]}
    meas = [m for m in meas
            if now[id(m)] or (m.network, m.config, m.algorithm) not in current]
    ours = {m.network for m in meas if m.algorithm != ONNXRUNTIME and now[id(m)]
            and m.version}
    if len(ours) >= MIN_CURRENT_ENGINE_NETWORKS:
        meas = [m for m in meas if now[id(m)]]
    return meas


def unchanged_builds(layers_of: dict[tuple, list[dict]], device: Device):
    """``unchanged(m)`` for :func:`drop_older_engines`: whether today's engine builds a
    carried engine's record ``m`` the same way on ``device``
    (:func:`~dlas_predict.measure.networks.plans.rebuilt_since` on its configuration's layers)."""
    import json

    from dlas_predict.measure.networks.plans import CARRIED_VERSIONS, config_dtype, rebuilt_since

    simd = untuned_simd(device)  # the vector width today's default knobs are sized for
    parse = functools.lru_cache(maxsize=None)(ConvSpec.parse)  # networks share their layers

    def unchanged(m) -> bool:
        layers = layers_of.get((m.network, m.config))
        plan = json.loads(m.plan) if m.plan else []
        if not layers or len(layers) != len(plan) or m.version not in CARRIED_VERSIONS:
            return False
        summary = json.loads(m.summary) if m.summary else None
        if summary is not None and not STRUCTURE_ONLY <= set(summary):
            # stored before the structure fields: the named network's, where one is built
            # by that name (none: the rules take them as unknown)
            named = named_summary(m.network)
            if named is not None:
                summary = {**{k: getattr(named, k) for k in STRUCTURE_ONLY}, **summary}
        return not rebuilt_since(m.version, plan, [parse(l["conv"]) for l in layers], simd,
                                 summary, config_dtype(m.config), device.vnni)

    return unchanged


def whole_rows(corpus: Corpus, store: Path) -> list[WholeRow]:
    """The whole-network measurements of ``corpus.device`` whose every conv kernel is in the
    corpus (so the measured conv sum is known); float32 ones only when verified; superseded
    ones left out (:func:`drop_superseded`)."""
    import json

    from dlas_predict.corpus.store import CorpusStore

    from dlas_predict.measure.networks.plans import (GPU_NETWORK_VERSION, NETWORK_VERSION,
                                                     PREVIOUS_NETWORK_VERSIONS)
    from dlas_predict.networks.matrix import is_matrix_layer

    versions = (NETWORK_VERSION, *PREVIOUS_NETWORK_VERSIONS, GPU_NETWORK_VERSION)
    with CorpusStore(store, must_exist=True) as db:
        meas = db.network_records(
            f"error IS NULL AND device = ? AND kernels_version IN "
            f"({', '.join('?' * len(versions))})", (corpus.device.name, *versions))
    layers_of: dict[tuple, list[dict]] = {}
    for r in corpus.configs:
        layers_of.setdefault((r["network"], r["config"]), []).append(r)
    meas = drop_superseded(drop_older_engines(meas, unchanged_builds(layers_of,
                                                                     corpus.device)))
    index = corpus.index()
    meas = [m for m in meas if timed_these_layers(m, layers_of)]
    summaries: dict[str, object] = {}
    out = []
    for m in meas:
        # float32 builds must match onnxruntime tightly; a float16/int8 build that loses
        # top-1 agreement still ran our kernels (random-weight networks whose logits are
        # ~1e-14 collapse in reduced precision), so its time is kept
        if m.verified is False and m.dtype == "float32":
            continue
        layers = layers_of.get((m.network, m.config))
        plan = json.loads(m.plan)
        if not layers or len(layers) != len(plan):
            continue
        idx = [index.get(k) for k in layer_kernel_keys(layers, plan)]
        if any(i is None for i in idx):
            continue
        if summaries.get(m.network) is None:  # the first record whose summary is usable
            summaries[m.network] = stored_summary(m.network, m.summary)
        if summaries[m.network] is None:
            continue
        seconds = m.best_s if m.best_s is not None else m.median_s
        out.append(WholeRow(m.network, m.config, m.algorithm, layers[0]["compression"],
                            seconds, summaries[m.network], tuple(idx),
                            tuple((a, bool(s)) for a, s in plan),
                            tuple(float(l["ratio"]) for l in layers),
                            any(is_matrix_layer(l["layer_name"]) for l in layers)))
    return out


def whole_features(rows: list[WholeRow], conv_s: np.ndarray, device: Device) -> np.ndarray:
    """The ranker's feature rows (:data:`~dlas_predict.models.netmodel.NET_FEATURE_NAMES`)."""
    from dlas_predict.space.config import Compression
    from dlas_predict.models.netmodel import net_features

    return np.array([net_features(r.summary, float(c), Compression.parse(r.compression),
                                  list(r.plan), list(r.ratios), device)
                     for r, c in zip(rows, conv_s)], dtype=np.float64)


def whole_terms(corpus: Corpus, rows: list[WholeRow], layer_s: list) -> np.ndarray:
    """The network model's terms (:data:`~dlas_predict.models.netmodel.NET_TERMS`) on the corpus's
    device; ``layer_s``: per row, each conv layer's kernel seconds (measured or
    predicted)."""
    from dlas_predict.space.config import Compression
    from dlas_predict.models.features import weight_bytes
    from dlas_predict.models.netmodel import last_level_cache_bytes, net_terms

    cache = last_level_cache_bytes(corpus.device)
    return np.array([net_terms(r.summary, s, Compression.parse(r.compression), list(r.plan),
                               weight_bytes(corpus.X[list(r.rows)]), cache)
                     for r, s in zip(rows, layer_s)], dtype=np.float64)


def measured_layer_seconds(corpus: Corpus, rows: list[WholeRow]) -> list[np.ndarray]:
    """Each whole row's conv layers' measured kernel seconds."""
    return [corpus.seconds[list(r.rows)] for r in rows]


#: Whole-network predictors compared by :func:`whole_network_lono`.
WHOLE_MODELS = ("lightgbm+residual", "lightgbm_conv_sum", "stage+residual", "roofline+residual",
                "macs_linear+residual", "ranker", "measured_conv+residual")
#: Not a predictor: the network model given the held-out network's *measured* conv kernels,
#: the bound a perfect layer model would reach.
BOUND = "measured_conv+residual"


def _top3_gap(pred: np.ndarray, true: np.ndarray, higher_is_better: bool = False) -> float:
    """Best measured of the predicted top 3 over the best measured (1.0 = found)."""
    order = np.argsort(-pred if higher_is_better else pred)[:3]
    return float(true[order].min() / true.min())


@dataclass
class StoreEvaluation:
    """``evaluate --store``: leave-one-network-out on a store's kernel records
    (``kernels``) and, where it holds whole-network measurements of at least three
    networks, on those (``whole``, over ``whole_measurements`` of them)."""

    kernels: EvaluationReport
    whole: EvaluationReport | None
    whole_measurements: int

    def to_dict(self) -> dict:
        return {**self.kernels.to_dict(),
                "whole_networks": self.whole.to_dict() if self.whole is not None else None}


def evaluate_store(store: Path, device: str = "local", seed: int = 0) -> StoreEvaluation:
    """Leave one network out on the records of ``device`` in ``store``: the kernels, and the
    whole networks where there are three networks' measurements; one set of held-out fits
    serves both."""
    corpus = load_corpus(store, device)
    rows = whole_rows(corpus, store)
    fits = HeldOutFits(corpus, rows, seed)
    kernels = leave_one_network_out(corpus, seed, fits)
    whole = (whole_network_lono(corpus, rows, seed, fits)
             if len({r.network for r in rows}) >= 3 else None)
    return StoreEvaluation(kernels, whole, len(rows))


def whole_network_lono(corpus: Corpus, rows: list[WholeRow], seed: int = 0,
                       fits: HeldOutFits | None = None) -> EvaluationReport:
    """Leave one network out over measured whole networks: per held-out network and
    overall, MAPE, share within ±10 %, Kendall τ, top-1 hit, regret and the top-3 gap."""
    from dlas_predict.models.netmodel import (MIN_CORRECTION_NETWORKS, MIN_CORRECTION_ROWS,
                                              ConfigRanker, NetworkCostModel, NetworkInputs,
                                              fits_correction, last_level_cache_bytes)

    networks = sorted({r.network for r in rows})
    if len(networks) < 3:
        raise DlasError("whole-network evaluation needs whole-network measurements of at least "
                        "three networks (`dlas-predict collect --whole-network`)")
    fits = fits or HeldOutFits(corpus, rows, seed)
    dev = corpus.device
    layer_meas = measured_layer_seconds(corpus, rows)
    measured_conv = np.array([s.sum() for s in layer_meas])
    truth = np.array([r.seconds for r in rows])
    X_meas = whole_features(rows, measured_conv, dev)
    cache = last_level_cache_bytes(dev)
    T_meas = whole_terms(corpus, rows, layer_meas)
    per_net: dict[str, HeldOutNetwork] = {}
    pooled = {m: ([], []) for m in WHOLE_MODELS}
    # by model: whether each held-out row's truth lies in its 80 % interval
    pooled_inside: dict[str, list[bool]] = {}
    corrected = set()  # whether each held-out network's model had a correction
    for net in networks:
        inside: dict[str, np.ndarray] = {}  # the same, this network's rows
        test = [i for i, r in enumerate(rows) if r.network == net]
        # the network model that prices the held-out network: a CNN's learns from CNNs, a
        # matrix network's from every network
        matrix = bool(test) and rows[test[0]].matrix
        trainw = [i for i, r in enumerate(rows)
                  if r.network != net and (matrix or not r.matrix)]
        if len(test) < 2:
            continue
        used = sorted({k for i in test for k in rows[i].rows})
        layer_models = fits.models(net)
        if layer_models is None:
            continue
        # the shipped models' rule (their fit knows the networks): a correction only where
        # enough networks train it
        enough = fits_correction(len(trainw), len({rows[i].network for i in trainw}))
        residual = NetworkCostModel(cache_bytes=cache, seed=seed).fit(
            NetworkInputs.point(T_meas[trainw], measured_conv[trainw],
                                X_meas[trainw] if enough else None), truth[trainw])
        corrected.add(residual.corrected)
        ranker = ConfigRanker(seed=seed).fit(X_meas[trainw], truth[trainw],
                                             [rows[i].network for i in trainw])
        preds = {BOUND: residual.predict(NetworkInputs.point(T_meas[test], measured_conv[test],
                                                             X_meas[test]))}
        held = [rows[i] for i in test]
        for name, model in layer_models.items():
            lp = dict(zip(used, model.predict(corpus.X[used])))
            layer_s = [[lp[k] for k in r.rows] for r in held]
            conv = np.array([sum(s) for s in layer_s])
            X = whole_features(held, conv, dev)
            label = {"lightgbm": "lightgbm+residual", "stage": "stage+residual",
                     "roofline": "roofline+residual",
                     "macs_linear": "macs_linear+residual"}[name]
            terms = whole_terms(corpus, held, layer_s)
            preds[label] = residual.predict(NetworkInputs.point(terms, conv, X))
            if name == "lightgbm":
                preds["lightgbm_conv_sum"] = conv
                preds["ranker"] = -ranker.predict(X)  # lower is better, like a latency
                lo, hi = model.predict_interval(corpus.X[used])
                lo, hi = dict(zip(used, lo)), dict(zip(used, hi))
                low, high = residual.predict_interval(NetworkInputs(
                    terms, conv, np.array([sum(lo[k] for k in r.rows) for r in held]),
                    np.array([sum(hi[k] for k in r.rows) for r in held]), X))
                inside[label] = (truth[test] >= low) & (truth[test] <= high)
        t = truth[test]
        per_net[net] = HeldOutNetwork(len(test), {})
        for name, p in preds.items():
            ranking_only = name == "ranker"
            per_net[net].scores[name] = Scores(
                mape=None if ranking_only else mape(p, t),
                within_10pct=None if ranking_only else within(p, t),
                kendall_tau=kendall_tau(p, t), top1_hit=top1_hit(p, t), regret=regret(p, t),
                top3_gap=_top3_gap(p, t),
                coverage=float(np.mean(inside[name])) if name in inside else None)
            if not ranking_only:
                pooled[name][0].extend(p)
                pooled[name][1].extend(t)
            if name in inside:
                pooled_inside.setdefault(name, []).extend(inside[name])
    if not per_net:
        raise DlasError("no network has two measured whole-network configurations")
    overall = {}
    for name in WHOLE_MODELS:
        nets = [v.scores[name] for v in per_net.values()]
        p, t = np.array(pooled[name][0]), np.array(pooled[name][1])
        overall[name] = Scores(
            mape=mape(p, t) if len(p) else None,
            within_10pct=within(p, t) if len(p) else None,
            kendall_tau=float(np.nanmean([n.kendall_tau for n in nets])),
            top1_hit=float(np.mean([n.top1_hit for n in nets])),
            regret=float(np.mean([n.regret for n in nets])),
            top3_gap=float(np.mean([n.top3_gap for n in nets])),
            top3_within_5pct=float(np.mean([n.top3_gap <= 1.05 for n in nets])),
            coverage=float(np.mean(pooled_inside[name])) if name in pooled_inside else None)
    if corrected == {True}:
        network_model = "the linear terms times the correction"
    elif corrected == {False}:
        network_model = (f"the linear terms alone (a correction needs {MIN_CORRECTION_ROWS} "
                         f"measurements of {MIN_CORRECTION_NETWORKS} training networks)")
    else:
        network_model = "the linear terms, times the correction where enough rows trained one"
    return EvaluationReport(dev.name, "whole networks (built by TVM Relax and timed); network "
                            f"model: {network_model}", per_net, overall)
