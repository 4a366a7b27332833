"""Public measurements of other projects, fetched from upstream as TVM fetches TopHub.

HELP's NAS-Bench-201 latencies (21 devices) and TopHub's tuned conv kernels are never
shipped. ``dlas-predict data fetch`` downloads their files from the upstream repositories
at pinned commits, checks each one's size and sha256 (a file that fails is removed), and
converts them into ``DLAS_HOME/data``: ``help_nb201/latency.csv.gz`` (device, arch_index,
arch_str, latency in ms) and ``tophub/*.jsonl`` (AutoTVM's log lines). Readers look for a
folder in ``DLAS_SHARED_DATA`` (or the public data folder beside a checkout) first, then
here (:func:`data_folder`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dlas_predict.errors import DlasError, param


@dataclass(frozen=True)
class Upstream:
    """One public source: its repository at a pinned commit, and its files."""

    name: str
    repository: str
    commit: str
    files: tuple[tuple[str, int, str], ...]  # (path, bytes, sha256)

    @property
    def base_url(self) -> str:
        return f"https://raw.githubusercontent.com/{self.repository}/{self.commit}/"


_HELP_DEVICES = {  # device: (bytes, sha256) of data/nasbench201/latency/DEVICE.pt
    "1080ti_1": (141039, "4028f52b2c2441da126932e3827ae11a7f76d39818c4374c1b9ab9df236e23f4"),
    "1080ti_256": (141039, "435af0ccfab01f5dc55dc9f2e8b90ca37b396b2656e327bba5ee0b6eb9c24464"),
    "1080ti_32": (141039, "affce4fcdcf6f28622365995ef2ec018bb07d448add59f80633c0978c393cdea"),
    "2080ti_1": (141039, "38cf0e8f698abf8696c69b41a358fe9ddedf5d54cb1ae6f85b04dd8a8f89a1b3"),
    "2080ti_256": (141039, "daee655c44c46955d8318ddf0fa39254e70bab1ae723a6abc53d7b7e4e1561ae"),
    "2080ti_32": (141039, "ebc603ad325850663fc56c8e0fde52fadea28e585a8405864baa20f986eaf29d"),
    "essential_ph_1": (31663, "a97165c8669a216b9ca046041c83a07352bd07f2a42e2d8fea8b51e7ddbcabf0"),
    "eyeriss": (141039, "6f1dd2f8c0442289a09ab78e63e49bde96489f6d455cc33d5fa5aed37edb5d03"),
    "fpga": (141039, "6a0333c1476a3ab039d8c39e5d42ac99efe9e7f3ff521289569013fa84233b28"),
    "gold_6226": (141039, "6a00f63d14f67f8007ec04519f638a90aa6ed5357cf5c0e60c391df37f186c99"),
    "gold_6240": (141039, "ac6dd41f183de69bba21dec3954ac73333b7dec871e0defbcce0572d82536890"),
    "pixel2": (31663, "051845ddefc2bc138f21e2217f6c7827fe280c78375cbfb4b5bd252a888cb950"),
    "pixel3": (141039, "cf1387da12e06b1d4541ce85f3ca4869d551084e09daf4acf024b6e21a80d465"),
    "raspi4": (141039, "2fae425c50bcaef7aacc5391244cd0af98bfc7fba689a8741e461cb18192f57c"),
    "samsung_a50": (31663, "0872cb4ec8ecc7ea1b3bd8c98dd705f2d0f6e4940f3af833b313e484de39b155"),
    "samsung_s7": (31663, "dbae32364b882022adb044b2aa1af77b66f43a180930d9be4d4c13532429f0ea"),
    "silver_4114": (141039, "0cce9dc9ba62ad81c21275298a88cb0e4534db6474a878f089df0abb13293421"),
    "silver_4210r": (141039, "f976049bda39abde94b8f8cac90140cb78a5069fc145c462d6d6bc2f8450727a"),
    "titan_rtx_1": (141039, "a854dac331e2a37d7dcd6ee1f63d1bc6d73ead3aeb0a86f803f45ea1b294859e"),
    "titan_rtx_256": (141039, "cff1fba40b1743d3716cfb74c86ac2463d0682c146f356fa9095ac0d02dfb2a5"),
    "titan_rtx_32": (141039, "1258bee5501fe191530b9898a4f55a122ab30beec9c6ea74598c47a0173babed"),
    "titanx_1": (141039, "3461cc686263bd0ce4d4cd915bfc2fe067deb139cc68da387741bd6443434cb0"),
    "titanx_256": (141039, "04ddb80719515687bd3d722235cd5da821b50bd453a9e580b1e9d321dfb92941"),
    "titanx_32": (141039, "9c4ca69131e34451fb1e104caa47efbe12ffec3cc47bf051613674d7af044ff2"),
    "titanxp_1": (141039, "935aa0041c6592bed90f2f94ff3b4d40e892c066467864b704e6583682a57b20"),
    "titanxp_256": (141039, "9f03206bc62b0dcfc882820de07f55dc1fb7f43f57dfc977e4f0f4b019cb5041"),
    "titanxp_32": (141039, "4b6db63c7a9fb55177aa2649d70031dd86d2ed1609467ef5803dc1089a73cb1b"),
}
_HELP_ARCHS = ("data/nasbench201/str_arch2idx.pt", 1536943,
               "e1d7b7cc7cf51d7c3cd6f9e726e7395bea87d7ba674e26202fb8633f963aef0d")

#: The sources ``data fetch`` knows, pinned.
UPSTREAM = {
    "help": Upstream("help", "HayeonLee/HELP", "45f70eb92d0d735970a33b608d1544ad3c52f285", (
        _HELP_ARCHS, *((f"data/nasbench201/latency/{d}.pt", n, h)
                       for d, (n, h) in sorted(_HELP_DEVICES.items())))),
    "tophub": Upstream("tophub", "tlc-pack/tophub", "f05376ec3855afd2779433982b4c668a6d1120fa", (
        ("tophub/arm_cpu_v0.08.log", 754094,
         "0b915c3641e47cc4179988815534025ca56df6d523b3ad322d58b7ad8be5f7a8"),
        ("tophub/cuda_v0.10.log", 490618,
         "6641aa2f76cfe3a97885fbcc408229b2cac6cd565248517c31bea652690981d5"),
        ("tophub/mali_v0.06.log", 318180,
         "8ea4a4c576ff94d7790b9c4622a7fcbf5bae674dd2d77ef57f4c110df1110868"))),
}
#: The folder each source's converted data lives in (as in the shared public data folder).
FOLDERS = {"help": "help_nb201", "tophub": "tophub"}


def fetched_root() -> Path:
    """``DLAS_HOME/data``: where fetched public data is converted to."""
    from dlas_predict.paths import dlas_home

    return dlas_home() / "data"


def data_folder(folder: str, data: Path | None = None) -> Path:
    """The public data folder ``folder`` (``help_nb201``, ``tophub``): under ``data`` if
    given, else ``DLAS_SHARED_DATA`` (or the folder beside the checkout), else what ``data
    fetch`` converted into DLAS_HOME. One clear error where none holds it."""
    from dlas_predict.paths import shared_data

    roots = [Path(data)] if data else [shared_data(), fetched_root()]
    for root in roots:
        if (root / folder).is_dir():
            return root / folder
        if root.name == folder and root.is_dir():
            return root
    name = next(k for k, v in FOLDERS.items() if v == folder) if folder in FOLDERS.values() \
        else folder
    raise DlasError(f"public data folder not found: {' or '.join(str(r / folder) for r in roots)}"
                    f" (`dlas-predict data fetch {name}` downloads it; or set "
                    f"DLAS_SHARED_DATA to the folder holding {folder}/)")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check(path: Path, size: int, sha: str, where: str) -> None:
    got = path.stat().st_size
    if got != size or _sha256(path) != sha:
        path.unlink(missing_ok=True)
        raise DlasError(f"{where}: {got} bytes, sha256 does not match the pinned file "
                        f"({size} bytes); removed it")


def _download(url: str, out: Path, size: int, progress: Callable[[int, int], None] | None,
              source: str) -> None:
    part = out.with_name(out.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(part, "wb") as fh:
            done = 0
            while True:
                block = resp.read(1 << 16)
                if not block:
                    break
                fh.write(block)
                done += len(block)
                if progress:
                    progress(done, size)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        part.unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise DlasError(f"cannot download {url}: {reason}. Without network: download the "
                        f"files of {source} elsewhere into a folder (same paths) and run "
                        f"`dlas-predict data fetch {source} --from DIR`") from None
    part.replace(out)


def fetch(sources: list[str], from_dir: Path | None = None, mirror: str | None = None,
          progress: Callable[[str, int, int], None] | None = None) -> dict[str, Path]:
    """Download (or copy from ``from_dir``, a folder with the upstream paths) and check every
    file of ``sources``, then convert each source into :func:`fetched_root`. ``mirror``: a
    base URL serving the same paths instead of the upstream repository. Returns each
    source's converted folder. A file already there with the pinned checksum is kept."""
    unknown = [s for s in sources if s not in UPSTREAM]
    if unknown or not sources:
        raise DlasError(f"unknown public data {', '.join(unknown) or '(none)'}; known: "
                        + ", ".join(UPSTREAM) + ", all")
    out: dict[str, Path] = {}
    for name in sources:
        up = UPSTREAM[name]
        raw = fetched_root() / "upstream" / name
        for path, size, sha in up.files:
            dest = raw / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_file() and dest.stat().st_size == size and _sha256(dest) == sha:
                continue
            if from_dir is not None:
                src = Path(from_dir) / path
                if not src.is_file():
                    raise DlasError(f"{param('from_dir')} {from_dir}: {path} not found there")
                shutil.copyfile(src, dest)
                _check(dest, size, sha, str(src))
                continue
            url = (mirror.rstrip("/") + "/" if mirror else up.base_url) + path
            _download(url, dest, size, (lambda d, n, p=path: progress(p, d, n))
                      if progress else None, name)
            _check(dest, size, sha, url)
        out[name] = (_convert_help if name == "help" else _convert_tophub)(up, raw)
    return out


def _convert_help(up: Upstream, raw: Path) -> Path:
    """HELP's per-device lists of latencies (ms, by NAS-Bench-201 index) and its map of
    architecture strings to indices, as one table."""
    import csv
    import gzip

    import torch

    archs = torch.load(raw / _HELP_ARCHS[0], weights_only=False)
    by_index = {int(i): s for s, i in dict(archs).items()}
    folder = fetched_root() / FOLDERS["help"]
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "latency.csv.gz.tmp"
    with gzip.open(tmp, "wt", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["device", "arch_index", "arch_str", "latency"])
        for path, _, _ in up.files[1:]:
            device = Path(path).stem
            values = torch.load(raw / path, weights_only=False)
            values = values.tolist() if hasattr(values, "tolist") else list(values)
            for i, v in enumerate(values):
                if i in by_index:
                    w.writerow([device, i, by_index[i], float(v)])
    os.replace(tmp, folder / "latency.csv.gz")
    return folder


def _convert_tophub(up: Upstream, raw: Path) -> Path:
    """TopHub's logs: one AutoTVM record a line, kept as ``TARGET.jsonl``."""
    folder = fetched_root() / FOLDERS["tophub"]
    folder.mkdir(parents=True, exist_ok=True)
    for path, _, _ in up.files:
        name = Path(path).name.split("_v")[0] + ".jsonl"
        lines = [ln for ln in (raw / path).read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        tmp = folder / (name + ".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, folder / name)
    return folder
