"""The onnxruntime backend's latency model: a whole network run by onnxruntime, per mode.

onnxruntime's kernels are not ours, so the layer model cannot price them. Its latency is
modelled from what the network does, as a non-negative sum of costs:

    t = c0 + c1·dense MACs + c2·depthwise MACs + c3·conv activation bytes
          + c4·conv weight bytes + c5·other ops' bytes + c6·layers
          + c7·elementwise ops + c8·elements through exponentials (SiLU's sigmoid)
          + c9·bytes of broadcasting elementwise ops (squeeze-excitation's scale)
          + c10·MACs of narrow convs (under 16 input or output channels)
          + c11·convs whose output channels are not a multiple of 8
          + c12·MACs and c13·activation bytes of the convs whose output joins a residual
            add or a non-ReLU activation (an epilogue that takes a second tensor)
          + c14·MACs of, c15·the number of and c16·activation bytes of the convs
            onnxruntime's blocked (NCHWc) layout cannot take (:func:`blocked_layout`; its
            block is the vector width in floats, 16 on AVX-512, 8 below). Those run MLAS's
            im2col GEMM, slower per MAC, with a reorder to and from the blocked layout.
          + c17·MACs, c18·activation bytes and c19·weights of the convs that the QDQ int8
            run leaves in float (:attr:`~dlas_predict.networks.graph.Layer.qdq_float`):
            each dequantizes its input and its weights and quantizes its output at every
            run. These three replace c12 and c13 in int8 mode and are zero in the others.
          + c20·MACs of the filters and channels the blocked layout pads up to its block
          + c24·window reads of the average pools, in int8 mode only: the QDQ run
            quantizes each into a QLinearAveragePool, several times slower per read than
            the float pool (a NAS-Bench-201 cell's int8 run takes 0.9-4.5× its fp32 time)
          + c27·bytes of a matrix network's weights beyond its cores' L2 caches

one coefficient vector per mode (``fp32``, ``channel_pruning``, ``int8``, ``float16``),
fitted by non-negative least squares on relative error, so it extrapolates linearly to
larger networks. A channel-pruned network is its own mode: with its zeroed filters removed
it is a small network of odd widths, whose fixed costs weigh more than a dense network's;
one none of whose zeroed filters could be removed (each reaches a residual add or a cell's
sum) is the dense network, and fp32 (in the shipped `local` store, 28 of 140: leaving one
network out, fp32 and channel pruning within ±10 % 66 % with them apart, 70 % so). A
channel-pruned conv counts its density's share of the work where the store holds only the
dense shapes (onnxruntime runs the model with the zeroed filters removed); a weight-pruned
one all of it (onnxruntime multiplies the zeros); the other ops are the dense network's.
Matrix networks (transformers, MLPs) are fitted apart, mode by mode, and recurrent ones
apart again (:data:`MATRIX_PREFIX`, :data:`RECURRENT_PREFIX`); a channel-pruned matrix
network, with its neurons removed, runs as its grid form, 1×1 convs
(:data:`SPLIT_CHANNEL_PRUNING` where it has no fit of its own).

A mode fitted on at least :data:`MIN_CORRECTION_NETWORKS` networks may also learn a
correction: LightGBM trees on the log of the fit's error, from the terms and each term's
share of the fit's latency (:func:`correction_features`), learned from out-of-fold errors.
It is kept only where it is clearly better held out (:data:`CORRECTION_GAIN`): leaving one
network out, the shipped Zen 4's and Zen 5's corpora (112-140 CNNs, 42 matrix networks per
mode) gained 6-31 points within ±10 % on channel-pruned, int8 and matrix int8 runs with it,
and lost 1-9 on fp32 and float16 (24 on the Zen 4's matrix networks' float16).

The interval is the 10–90 % range of the leave-one-network-out relative errors of the fit
(with its correction, where kept), which :meth:`OrtLatencyModel.fit` also reports
(``meta["lono"]``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlas_predict.models.base import (FITTED_COVERAGE, CostModel, at_coverage,
                                      group_folds)
from dlas_predict.models.costmodel import VOLATILE_META, ModelError, same_meta

#: The terms of the model, in order.
TERMS = ("const", "dense_macs", "depthwise_macs", "conv_io_bytes", "weight_bytes",
         "other_bytes", "layers", "elementwise_ops", "exp_elems", "broadcast_bytes",
         "narrow_macs", "unaligned_convs", "joined_macs", "joined_io_bytes",
         "unblocked_macs", "unblocked_convs", "unblocked_io_bytes", "qdq_float_macs",
         "qdq_float_io_bytes", "qdq_float_weights", "padded_macs", "matrix_macs",
         "matrix_bytes", "other_macs", "qdq_avgpool_reads", "step_macs", "steps",
         "matrix_spill_bytes")
#: The terms that are per-operator costs (a constant, a count of ops, layers or convs),
#: not work: on another CPU they scale with its per-op overhead, not with its throughput
#: (:meth:`OrtLatencyModel.fixed_share`).
FIXED_TERMS = ("const", "layers", "unaligned_convs", "unblocked_convs", "elementwise_ops")
#: The modes fitted, each on its own rows (a mode with too few networks: the fp32 fit).
MODES = ("fp32", "channel_pruning", "int8", "float16")
#: A matrix network's runs (its fully connected layers onnxruntime's matrix products) are
#: fitted apart, mode by mode, under the mode's name with this prefix (too few networks:
#: the mode's fit of the others).
MATRIX_PREFIX = "matrix "
#: A recurrent network's runs are fitted apart again, under this prefix (too few networks:
#: the matrix networks' fit of the mode): onnxruntime runs each LSTM, GRU or RNN node as one
#: op looping over its steps, where the terms count every unrolled step's cell ops as
#: layers, each priced in a matrix network as an op of its own. Its step products are terms
#: of their own (``step_macs``, ``steps``): leaving one network out, they put the Zen 4's
#: recurrent fp32, float16 and int8 runs 48/38/62 → 58/62/69 % within ±10 %, the Zen 5's
#: 63/54/53 → 70/71/59 %.
RECURRENT_PREFIX = "recurrent "
#: A conv with fewer input or output channels than this is narrow.
NARROW = 16
FILE = "onnxruntime.json"  # the model saved in a device's model folder
#: onnxruntime pads a blocked (NCHWc) tensor's channels up to its block from a multiple of
#: this (its channel alignment).
NCHWC_ALIGNMENT = 4
#: Fewest networks a mode is fitted on (fewer: the fp32 fit scaled by the mode's median ratio).
MIN_NETWORKS = 5
#: Fewest networks a mode learns a correction from.
MIN_CORRECTION_NETWORKS = 20
#: The share within ±10 % (leaving one network out) by which a correction must beat the fit
#: alone to be kept.
CORRECTION_GAIN = 0.05
#: Small trees: a mode's correction learns from a few hundred runs.
_CORRECTION_PARAMS = dict(n_estimators=100, learning_rate=0.05, num_leaves=7,
                          min_child_samples=10, verbose=-1, n_jobs=2)
#: Folds (by network) of the out-of-fold errors a correction learns from.
_FOLDS = 5


def model_mode(config, removed: bool = True) -> str:
    """The model's mode of a compression or configuration label (``channel_pruning@0.9``):
    onnxruntime's run mode (:func:`~dlas_predict.measure.networks.plans.onnxruntime_mode`), with
    channel-pruned networks apart, unless none of their zeroed filters could be removed
    (``removed`` false): onnxruntime then runs the dense network, an fp32 one."""
    from dlas_predict.measure.networks.plans import onnxruntime_mode

    value = getattr(config, "value", str(config)).split("@")[0]
    if value == "channel_pruning":
        return "channel_pruning" if removed else "fp32"
    return onnxruntime_mode(value)


def nchwc_block(device) -> int:
    """onnxruntime's NCHWc block on ``device``: its vector width in floats, at least 8."""
    return max(8, (device.simd_bits or 256) // 32)


def blocked_layout(channels: int, filters: int, groups: int, block: int) -> bool:
    """Whether onnxruntime's NCHWc transformer takes a conv with ``channels`` input channels,
    ``filters`` output channels and ``groups`` groups (its output channels are padded to the
    block): one whose input channels are fewer than the block (it reads plain NCHW), or a
    multiple of :data:`NCHWC_ALIGNMENT`; a depthwise conv's channels such a multiple; a
    grouped conv's channels and filters per group. Checked against the optimized graphs of
    every network in the shipped corpus (onnxruntime 1.31, block 16), none off."""
    if groups == 1:
        return channels < block or channels % NCHWC_ALIGNMENT == 0
    if channels == groups == filters:
        return channels % NCHWC_ALIGNMENT == 0
    return (channels // groups) % NCHWC_ALIGNMENT == 0 and (filters // groups) % block == 0


def ort_terms(specs, ratios, summary, mode: str, channels_removed: bool,
              block: int = 16, matrix=None, steps=None, l2_bytes: int = 0) -> np.ndarray:
    """The model's terms for a network whose convs are ``specs`` with layer sparsities
    ``ratios`` and whose other ops are ``summary``'s (a
    :class:`~dlas_predict.networks.summary.NetworkSummary`). Weight pruning leaves the work
    dense (onnxruntime multiplies the zeros). A channel-pruned network is given as its
    removed layers and summary; with ``channels_removed`` it is given as the dense network's
    instead, each conv doing its density's share of the work (the zeroed filters removed).
    ``mode`` picks the element size of the weights, ``block`` is onnxruntime's NCHWc block
    (:func:`nchwc_block`); with ``channels_removed`` a conv's input channels are counted at
    its own density, which its producer's need not be. ``matrix`` flags the specs that are a
    matrix network's fully connected layers (:func:`~dlas_predict.networks.matrix.
    is_matrix_layer`): onnxruntime runs those as the matrix products they are, in plain
    rows, so their MACs and bytes (activations and weights) are terms of their own.
    ``l2_bytes``: the L2 of the machine's cores; a matrix network's weights beyond it
    stream from a farther level at every run (``matrix_spill_bytes``: on a Xeon, an MLP's
    runs took 10 µs per MB of weights at 1.8 MB, 19 µs at 16-40 MB; leaving one network out,
    the term put its MLPs' fp32 runs from a mean log error of 0.30 to 0.14). A mode keeps
    it only where it lowers the mode's MAPE leaving one network out.
    ``steps`` flags the specs that are a recurrent layer's products of one step
    (:func:`~dlas_predict.networks.recurrent.is_step_product`): onnxruntime's LSTM, GRU or
    RNN op runs the inputs' products of every step as one matrix product but the recurrent
    products one step after another, each a matrix-vector product at batch 1, so their
    MACs and their count are terms of their own, apart from the matrix products'."""
    elem = {"float16": 2, "int8": 1}.get(mode, 4)
    dense = dw = io = wbytes = narrow = unaligned = unblocked = unblocked_n = 0.0
    unblocked_io = padded = matrix_macs = matrix_bytes = step_macs = n_steps = 0.0
    matrix_weights = 0.0
    for s, r, fc, step in zip(specs, ratios, matrix or [False] * len(specs),
                              steps or [False] * len(specs)):
        keep = (1.0 - float(r)) if channels_removed else 1.0
        if step:
            step_macs += s.macs * keep
            n_steps += 1.0
            continue
        if fc:
            matrix_macs += s.macs * keep
            matrix_bytes += 4 * (s.C * s.H * s.W + keep * s.K * s.OH * s.OW) \
                + elem * keep * s.K * s.C
            matrix_weights += elem * keep * s.K * s.C
            continue
        k = max(1, round(s.K * keep))
        c = max(1, round(s.C * keep)) if channels_removed else s.C
        if s.depthwise:
            dw += s.macs * keep
        else:
            dense += s.macs * keep
            narrow += s.macs * keep if min(s.C // s.groups, k) < NARROW else 0.0
            unaligned += float(k % 8 != 0)
        if not blocked_layout(c, k, s.groups, block):
            unblocked += s.macs * keep
            unblocked_n += 1.0
            unblocked_io += 4 * (c * s.H * s.W + k * s.OH * s.OW)
        else:  # the work of the channels padded up to the block
            kp = -(-k // block) * block
            cp = c if (s.groups == 1 and c < block) or s.depthwise else -(-c // block) * block
            padded += s.macs * keep * (kp * cp / (k * c) - 1.0)
        io += 4 * (s.C * s.H * s.W + keep * s.K * s.OH * s.OW)
        wbytes += elem * keep * s.K * (s.C // s.groups) * s.R * s.S
    joined = [summary.joined_conv_macs / 1e9, summary.joined_conv_io_bytes / 1e6]
    qdq = [summary.qdq_float_conv_macs / 1e9, summary.qdq_float_conv_io_bytes / 1e6,
           summary.qdq_float_conv_params / 1e6]
    if mode == "int8":
        joined = [0.0, 0.0]
    else:
        qdq = [0.0, 0.0, 0.0]
    return np.array([1.0, dense / 1e9, dw / 1e9, io / 1e6, wbytes / 1e6,
                     summary.nonconv_bytes / 1e6, float(summary.layers),
                     float(summary.elementwise_ops), summary.exp_elems / 1e6,
                     summary.broadcast_bytes / 1e6, narrow / 1e9, unaligned, *joined,
                     unblocked / 1e9, unblocked_n, unblocked_io / 1e6, *qdq, padded / 1e9,
                     matrix_macs / 1e9, matrix_bytes / 1e6, summary.nonconv_macs / 1e9,
                     summary.avgpool_window_elems / 1e6 if mode == "int8" else 0.0,
                     step_macs / 1e9, n_steps,
                     max(matrix_weights - l2_bytes, 0.0) / 1e6 if l2_bytes else 0.0])


def fitted_modes(T: np.ndarray, modes: list[str], recurrent=(), matrix=()) -> list[str]:
    """Each row's fitted mode: a recurrent network's prefixed by :data:`RECURRENT_PREFIX`,
    another matrix network's (matrix MACs in its terms, or flagged in ``matrix``: a
    channel-pruned one's terms are its grid form's, 1×1 convs) by :data:`MATRIX_PREFIX`."""
    col = TERMS.index("matrix_macs")
    recurrent = list(recurrent) or [False] * len(modes)
    matrix = list(matrix) or [False] * len(modes)
    return [RECURRENT_PREFIX + m if r
            else MATRIX_PREFIX + m if x or (len(t) > col and t[col] > 0) else m
            for t, m, r, x in zip(np.atleast_2d(T), modes, recurrent, matrix)]


#: A channel-pruned matrix network runs its grid form: 1×1 convs between the matrix
#: network's other ops (attention's products, softmax, normalisation). A model without a
#: fit of such runs prices its convs by the channel-pruned CNNs' fit and its other ops
#: (:data:`OTHER_OPS_TERMS`) by the matrix networks' fp32 fit, under this name: the CNNs'
#: fit alone, which never saw attention, put transformers 4-60× too slow (on a Xeon's 21
#: such runs, leaving them out of both fits: 29 % within ±10 %, mean log error 0.14, against
#: 0 % and 4.2 by the CNNs' fit alone; an MLP's 2.1× too slow either way).
SPLIT_CHANNEL_PRUNING = "channel_pruning convs, matrix fp32 other ops"
#: The fits :data:`SPLIT_CHANNEL_PRUNING` joins: its convs' and its other ops'.
SPLIT_PARTS = ("channel_pruning", MATRIX_PREFIX + "fp32")
#: The terms of a network's ops other than its convs and matrix products.
OTHER_OPS_TERMS = ("other_bytes", "layers", "elementwise_ops", "exp_elems",
                   "broadcast_bytes", "other_macs")


def _fallbacks(mode: str) -> tuple[str, ...]:
    """The fits that may price a row of ``mode``, in order (the first fitted one does): its
    own, the matrix networks' of its mode, the mode's, fp32's; a channel-pruned matrix
    network's second: :data:`SPLIT_CHANNEL_PRUNING`."""
    base = mode.removeprefix(RECURRENT_PREFIX).removeprefix(MATRIX_PREFIX)
    split = (SPLIT_CHANNEL_PRUNING,) if mode == MATRIX_PREFIX + "channel_pruning" else ()
    return tuple(dict.fromkeys((mode, *split, MATRIX_PREFIX + base if mode != base else base,
                                base, "fp32")))


@dataclass(frozen=True)
class OrtInputs:
    """What the onnxruntime model reads per run: its :func:`ort_terms` row, its mode
    (:data:`MODES`) and whether it is a recurrent network's (empty: none is; its layers
    :func:`~dlas_predict.networks.recurrent.is_step_product`)."""

    terms: np.ndarray
    modes: list[str]
    recurrent: tuple[bool, ...] = ()
    #: whether each row is a matrix network's (empty: none is flagged; a row with matrix
    #: MACs in its terms is one anyway)
    matrix: tuple[bool, ...] = ()


@dataclass
class OrtLatencyModel(CostModel):
    """Per mode: the coefficients of :data:`TERMS` (seconds per unit) and the interval.
    ``about``: what the caller records with the saved model."""

    name: str = "onnxruntime"
    about: dict = field(default_factory=dict)
    coef_: dict[str, list[float]] = field(default_factory=dict, init=False)
    q10_: dict[str, float] = field(default_factory=dict, init=False)  # log(pred / measured)
    q90_: dict[str, float] = field(default_factory=dict, init=False)
    meta_: dict = field(default_factory=dict, init=False)
    #: mode -> its correction's trees (a mode without one is not a key)
    correction_: dict = field(default_factory=dict, init=False)

    @staticmethod
    def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
        from scipy.optimize import nnls

        w = 1.0 / y  # relative error
        return nnls(X * w[:, None], np.ones(len(y)))[0]

    @classmethod
    def _errors(cls, X: np.ndarray, y: np.ndarray, held: np.ndarray) -> np.ndarray:
        """log(predicted / measured) of every row, each by the fit without its group
        (``held``: each row's group, a network or a fold of networks)."""
        err = np.empty(len(y))
        for g in set(held):
            out = held == g
            c = cls._nnls(X[~out], y[~out])
            err[out] = np.log(np.maximum(X[out] @ c, 1e-9) / y[out])
        return err

    @classmethod
    def _correction(cls, X: np.ndarray, y: np.ndarray, nets: np.ndarray, coef: np.ndarray,
                    seed: int = 0):
        """Trees that learn the fit's log error from :func:`correction_features`, on the
        out-of-fold errors of ``X``'s networks (``coef``: the fit on all of them)."""
        import lightgbm as lgb

        err = cls._errors(X, y, group_folds(nets, _FOLDS, seed))
        return lgb.LGBMRegressor(random_state=seed, **_CORRECTION_PARAMS).fit(
            correction_features(X, coef), err).booster_

    def fit(self, X: OrtInputs, y: np.ndarray, groups: list[str]) -> "OrtLatencyModel":
        """Fit each mode on its rows; its interval and metrics from leaving one network
        (``groups``: each row's) out."""
        T, y = np.asarray(X.terms, float), np.asarray(y, float)
        modes_a = np.array(fitted_modes(T, X.modes, X.recurrent, X.matrix))
        nets = np.array(groups)
        if len(set(groups)) < MIN_NETWORKS:
            raise ModelError(f"the onnxruntime model needs measurements of at least "
                             f"{MIN_NETWORKS} networks, the store has {len(set(groups))}")
        self.coef_, self.q10_, self.q90_, self.correction_ = {}, {}, {}, {}
        self.meta_ = dict(self.about, terms=list(TERMS), n_train=int(len(y)),
                          networks=sorted(set(groups)), lono={}, spill=[])
        spill = TERMS.index("matrix_spill_bytes")
        for mode in (*MODES, *(p + m for p in (MATRIX_PREFIX, RECURRENT_PREFIX)
                                for m in MODES)):
            rows = modes_a == mode
            if len(set(nets[rows])) < MIN_NETWORKS:
                continue
            Xm, ym, nm = T[rows], y[rows], nets[rows]
            err = self._errors(Xm, ym, nm)
            figures = _figures(err)
            if Xm[:, spill].any():  # the spill term where it is better held out
                alone = Xm.copy()
                alone[:, spill] = 0.0
                err_alone = self._errors(alone, ym, nm)
                figures_alone = _figures(err_alone)
                if figures_alone["mape"] <= figures["mape"]:
                    Xm, err, figures = alone, err_alone, figures_alone
                else:
                    self.meta_["spill"].append(mode)
            coef = self._nnls(Xm, ym)
            self.coef_[mode] = [float(c) for c in coef]
            if len(set(nm)) >= MIN_CORRECTION_NETWORKS:
                corrected = self._corrected_errors(Xm, ym, nm, err)
                if _figures(corrected)["within_10pct"] >= \
                        figures["within_10pct"] + CORRECTION_GAIN:
                    self.correction_[mode] = self._correction(Xm, ym, nm, coef)
                    figures = {**_figures(corrected), "corrected": True,
                               "uncorrected_within_10pct": figures["within_10pct"]}
                    err = corrected
            self.q10_[mode], self.q90_[mode] = (float(v) for v in np.quantile(err, [0.1, 0.9]))
            self.meta_["lono"][mode] = {"rows": int(len(ym)), "networks": int(len(set(nm))),
                                        **figures}
        if "fp32" not in self.coef_:
            raise ModelError("the onnxruntime model needs fp32 measurements of at least "
                             f"{MIN_NETWORKS} networks")
        self.meta_["corrected"] = sorted(self.correction_)
        return self

    def _corrected_errors(self, X: np.ndarray, y: np.ndarray, nets: np.ndarray,
                          err: np.ndarray) -> np.ndarray:
        """The log errors ``err`` of the fit leaving each network out, each corrected by
        trees learned without that network."""
        out = np.empty(len(y))
        for net in set(nets):
            held = nets == net
            coef = self._nnls(X[~held], y[~held])
            trees = self._correction(X[~held], y[~held], nets[~held], coef)
            out[held] = err[held] - trees.predict(correction_features(X[held], coef))
        return out

    def predict_all(self, X: OrtInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mid, low, high) seconds of each row, the 80 % interval. A mode fitted on too
        few networks is priced with the fp32 fit (and the fp32 interval)."""
        if not self.coef_:
            raise ModelError("the onnxruntime model is not trained")
        T = np.atleast_2d(np.asarray(X.terms, float))
        by = np.array([self.priced_by(m)
                       for m in fitted_modes(T, X.modes, X.recurrent, X.matrix)])
        mid, low, high = (np.empty(len(T)) for _ in range(3))
        for mm in set(by):
            rows, coef = by == mm, self.coef_of(mm)
            Tr = self._counted(mm, T[rows])
            t = np.maximum(Tr @ coef, 1e-9)
            if mm in self.correction_:  # the trees learned log(fit / measured)
                t = t * np.exp(-self.correction_[mm].predict(correction_features(Tr, coef)))
            # q = log(pred / measured): the measured value lies in pred·exp(-q)
            q10, q90 = self._interval_of(mm)
            mid[rows], low[rows], high[rows] = t, t * np.exp(-q90), t * np.exp(-q10)
        return mid, low, high

    def _counted(self, fit: str, T: np.ndarray) -> np.ndarray:
        """Rows of terms as ``fit`` was fitted on them: without the spill term unless the
        fit kept it."""
        if fit in self.meta_.get("spill", []):
            return T
        T = np.array(T, float)
        T[:, TERMS.index("matrix_spill_bytes")] = 0.0
        return T

    def coef_of(self, fit: str) -> np.ndarray:
        """The coefficients of a :meth:`priced_by` value: a fit's, or
        :data:`SPLIT_CHANNEL_PRUNING`'s, each term from the fit it names."""
        if fit != SPLIT_CHANNEL_PRUNING:
            return np.asarray(self.coef_[fit], float)
        convs, other = (np.asarray(self.coef_[m], float) for m in SPLIT_PARTS)
        return np.where(np.isin(TERMS, OTHER_OPS_TERMS), other, convs)

    def _interval_of(self, fit: str) -> tuple[float, float]:
        """(q10, q90) of a :meth:`priced_by` value; the wider of both fits' for
        :data:`SPLIT_CHANNEL_PRUNING`."""
        if fit != SPLIT_CHANNEL_PRUNING:
            return self.q10_[fit], self.q90_[fit]
        return min(self.q10_[m] for m in SPLIT_PARTS), max(self.q90_[m] for m in SPLIT_PARTS)

    @property
    def l2_bytes(self) -> int:
        """The L2 of the cores of the machine the model was fitted on, which its
        ``matrix_spill_bytes`` term is counted against (:func:`l2_capacity`; 0: unknown)."""
        return int(self.meta_.get("l2_bytes") or 0)

    def priced_by(self, mode: str) -> str:
        """The fit that prices rows of ``mode`` (a :func:`fitted_modes` value): its own where
        fitted, else its fallback's."""
        return next(m for m in _fallbacks(mode) if m in self.coef_ or (
            m == SPLIT_CHANNEL_PRUNING and all(p in self.coef_ for p in SPLIT_PARTS)))

    def predict(self, X: OrtInputs) -> np.ndarray:
        return self.predict_all(X)[0]

    def fixed_share(self, X: OrtInputs) -> np.ndarray:
        """Each row's share of its fit's latency in :data:`FIXED_TERMS` (a correction
        scales the whole row, not the share)."""
        T = np.atleast_2d(np.asarray(X.terms, float))
        by = [self.priced_by(m) for m in fitted_modes(T, X.modes, X.recurrent, X.matrix)]
        idx = [TERMS.index(t) for t in FIXED_TERMS]
        out = np.empty(len(T))
        for i, mm in enumerate(by):
            coef, row = self.coef_of(mm), self._counted(mm, T[i:i + 1])[0]
            out[i] = float(row[idx] @ coef[idx]) / max(float(row @ coef), 1e-12)
        return np.clip(out, 0.0, 1.0)

    def predict_interval(self, X: OrtInputs, q: float = FITTED_COVERAGE
                         ) -> tuple[np.ndarray, np.ndarray]:
        mid, low, high = self.predict_all(X)
        return at_coverage(mid, np.minimum(low, mid), np.maximum(high, mid), q)

    def save(self, directory: Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.name}.json"
        from dlas_predict.files import write_if_changed
        from dlas_predict.models.trees import MODEL_SUFFIX, save_trees

        text = json.dumps({"coef": self.coef_, "q10": self.q10_, "q90": self.q90_,
                           "meta": self.meta_}, indent=1, sort_keys=True)

        def steady(d: dict) -> dict:
            meta = {k: v for k, v in d.get("meta", {}).items() if k not in VOLATILE_META}
            return {**d, "meta": meta}

        try:
            unchanged = same_meta(steady(json.loads(path.read_text())), steady(json.loads(text)))
        except (OSError, ValueError, AttributeError):
            unchanged = False
        if not unchanged:
            write_if_changed(path, text.encode())
        kept = {directory / f"{self.name}.correction.{_slug(m)}{MODEL_SUFFIX}": t
                for m, t in self.correction_.items()}
        for stale in directory.glob(f"{self.name}.correction.*"):
            if stale not in kept:  # an earlier fit's: never read with this one
                stale.unlink()
        for file, trees in kept.items():
            save_trees(trees, file)
        return path

    @classmethod
    def load(cls, directory: Path, name: str | None = None) -> "OrtLatencyModel":
        name = name or cls.name
        path = Path(directory) / f"{name}.json"
        if not path.is_file():
            raise ModelError(f"no onnxruntime model in {directory}")
        try:
            d = json.loads(path.read_text())
            model = cls(name=name)
            model.coef_, model.q10_, model.q90_ = d["coef"], d["q10"], d["q90"]
            model.meta_ = d.get("meta", {})
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"{path} is not an onnxruntime model ({exc})") from None
        if model.meta_.get("terms", list(TERMS)) != list(TERMS):
            raise ModelError(f"{path} was fitted on other terms than this version's: fit it "
                             "again (`dlas-predict train --store S --only onnxruntime`)")
        from dlas_predict.models.costmodel import load_trees
        from dlas_predict.models.trees import model_file

        for mode in model.meta_.get("corrected", []):
            file = model_file(directory, f"{name}.correction.{_slug(mode)}")
            if mode not in model.coef_ or not file.is_file():
                raise ModelError(f"{path} names a correction of {mode}, but {file} is "
                                 "missing: fit it again (`dlas-predict train --store S "
                                 "--only onnxruntime`)")
            model.correction_[mode] = load_trees(file, 2 * len(TERMS), "; fit it again")
        return model


def l2_capacity(fingerprint: str | None, device) -> int:
    """Bytes the L2 caches of ``device``'s cores hold in all (onnxruntime runs a thread on
    each), their size that of the machine with ``fingerprint`` (its shipped or measured
    roofs) where known, else ``device``'s; 0 where unknown."""
    from dlas_predict.space.devices import cache_capacities, measured_peaks

    caches = ((measured_peaks(fingerprint) if fingerprint else None) or {}).get("caches")
    return int(cache_capacities(caches or device.caches or {}, device.cores or 1).get("L2", 0))


def correction_features(T: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """What a mode's correction reads of each row of terms ``T``: each term (log), and its
    share of the fit's (``coef``) latency."""
    T = np.atleast_2d(np.asarray(T, float))
    part = T * np.asarray(coef)
    return np.c_[np.log1p(T * 1e3), part / np.maximum(part.sum(axis=1), 1e-12)[:, None]]


def _figures(err: np.ndarray) -> dict:
    """MAPE and the shares within ±10 % and ±25 % of log errors ``err``."""
    rel = np.abs(np.exp(err) - 1)
    return {"mape": float(np.mean(rel)), "within_10pct": float(np.mean(rel <= 0.10)),
            "within_25pct": float(np.mean(rel <= 0.25))}


def _slug(mode: str) -> str:
    """A mode's name in a file name (``matrix int8``: ``matrix_int8``)."""
    return mode.replace(" ", "_")


def nothing_removed(details: dict | None) -> bool:
    """Whether a channel-pruned model's record says that none of its zeroed filters could be
    removed (onnxruntime then ran the dense shapes, multiplying the zeros)."""
    from dlas_predict.compression.compress import removed_channels

    for line in (details or {}).get("prepared") or []:
        removed = removed_channels(line)
        if removed is not None:
            return removed == 0
    return False


def knows_qdq_floats(network: str, summary_text: str | None) -> bool:
    """Whether a record's network says which convs onnxruntime's QDQ int8 leaves in float:
    its stored summary has the fields, or the network is built again by name."""
    from dlas_predict.models.evaluation import INT8_ONLY, named_summary

    return INT8_ONLY <= set(json.loads(summary_text or "{}")) or \
        named_summary(network) is not None


def training_rows(store: Path, device: str, block: int | None = None, l2_bytes: int = 0):
    """(inputs, seconds, networks) of the verified onnxruntime records of ``device`` in
    ``store`` (fp32 only when its output check passed; reduced precision by its time);
    ``block``: the NCHWc block of the machine that ran them (default: the registry's
    ``device``); ``l2_bytes``: its cores' L2 (:func:`l2_capacity`; 0: no spill term)."""
    from dlas_predict.measure.networks.plans import ONNXRUNTIME
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.models.evaluation import stored_summary, channels_removed
    from dlas_predict.networks.matrix import is_matrix_layer
    from dlas_predict.networks.recurrent import is_step_product
    from dlas_predict.space.config import ConvSpec
    from dlas_predict.space.devices import get_device

    block = block or nchwc_block(get_device(device, with_target=False))
    with CorpusStore(store, must_exist=True) as db:
        recs = db.network_records("error IS NULL AND device = ? AND algorithm = ?",
                                  (device, ONNXRUNTIME))
        configs = db.network_configs()
    layers: dict[tuple, list] = {}
    for c in configs:
        layers.setdefault((c["network"], c["config"]), []).append(c)
    dense_summary = {r.network: r.summary for r in recs if r.config == "dense"}
    X, y, modes, nets, recurrent, matrices = [], [], [], [], [], []
    for r in recs:
        mode = model_mode(r.config)
        if r.verified is False and mode in ("fp32", "channel_pruning"):
            continue
        ls = sorted(layers.get((r.network, r.config), []), key=lambda c: c["layer_index"])
        # channel pruning: the removed network's own layers where the store holds them,
        # else the dense shapes, each conv doing its density's share, unless onnxruntime's
        # model had none of its zeroed filters removed (they all reach a residual add...):
        # then it ran the dense network, an fp32 row
        pruned = mode == "channel_pruning"
        kept_all = pruned and nothing_removed(r.details)
        shares = pruned and not channels_removed(ls, layers.get((r.network, "dense"))) and \
            not kept_all
        mode = model_mode(r.config, removed=not kept_all)
        text = (dense_summary.get(r.network) if shares or not pruned else None) or r.summary
        summary = stored_summary(r.network, text)
        if not ls or summary is None or r.best_s is None:
            continue
        if mode == "int8" and not knows_qdq_floats(r.network, text):
            continue  # which of its convs ran in float is not known
        # a matrix network with its channels removed ran as its grid form: 1×1 convs
        grid = mode == "channel_pruning"
        X.append(ort_terms([ConvSpec.parse(c["conv"]) for c in ls],
                           [float(c["ratio"]) for c in ls], summary, mode, shares, block,
                           None if grid else [is_matrix_layer(c["layer_name"]) for c in ls],
                           None if grid else [is_step_product(c["layer_name"]) for c in ls],
                           l2_bytes))
        y.append(r.best_s)
        modes.append(mode)
        nets.append(r.network)
        recurrent.append(any(is_step_product(c["layer_name"]) for c in ls))
        matrices.append(any(is_matrix_layer(c["layer_name"]) for c in ls))
    return OrtInputs(np.array(X), modes, tuple(recurrent), tuple(matrices)), np.array(y), nets
