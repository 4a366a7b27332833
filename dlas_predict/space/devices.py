"""The device registry: data in ``data/devices.json`` plus ``local``, detected at run time.

``local`` carries a fingerprint (CPU model, cores, ISA flags) stored with every measurement,
so corpora from different machines never mix silently. Its TVM target is the host CPU as TVM
sees it (``Target.from_device``), never the generic ``llvm``; finding it needs TVM, so it is
detected in a subprocess once and cached under ``DLAS_HOME``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from dlas_predict.errors import DeviceError
from dlas_predict.paths import cache_dir

LOCAL = "local"

#: ISA flags that matter to code generation; part of the local fingerprint.
_FINGERPRINT_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl",
                      "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "f16c",
                      "asimd", "fphp", "asimdhp", "asimddp", "sve", "i8mm", "bf16")


@dataclass(frozen=True)
class Device:
    """One device of the registry.

    ``peak_gflops`` (per dtype) and ``mem_bandwidth_gbs`` are specifications or estimates;
    ``source`` says which (``spec``, ``estimate``, ``measured``).
    """

    name: str
    kind: str
    description: str
    target: dict[str, Any]
    cores: int
    clock_ghz: float | None
    simd_bits: int | None
    peak_gflops: dict[str, float]
    mem_bandwidth_gbs: float | None
    caches: dict[str, int] = field(default_factory=dict)
    rpc_key: str | None = None
    source: str = "spec"
    fingerprint: str = ""
    cpu_model: str | None = None
    isa_flags: tuple[str, ...] = ()
    tvm_tag: str | None = None
    tophub_model: str | None = None
    tophub_file: str | None = None
    #: GPUs measured here: the identity their fingerprint is made of (name, SM count,
    #: compute capability, driver), as ``measure.gpu_run`` reads it off the GPU.
    gpu: dict[str, Any] | None = None

    @property
    def local(self) -> bool:
        return self.name == LOCAL

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["isa_flags"] = list(self.isa_flags)
        return out


def _registry_entries() -> list[dict[str, Any]]:
    text = resources.files("dlas_predict").joinpath("data/devices.json").read_text()
    return json.loads(text)["devices"]


def gpu_fingerprint(gpu: dict[str, Any]) -> str:
    """The fingerprint of a GPU identity: name, SM count, compute capability, driver."""
    key = {k: gpu.get(k) for k in ("name", "sm_count", "compute", "driver")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _remote_device(entry: dict[str, Any]) -> Device:
    fields = {k: v for k, v in entry.items() if k in Device.__dataclass_fields__}
    if entry.get("gpu"):
        fp = gpu_fingerprint(entry["gpu"])
    else:
        fp = hashlib.sha256(json.dumps({"name": entry["name"], "target": entry["target"]},
                                       sort_keys=True).encode()).hexdigest()[:16]
    return Device(**fields, fingerprint=fp)


# ---- local detection ---------------------------------------------------------------------
def _cpuinfo() -> tuple[str, set[str], float | None]:
    model, flags, mhz = platform.processor() or platform.machine(), set(), None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key in ("model name", "Hardware", "CPU part") and model in (
                        platform.processor(), platform.machine(), ""):
                    model = value
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
                elif key == "cpu MHz" and mhz is None:
                    mhz = float(value)
    except OSError:
        pass
    return model, flags, mhz


def _local_caches() -> dict[str, int]:
    """Cache sizes of CPU 0 from sysfs, e.g. {"L1d_kb": 48, "L2_kb": 1024, "L3_kb": 32768}."""
    out: dict[str, int] = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return out
    for entry in entries:
        if not entry.startswith("index"):
            continue
        try:
            def read(name: str) -> str:
                with open(f"{base}/{entry}/{name}") as fh:
                    return fh.read().strip()
            level, kind, size = read("level"), read("type"), read("size")
        except OSError:
            continue
        if kind == "Instruction":
            continue
        suffix = "d" if kind == "Data" else ""
        kb = int(size[:-1]) * (1024 if size.endswith("M") else 1) if size[-1] in "KM" \
            else int(size) // 1024
        out[f"L{level}{suffix}_kb"] = kb
    return out


def local_cores() -> int:
    """Cores this process may run on (the thread count the kernels use)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def local_fingerprint() -> str:
    model, flags, _ = _cpuinfo()
    key = {"model": model, "cores": local_cores(), "machine": platform.machine(),
           "flags": sorted(f for f in flags if f in _FINGERPRINT_FLAGS)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _host_target(fingerprint: str) -> dict[str, Any]:
    """TVM's view of the host CPU, detected once in a subprocess and cached."""
    cache = cache_dir("devices") / f"local-target-{fingerprint}.json"
    if cache.is_file():
        try:
            return json.loads(cache.read_text())
        except ValueError:
            pass
    code = ("import json, tvm; t = tvm.target.Target.from_device(tvm.cpu()); "
            "print(json.dumps(json.loads(str(t))))")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
        target = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise DeviceError(f"cannot detect the local TVM target (is TVM installed?): {exc}")
    if target.get("kind") != "llvm" or not target.get("mcpu"):
        raise DeviceError(f"TVM gave a generic host target {target}; refusing to measure "
                          "with generic 'llvm' code generation")
    target = {k: target[k] for k in ("kind", "mtriple", "mcpu", "mattr") if k in target}
    cache.write_text(json.dumps(target))
    return target


#: Measured roofs shipped with the tool, by local fingerprint (``devices --measure-peaks
#: --save-to`` writes entries; the shipped corpus's machine is one of them).
SHIPPED_PEAKS = "data/measured_peaks.json"


def _peaks_cache(fingerprint: str):
    return cache_dir("devices") / f"local-peaks-{fingerprint}.json"


def measured_peaks(fingerprint: str) -> dict[str, Any] | None:
    """The measured roofs of the machine with ``fingerprint``: this machine's own
    measurement (cached under DLAS_HOME) first, then the shipped ones; None if never
    measured."""
    cache = _peaks_cache(fingerprint)
    if cache.is_file():
        try:
            return json.loads(cache.read_text())
        except ValueError:
            pass
    try:
        shipped = json.loads(resources.files("dlas_predict").joinpath(SHIPPED_PEAKS)
                             .read_text())
    except (OSError, ValueError):
        return None
    return shipped.get("machines", {}).get(fingerprint)


def save_measured_peaks(entry: dict[str, Any], also_to: str | None = None) -> str:
    """Cache a measurement of this machine's roofs (and merge it into the JSON file
    ``also_to``, keyed by fingerprint); returns the cache path."""
    fp = entry["fingerprint"]
    cache = _peaks_cache(fp)
    cache.write_text(json.dumps(entry, indent=1))
    if also_to:
        try:
            with open(also_to) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            data = {}
        data.setdefault("_note", "Measured roofs (measure/peaks.py) by local fingerprint.")
        data.setdefault("machines", {})[fp] = entry
        with open(also_to, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.write("\n")
    return str(cache)


def detect_local(with_target: bool = True) -> Device:
    """The local CPU. Peak GFLOP/s and bandwidth are measured (``devices --measure-peaks``)
    when this machine's roofs were measured, else an ISA-based estimate (no bandwidth)."""
    model, flags, mhz = _cpuinfo()
    cores = local_cores()
    fp = local_fingerprint()
    if "avx512f" in flags:
        simd = 512
    elif "avx2" in flags or "avx" in flags:
        simd = 256
    elif flags & {"asimd", "neon", "sse2"}:
        simd = 128
    else:
        simd = None
    ghz = mhz / 1000 if mhz else None
    peak: dict[str, float] = {}
    if ghz and simd:
        fma_units = 2 if ("fma" in flags or "asimd" in flags) else 1
        fp32 = cores * ghz * (simd // 32) * 2 * fma_units
        peak = {"float32": round(fp32, 1),
                "float16": round(fp32 * (2 if "avx512_fp16" in flags else 1), 1),
                "int8": round(fp32 * (4 if flags & {"avx512_vnni", "avx_vnni"} else 2), 1)}
    bandwidth, source = None, "estimate"
    measured = measured_peaks(fp)
    if measured:
        peak = dict(measured["peak_gflops"])
        bandwidth, source = measured["mem_bandwidth_gbs"], "measured"
    target: dict[str, Any] = {"kind": "llvm"}
    if with_target:
        target = dict(_host_target(fp))
    target["num-cores"] = cores
    vnni = sorted(flags & set(_FINGERPRINT_FLAGS))
    return Device(
        name=LOCAL, kind="cpu", description=f"this machine: {model}, {cores} cores",
        target=target, cores=cores, clock_ghz=ghz, simd_bits=simd, peak_gflops=peak,
        mem_bandwidth_gbs=bandwidth, caches=_local_caches(), rpc_key=None, source=source,
        fingerprint=fp, cpu_model=model, isa_flags=tuple(vnni))


def corpus_device(name: str, fingerprint: str) -> Device:
    """The device that measured a corpus row: this machine when the fingerprint is ours;
    for another machine's ``local`` rows, its shipped measured roofs (or an unknown CPU
    with no roofs); a registry device otherwise."""
    if name != LOCAL:
        return get_device(name, with_target=False)
    if fingerprint == local_fingerprint():
        return detect_local(with_target=False)
    m = measured_peaks(fingerprint) or {}
    model = m.get("cpu_model") or f"another machine (fingerprint {fingerprint})"
    return Device(
        name=LOCAL, kind="cpu", description=f"{model}, {m.get('cores', '?')} cores",
        target={"kind": "llvm"}, cores=int(m.get("cores") or 1), clock_ghz=None,
        simd_bits=m.get("simd_bits"), peak_gflops=dict(m.get("peak_gflops") or {}),
        mem_bandwidth_gbs=m.get("mem_bandwidth_gbs"), caches=dict(m.get("caches") or {}),
        source="measured" if m else "unknown", fingerprint=fingerprint, cpu_model=model)


# ---- lookup ------------------------------------------------------------------------------
def device_names() -> list[str]:
    return [LOCAL] + [e["name"] for e in _registry_entries()]


def get_device(name: str, with_target: bool = True) -> Device:
    """Look a device up by name; an unknown name lists the known ones."""
    if name == LOCAL:
        return detect_local(with_target=with_target)
    for entry in _registry_entries():
        if entry["name"] == name:
            return _remote_device(entry)
    raise DeviceError(f"unknown device {name!r}; known devices: {', '.join(device_names())}")


def all_devices(with_target: bool = True) -> list[Device]:
    return [get_device(n, with_target=with_target) for n in device_names()]
