"""LightGBM text models evaluated with numpy, so predicting never imports LightGBM.

Importing LightGBM pulls in scikit-learn, SciPy and pandas (about 2 s on the project's
machine), which is most of what `recommend` spent before it predicted anything. A saved
model is plain text (LightGBM's own ``save_model`` format); :class:`TreeModel` reads its
trees into arrays and walks every tree for every row level by level. It handles numerical
splits with LightGBM's three missing-value rules; a model with categorical splits is
refused (our features are numbers), and the caller falls back to LightGBM.

Equality with LightGBM's own ``predict`` is tested on the shipped models.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlas_predict.errors import DlasError

_ZERO = 1e-35  # LightGBM's kZeroThreshold
#: Rows from which a process that already imported LightGBM lets it predict.
_BIG = 2000
#: Predicted rows a model remembers (by their bytes) before it forgets them all.
_MEMO_ROWS = 200_000


#: Parsed models by (path, modification time, size).
_LOADED: dict[tuple, "TreeModel"] = {}


class TreeFormatError(DlasError):
    """A model file this reader does not handle (categorical splits, unknown format)."""


# ---- files ------------------------------------------------------------------------------
#: A saved tree model: LightGBM's text format, xz-compressed (about a quarter of the text).
MODEL_SUFFIX = ".txt.xz"


def model_file(directory: Path, stem: str) -> Path:
    """The file of the tree model ``stem`` in ``directory``: ``STEM.txt.xz``, or a plain
    ``STEM.txt`` (LightGBM's own file) where only that exists."""
    packed = Path(directory) / f"{stem}{MODEL_SUFFIX}"
    plain = Path(directory) / f"{stem}.txt"
    return plain if plain.is_file() and not packed.is_file() else packed


def read_model_text(path: Path, data: bytes | None = None) -> str:
    """The LightGBM text of the model file ``path`` (xz-compressed or plain); ``data``:
    its bytes, where they were read already."""
    import lzma

    if data is None:
        data = Path(path).read_bytes()
    if str(path).endswith(".xz"):
        try:
            data = lzma.decompress(data)
        except lzma.LZMAError as exc:
            raise TreeFormatError(f"cannot read {path}: {exc}") from None
    return data.decode()


#: The lines of LightGBM's text that prediction does not read (each tree's split gains,
#: internal values, weights and counts, and the header's tree sizes, which would no longer
#: match): dropped on saving, about half the text. LightGBM and :class:`TreeModel` predict
#: the same from what is left, to the bit.
_UNREAD = ("split_gain", "internal_value", "internal_weight", "internal_count",
           "leaf_weight", "leaf_count", "tree_sizes")


def compact_text(text: str) -> str:
    """A model's LightGBM text without the lines prediction does not read (:data:`_UNREAD`)."""
    return "\n".join(line for line in text.split("\n")
                     if line.split("=", 1)[0] not in _UNREAD)


def write_model_text(path: Path, text: str) -> bool:
    """Save a model's LightGBM text in ``path`` (xz-compressed where it ends in ``.xz``),
    atomically, without the lines prediction does not read (:func:`compact_text`). A file
    that already holds this text is left as it is (a retrain that changes nothing rewrites
    nothing), and so is its modification time; the compression is deterministic, so an
    equal text is an equal file. Returns whether it wrote.

    xz's fast preset: on a layer model of 4.2 MB (compacted) it compresses in 0.2 s to
    1.30 MB, where the default preset takes 1.6 s for 1.10 MB (much of a `train` or a
    `calibrate`). A file compressed harder that holds the same text (the shipped models)
    stays as it is."""
    import lzma

    path, text = Path(path), compact_text(text)
    try:
        if read_model_text(path) == text:
            return False
    except (OSError, UnicodeDecodeError, TreeFormatError):
        pass
    from dlas_predict.files import write_if_changed

    data = text.encode()
    if str(path).endswith(".xz"):
        data = lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=1)
    write_if_changed(path, data)
    plain = path.with_name(path.name[:-len(".xz")]) if str(path).endswith(".xz") else None
    if plain is not None and plain.is_file():  # the uncompressed copy it replaces
        plain.unlink()
    return True


def save_trees(model, path: Path) -> bool:
    """Save a LightGBM booster or a :class:`TreeModel` (its text) in ``path``
    (:func:`write_model_text`)."""
    text = model.text if isinstance(model, TreeModel) else model.model_to_string()
    return write_model_text(path, text)


@dataclass
class TreeModel:
    """Every tree of one LightGBM regression model, padded into arrays."""

    n_features: int
    feature: np.ndarray      # trees × internal nodes (int32)
    threshold: np.ndarray    # trees × internal nodes (float64)
    left: np.ndarray         # trees × internal nodes: child; ~leaf for a leaf
    right: np.ndarray
    default_left: np.ndarray  # bool
    missing: np.ndarray      # 0 none, 1 zero, 2 NaN
    leaf: np.ndarray         # trees × leaves (float64)
    _text: str | None = field(default=None, repr=False, compare=False)
    #: (file, hash of its bytes) the text is read from when first needed (a model loaded
    #: from its cached arrays)
    _source: tuple[Path, str] | None = field(default=None, repr=False, compare=False)
    _booster: object = field(default=None, repr=False, compare=False)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def text(self) -> str:
        """The model's LightGBM text (read from its file on first use)."""
        if self._text is None and self._source is not None:
            import hashlib

            path, digest = self._source
            data = Path(path).read_bytes()
            if hashlib.sha1(data).hexdigest()[:20] != digest:
                raise TreeFormatError(f"{path} changed since it was loaded")
            self._text = read_model_text(path, data)
        return self._text or ""

    @classmethod
    def load(cls, path: Path) -> "TreeModel":
        """The model in ``path``; parsed once per process while the file is unchanged (a
        batch of recommend or predict calls reads the same files)."""
        try:
            st = Path(path).stat()
            key = (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)
            if key in _LOADED:
                return _LOADED[key]
            data = Path(path).read_bytes()
        except OSError as exc:
            raise TreeFormatError(f"cannot read {path}: {exc}") from None
        model = _LOADED[key] = cls._cached(data, Path(path))
        return model

    @classmethod
    def _cached(cls, data: bytes, path: Path) -> "TreeModel":
        """The model of the file ``path`` holding ``data``, kept as arrays under DLAS_HOME
        by the file's hash: loading them is about 20× faster than parsing a 2.5 MB model
        again, and the file is not even decompressed until its text is needed."""
        import hashlib

        from dlas_predict.paths import cache_dir

        digest = hashlib.sha1(data).hexdigest()[:20]
        try:
            cached = cache_dir("trees") / f"{digest}.npz"
        except OSError:
            cached = None
        names = ("feature", "threshold", "left", "right", "default_left", "missing", "leaf")
        if cached is not None:
            try:
                with np.load(cached) as z:
                    return cls(int(z["n_features"]), *(z[n] for n in names),
                               _source=(path, digest))
            except (OSError, ValueError, KeyError, EOFError):
                pass  # no cached copy yet, or a damaged one: parse and write it again
        try:
            text = read_model_text(path, data)
        except UnicodeDecodeError as exc:
            raise TreeFormatError(f"cannot read {path}: {exc}") from None
        model = cls.parse(text, str(path))
        if cached is None:
            return model
        tmp = cached.with_name(f"{cached.stem}.{os.getpid()}.tmp.npz")
        try:
            np.savez(tmp, n_features=model.n_features,
                     **{n: getattr(model, n) for n in names})
            os.replace(tmp, cached)
        except OSError:
            tmp.unlink(missing_ok=True)
        return model

    @classmethod
    def parse(cls, text: str, where: str = "model") -> "TreeModel":
        head, _, body = text.partition("\nTree=")
        if not body or "max_feature_idx=" not in head:
            raise TreeFormatError(f"{where}: not a LightGBM text model")
        kv = dict(line.split("=", 1) for line in head.splitlines() if "=" in line)
        if kv.get("num_class", "1") != "1" or kv.get("num_tree_per_iteration", "1") != "1":
            raise TreeFormatError(f"{where}: only single-output regression models")
        if not kv.get("objective", "").split(" ")[0] in ("regression", "quantile"):
            raise TreeFormatError(f"{where}: objective {kv.get('objective')!r}")
        n_features = int(kv["max_feature_idx"]) + 1
        trees = []
        for block in ("Tree=" + body).split("\nTree="):
            block = block.split("end of trees", 1)[0]
            fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            if "leaf_value" not in fields:
                continue
            trees.append(fields)
        if not trees:
            raise TreeFormatError(f"{where}: no tree")
        n_int = max(int(t["num_leaves"]) - 1 for t in trees) or 1
        n_leaf = max(int(t["num_leaves"]) for t in trees)
        T = len(trees)
        feat = np.zeros((T, n_int), np.int32)
        thr = np.zeros((T, n_int))
        left = np.full((T, n_int), -1, np.int32)
        right = np.full((T, n_int), -1, np.int32)
        dleft = np.zeros((T, n_int), bool)
        miss = np.zeros((T, n_int), np.int8)
        leaf = np.zeros((T, n_leaf))
        for i, t in enumerate(trees):
            lv = np.array(t["leaf_value"].split(), float)
            leaf[i, :len(lv)] = lv
            if int(t["num_leaves"]) == 1:
                continue  # a single leaf: the root is leaf 0 (left stays ~0 = -1)
            dt = np.array(t["decision_type"].split(), np.int32)
            if (dt & 1).any():
                raise TreeFormatError(f"{where}: categorical splits")
            n = len(dt)
            feat[i, :n] = np.array(t["split_feature"].split(), np.int32)
            thr[i, :n] = np.array(t["threshold"].split(), float)
            left[i, :n] = np.array(t["left_child"].split(), np.int32)
            right[i, :n] = np.array(t["right_child"].split(), np.int32)
            dleft[i, :n] = (dt & 2) > 0
            miss[i, :n] = (dt >> 2) & 3
        single = np.array([int(t["num_leaves"]) == 1 for t in trees])
        # a single-leaf tree: route the root to leaf 0 whatever the row
        left[single, 0] = right[single, 0] = -1
        return cls(n_features, feat, thr, left, right, dleft, miss, leaf, _text=text)

    def num_feature(self) -> int:
        return self.n_features

    def save_model(self, path: str) -> None:
        write_model_text(Path(path), self.text)

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise DlasError(f"expected {self.n_features} features, got {X.shape}")
        if len(X) > _BIG and "lightgbm" in sys.modules and self.text:
            # a big batch in a process that has LightGBM loaded anyway: its C++ walk is
            # faster, and gives the same numbers (tested)
            if self._booster is None:
                import lightgbm as lgb
                self._booster = lgb.Booster(model_str=self.text)
            return self._booster.predict(X)
        uniq, inverse = np.unique(X, axis=0, return_inverse=True)
        # rows seen before (another network of a batch shares most layers) are not walked
        keys = [r.tobytes() for r in uniq]
        memo = self._memo
        new = [i for i, k in enumerate(keys) if k not in memo]
        if new:
            if len(memo) + len(new) > _MEMO_ROWS:
                memo.clear()
            for i, v in zip(new, self._predict(uniq[new])):
                memo[keys[i]] = float(v)
        out = np.array([memo[k] for k in keys])
        return out[inverse.reshape(-1)]

    def _predict(self, X: np.ndarray) -> np.ndarray:
        T, N = len(self.leaf), len(X)
        width = self.feature.shape[1]
        feat, thr = self.feature.ravel().astype(np.int32), self.threshold.ravel()
        # children interleaved: [left, right] of node i at 2i, 2i + 1 (one gather a level)
        kids = np.stack([self.left.ravel(), self.right.ravel()], axis=1).ravel()
        leaf = self.leaf.ravel()
        special = bool((self.missing != 0).any() or np.isnan(X).any())
        Xf = X.ravel()
        nf = X.shape[1]
        n_leaf = self.leaf.shape[1]
        tree = np.repeat(np.arange(T, dtype=np.int32), N)
        r = np.tile(np.arange(N, dtype=np.int32), T)
        node = tree * np.int32(width)                 # flat index of the current node
        rows = r * np.int32(nf)                       # each entry's row offset in Xf
        values = np.empty((T, N))
        while len(r):
            x = Xf[rows + feat[node]]
            th = thr[node]
            if special:
                m = self.missing.ravel()[node]
                nan = np.isnan(x)
                go_left = np.where(nan, 0.0, x) <= th
                dflt = self.default_left.ravel()[node]
                side = ((m == 1) & (nan | (np.abs(x) <= _ZERO))) | ((m == 2) & nan)
                go_left = np.where(side, dflt, go_left)
            else:
                go_left = x <= th
            child = kids[2 * node + (~go_left)]
            done = child < 0
            if done.any():
                values[tree[done], r[done]] = leaf[tree[done] * n_leaf + ~child[done]]
                keep = ~done
                r, rows, tree, child = r[keep], rows[keep], tree[keep], child[keep]
            node = tree * np.int32(width) + child
        total = np.zeros(N)
        for v in values:  # tree by tree, in order: LightGBM's own sum, to the last bit
            total += v
        return total
