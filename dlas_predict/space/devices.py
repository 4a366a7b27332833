"""The device registry: data in ``data/devices.json`` plus ``local``, detected at run time.

``local`` carries a fingerprint (CPU model, cores, ISA flags) stored with every measurement,
so corpora from different machines never mix silently. Its TVM target is the host CPU as TVM
sees it (``Target.from_device``), never the generic ``llvm``; finding it needs TVM, so it is
detected in a subprocess once and cached under ``DLAS_HOME``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from importlib import resources
from typing import Any

from dlas_predict.errors import DeviceError, param
from dlas_predict.paths import cache_dir
from dlas_predict.space.choices import DeviceKind

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
    #: measured roofs beyond the plain code's (``devices --measure-peaks``): the int8 roof
    #: of AVX-512 VNNI's dot product, which its int8 GEMM kernels use, and the warm
    #: bandwidth of each cache level ({"L1": GB/s, "L2": ..., "L3": ...})
    int8_dot_gflops: float | None = None
    cache_bandwidth_gbs: dict[str, float] = field(default_factory=dict)
    fingerprint: str = ""
    cpu_model: str | None = None
    isa_flags: tuple[str, ...] = ()
    tvm_tag: str | None = None
    tophub_model: str | None = None
    tophub_file: str | None = None
    #: GPUs measured here: the identity their fingerprint is made of (name, SM count,
    #: compute capability, driver), as ``dlas_predict.measure.gpu.run`` reads it off the GPU.
    gpu: dict[str, Any] | None = None
    #: a profile of another device (``local``): the same CPU with its own code generation
    #: and thread count, measured here
    profile_of: str | None = None
    #: where the entry comes from: ``shipped`` (the registry), ``user`` (``devices add``),
    #: ``detected`` (``local`` and its profiles)
    origin: str = "shipped"

    @property
    def local(self) -> bool:
        return self.name == LOCAL

    @property
    def measured_here(self) -> bool:
        """Measured by this machine's own runner (``local`` and its profiles); any other
        device is measured through an RPC tracker."""
        return self.name == LOCAL or self.profile_of == LOCAL

    @property
    def vnni(self) -> bool:
        """A CPU whose code may use AVX-512 VNNI (its int8 GEMM kernels do)."""
        return self.kind == "cpu" and "avx512_vnni" in self.isa_flags

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["isa_flags"] = list(self.isa_flags)
        return out


@functools.lru_cache(maxsize=None)
def _package_text(name: str) -> str:
    """A JSON file of the package's data (installed with it: it does not change while the
    process runs); each caller parses its own copy."""
    return resources.files("dlas_predict").joinpath(name).read_text()


def registry_entries() -> list[dict[str, Any]]:
    return json.loads(_package_text("data/devices.json"))["devices"]


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
    return _with_measured_roofs(Device(**fields, fingerprint=fp))


def _with_measured_roofs(dev: Device) -> Device:
    """``dev`` with its measured roofs (``devices --measure-peaks --device NAME``, cached or
    shipped by fingerprint) in place of its specification or estimate, once measured."""
    measured = measured_peaks(dev.fingerprint)
    if not measured:
        return dev
    return replace(dev, peak_gflops=dict(measured["peak_gflops"]),
                   mem_bandwidth_gbs=measured["mem_bandwidth_gbs"], source="measured",
                   int8_dot_gflops=measured.get("int8_dot_gflops"),
                   cache_bandwidth_gbs=dict(measured.get("cache_bandwidth_gbs") or {}))


def _estimated_peaks(cores: int, ghz: float | None, simd: int | None,
                     flags) -> dict[str, float]:
    """Peak GFLOP/s per dtype of the kernels' own arithmetic, from the SIMD width, the FMA
    units and the clock: an estimate (empty without a clock or a SIMD width). Every kernel
    accumulates in 32 bits: float16 is converted and multiplied-added in float32 (the float32
    rate), int8 widened to int32 and multiplied then added (two instructions where float32
    takes one: half the rate). No dot-product extension (VNNI, native FP16) is counted: the
    kernels use none (measured int8 roofs: 0.86 of float32 on a Zen 4, 0.31 on an Intel
    Xeon; `devices --measure-peaks`)."""
    if not (ghz and simd):
        return {}
    fma_units = 2 if ("fma" in flags or "asimd" in flags) else 1
    fp32 = cores * ghz * (simd // 32) * 2 * fma_units
    return {"float32": round(fp32, 1), "float16": round(fp32, 1),
            "int8": round(fp32 / 2, 1)}


# ---- local detection ---------------------------------------------------------------------
@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str], float | None]:
    """The CPU's model name, flags and clock from /proc/cpuinfo, read once a process; the
    flags those of the level ``DLAS_FORCE_ISA`` forces."""
    model, flags, mhz, _ = _native_cpuinfo()
    flags = set(flags)
    level = forced_isa()
    if level is not None:
        if platform.machine() not in ("x86_64", "AMD64") or not all(
                f in flags for f in level.needs):
            raise DeviceError(f"{FORCE_ISA_ENV}={level.name}: this CPU cannot run "
                              f"{level.label} code")
        flags = {f for f in flags if f in (level.uses or ())
                 or (f not in _FINGERPRINT_FLAGS and not f.startswith("avx"))}
    return model, frozenset(flags), mhz


@functools.cache
def _native_cpuinfo() -> tuple[str, frozenset[str], float | None, str]:
    """The CPU's own model name, flags and clock from /proc/cpuinfo, and its x86 family
    and model numbers (``25/17``; "" where it has none)."""
    model, flags, mhz = platform.processor() or platform.machine(), set(), None
    ids: dict[str, str] = {}
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
                elif key in ("cpu family", "model") and key not in ids:
                    ids[key] = value
    except OSError:
        pass
    cpu_id = f"{ids.get('cpu family', '')}/{ids.get('model', '')}" if ids else ""
    return model, frozenset(flags), mhz, cpu_id


#: The environment variable that makes this machine answer as a CPU of a lower x86-64 level
#: (``avx2``, ``sse42``): its flags, vector width, fingerprint and TVM target are those of
#: such a CPU of the same model, so the tests and commands can be run as on one. onnxruntime
#: still picks its own instruction set at run time.
FORCE_ISA_ENV = "DLAS_FORCE_ISA"


def forced_isa() -> "IsaLevel | None":
    """The ISA level ``DLAS_FORCE_ISA`` forces this machine to (None: its own)."""
    name = os.environ.get(FORCE_ISA_ENV, "").strip().lower()
    if name in ("", "native"):
        return None
    for level in ISA_LEVELS:
        if level.name == name and level.mcpu is not None:
            return level
    allowed = ", ".join(lv.name for lv in ISA_LEVELS)
    raise DeviceError(f"{FORCE_ISA_ENV}={name!r} is not an ISA level; allowed: {allowed}")


#: Cache levels from the smallest: the sizes' key in ``Device.caches`` and whether that size
#: is per core.
CACHE_LEVELS = (("L1", "L1d_kb", True), ("L2", "L2_kb", True), ("L3", "L3_kb", False))


def cache_capacities(caches: dict[str, int], cores: int) -> dict[str, int]:
    """Bytes each cache level of ``caches`` holds in all: L1d and L2 per core times the
    cores, L3 shared; a level of unknown size is left out."""
    return {level: caches[key] * 1024 * (cores if per_core else 1)
            for level, key, per_core in CACHE_LEVELS if caches.get(key)}


def _local_caches() -> dict[str, int]:
    """Cache sizes of CPU 0 from sysfs, e.g. {"L1d_kb": 48, "L2_kb": 1024, "L3_kb": 32768}
    (a copy: the sizes are read once per process)."""
    return dict(_sysfs_caches())


@functools.lru_cache(maxsize=1)
def _sysfs_caches() -> dict[str, int]:
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


#: The machines whose shipped data is keyed by name, cores and flags alone (the key of
#: :func:`_fingerprint` without family and model numbers), with the numbers each was
#: measured on ("": not recorded). Such a machine keeps that key where its numbers agree;
#: every other machine's key holds its numbers.
_KEYS_WITHOUT_CPU_ID = {"c148d788c2ccc7d5": "25/17", "0ab3a63049d27cd9": "26/2",
                        "66a5a5847a45f28c": ""}


def local_fingerprint() -> str:
    """This machine's key: its CPU's model name, cores, architecture, ISA flags and x86
    family and model numbers. A virtual machine names many generations alike ("AMD EPYC"),
    and two of them with the same flags (a Zen 1 and a Zen 3, both AVX2) are two machines;
    so is a CPU forced to a lower ISA level and a CPU of that level."""
    model, flags, _ = _cpuinfo()
    forced = {f for f in flags if f in _FINGERPRINT_FLAGS} != \
        {f for f in _native_cpuinfo()[1] if f in _FINGERPRINT_FLAGS}
    if forced:
        return _fingerprint(model, flags, _cpu_id())
    return _own_key(model, flags, _cpu_id())


def native_fingerprint() -> str:
    """This machine's fingerprint at its own instruction set: :func:`local_fingerprint` as
    it is without ``DLAS_FORCE_ISA``."""
    model, flags, _, _ = _native_cpuinfo()
    return _own_key(model, flags, _cpu_id())


def _own_key(model: str, flags, cpu_id: str) -> str:
    """The key of a CPU at its own instruction set (:data:`_KEYS_WITHOUT_CPU_ID`)."""
    plain = _fingerprint(model, flags)
    if not cpu_id or _KEYS_WITHOUT_CPU_ID.get(plain) in ("", cpu_id):
        return plain
    return _fingerprint(model, flags, cpu_id)


def _fingerprint(model: str, flags, cpu_id: str | None = None) -> str:
    key = {"model": model, "cores": local_cores(), "machine": platform.machine(),
           "flags": sorted(f for f in flags if f in _FINGERPRINT_FLAGS)}
    if cpu_id is not None:
        key["cpu_id"] = cpu_id
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _simd_bits(flags) -> int | None:
    """The vector width of the widest SIMD extension among ``flags`` (None: none known)."""
    if "avx512f" in flags:
        return 512
    if "avx2" in flags or "avx" in flags:
        return 256
    if set(flags) & {"asimd", "neon", "sse2"}:
        return 128
    return None


def native_simd_bits() -> int | None:
    """The vector width of this CPU's own instruction set, whatever ``DLAS_FORCE_ISA``
    forces."""
    return _simd_bits(_native_cpuinfo()[1])


def _cpu_id() -> str:
    """The x86 CPU's family and model numbers (``25/17``), or ""."""
    return _native_cpuinfo()[3]


def _host_target(fingerprint: str) -> dict[str, Any]:
    """TVM's view of the host CPU, detected once in a subprocess and cached."""
    cache = cache_dir("devices") / f"local-target-{fingerprint}.json"
    if cache.is_file():
        try:
            return json.loads(cache.read_text())
        except ValueError:
            pass
    code = ("import json; from dlas_predict.measure import import_tvm; tvm = import_tvm(); "
            "t = tvm.target.Target.from_device(tvm.cpu()); print(json.dumps(json.loads(str(t))))")
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
    level = forced_isa()
    if level is not None:  # that level's generic CPU, as its profiles generate code for
        target["mcpu"] = level.mcpu
        target.pop("mattr", None)
    cache.write_text(json.dumps(target))
    return target


#: Measured roofs shipped with the tool, by local fingerprint (``devices --measure-peaks
#: --save-to`` writes entries; the shipped corpus's machine is one of them).
SHIPPED_PEAKS = "data/measured_peaks.json"


def _peaks_cache(fingerprint: str):
    return cache_dir("devices") / f"local-peaks-{fingerprint}.json"


def peaks_measured_here(fingerprint: str) -> bool:
    """This machine's roofs were measured on this very host (``devices --measure-peaks``,
    cached under DLAS_HOME), not only shipped for its CPU id."""
    return _peaks_cache(fingerprint).is_file()


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
        shipped = _shipped_peaks(SHIPPED_PEAKS)
    except (OSError, ValueError):
        return None
    return shipped.get("machines", {}).get(fingerprint)


@functools.lru_cache(maxsize=4)
def _shipped_peaks(name: str) -> dict[str, Any]:
    """The shipped measured roofs by fingerprint (the package's file ``name``), parsed once
    (callers copy what they keep)."""
    return json.loads(_package_text(name))


#: How ``devices --measure-peaks`` measures, recorded with every measurement.
PEAKS_METHOD = ("measure/peaks.py: FMA-bound register kernel per dtype (best of 15 runs); "
                "with AVX-512 VNNI, a vpdpbusd-bound int8 kernel; STREAM triad over "
                "3 x 256 MiB (3 x 4 bytes per element); a = 0.5 a + b warm in half of each "
                "cache level (12 bytes per element)")


@dataclass(frozen=True)
class MeasuredPeaks:
    """A device's roofs as measured on it (``devices --measure-peaks``): what the registry's
    measured-roofs file and cache hold, keyed by the device's fingerprint."""

    fingerprint: str
    device: str
    cpu_model: str | None
    cores: int
    simd_bits: int | None
    caches: Any
    peak_gflops: dict[str, float]
    mem_bandwidth_gbs: float
    details: Any
    tvm_version: str | None
    measured_at: float
    board: dict[str, Any] | None
    method: str = PEAKS_METHOD
    int8_dot_gflops: float | None = None
    cache_bandwidth_gbs: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    simd = _simd_bits(flags)
    ghz = mhz / 1000 if mhz else None
    target: dict[str, Any] = {"kind": "llvm"}
    if with_target:
        target = dict(_host_target(fp))
    target["num-cores"] = cores
    vnni = sorted(flags & set(_FINGERPRINT_FLAGS))
    return _with_measured_roofs(Device(
        name=LOCAL, kind="cpu", description=f"this machine: {model}, {cores} cores",
        target=target, cores=cores, clock_ghz=ghz, simd_bits=simd,
        peak_gflops=_estimated_peaks(cores, ghz, simd, flags), mem_bandwidth_gbs=None,
        caches=_local_caches(), rpc_key=None, source="estimate", fingerprint=fp,
        cpu_model=model, isa_flags=tuple(vnni), origin="detected"))


# ---- profiles of the local CPU -----------------------------------------------------------
@dataclass(frozen=True)
class IsaLevel:
    """Code generation a profile uses: an LLVM CPU (None: the host's own) and the host flags
    it needs."""

    name: str
    mcpu: str | None
    needs: tuple[str, ...]
    simd_bits: int
    label: str
    #: fingerprint flags its code may use (None: all the host's)
    uses: tuple[str, ...] | None


#: The x86-64 micro-architecture levels profiles generate code for, and the host's own ISA.
ISA_LEVELS = (
    IsaLevel("sse42", "x86-64-v2", ("sse4_2",), 128, "x86-64-v2 (SSE4.2)", ("sse4_2",)),
    IsaLevel("avx2", "x86-64-v3", ("avx2", "fma"), 256, "x86-64-v3 (AVX2, FMA)",
             ("sse4_2", "avx", "avx2", "fma", "f16c")),
    IsaLevel("native", None, (), 0, "its native ISA", None),
)


def _profile_specs() -> list[tuple[str, IsaLevel, int]]:
    """(name, ISA level, threads) of every profile this machine can run: each level its
    flags allow, at 1 thread and at every core (the native ISA at every core is ``local``)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        levels = [lv for lv in ISA_LEVELS if lv.mcpu is None]
    else:
        _, flags, _ = _cpuinfo()
        levels = [lv for lv in ISA_LEVELS if all(f in flags for f in lv.needs)]
    cores = local_cores()
    out = []
    for lv in levels:
        for threads in sorted({1, cores}):
            if lv.mcpu is None and threads == cores:
                continue  # that is `local`
            out.append((f"{LOCAL}-{lv.name}-{threads}t", lv, threads))
    return out


def profile_names() -> list[str]:
    return [name for name, _, _ in _profile_specs()]


def profile_fingerprint(local_fp: str, level: IsaLevel, threads: int) -> str:
    key = {"local": local_fp, "isa": level.name, "mcpu": level.mcpu, "threads": threads}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _profile(name: str, level: IsaLevel, threads: int, with_target: bool) -> Device:
    base = detect_local(with_target=with_target)
    fp = profile_fingerprint(base.fingerprint, level, threads)
    target = {k: v for k, v in base.target.items() if k != "num-cores"}
    if level.mcpu is not None:
        target["mcpu"] = level.mcpu
        target.pop("mattr", None)
    target["num-cores"] = threads
    simd = level.simd_bits or base.simd_bits
    flags = base.isa_flags if level.uses is None else tuple(
        f for f in base.isa_flags if f in level.uses)
    threads_word = "thread" if threads == 1 else "threads"
    return _with_measured_roofs(Device(
        name=name, kind="cpu",
        description=f"profile of this machine ({base.cpu_model}): code for {level.label}, "
                    f"{threads} {threads_word}",
        target=target, cores=threads, clock_ghz=base.clock_ghz, simd_bits=simd,
        peak_gflops=_estimated_peaks(threads, base.clock_ghz, simd, flags),
        mem_bandwidth_gbs=None, caches=base.caches, rpc_key=None, source="estimate",
        fingerprint=fp, cpu_model=base.cpu_model, isa_flags=flags, profile_of=LOCAL,
        origin="detected"))


def _other_machine(name: str, fingerprint: str, profile_of: str | None = None) -> Device:
    """A device measured on another machine, known by its shipped measured roofs (or an
    unknown CPU with no roofs)."""
    m = measured_peaks(fingerprint) or {}
    model = m.get("cpu_model") or "an unknown CPU"
    simd = f", {m['simd_bits']}-bit SIMD" if m.get("simd_bits") else ""
    return Device(
        name=name, kind="cpu", description=f"another machine: {model}, {m.get('cores', '?')} "
                                           f"cores{simd} (fingerprint {fingerprint})",
        target={"kind": "llvm"}, cores=int(m.get("cores") or 1), clock_ghz=None,
        simd_bits=m.get("simd_bits"), peak_gflops=dict(m.get("peak_gflops") or {}),
        mem_bandwidth_gbs=m.get("mem_bandwidth_gbs"), caches=dict(m.get("caches") or {}),
        int8_dot_gflops=m.get("int8_dot_gflops"),
        cache_bandwidth_gbs=dict(m.get("cache_bandwidth_gbs") or {}),
        source="measured" if m else "unknown", fingerprint=fingerprint, cpu_model=model,
        profile_of=profile_of, origin="detected")


def corpus_device(name: str, fingerprint: str) -> Device:
    """The device that measured a corpus row: this machine (or its profile) when the
    fingerprint is ours; for another machine's ``local`` or profile rows, its shipped
    measured roofs (or an unknown CPU with no roofs); a registry device otherwise."""
    if name == LOCAL:
        if fingerprint == local_fingerprint():
            return detect_local(with_target=False)
        return _other_machine(name, fingerprint)
    if is_profile_name(name):
        if name in profile_names():
            dev = get_device(name, with_target=False)
            if dev.fingerprint == fingerprint:
                return dev
        return _other_machine(name, fingerprint, profile_of=LOCAL)
    return get_device(name, with_target=False)


def is_profile_name(name: str) -> bool:
    """A name of the form ``local-LEVEL-Nt`` (a profile here or on another machine)."""
    return profile_code(name) is not None


def profile_code(name: str) -> "tuple[IsaLevel, int] | None":
    """The ISA level and threads a profile's name ``local-LEVEL-Nt`` names (None: not such
    a name)."""
    parts = name.split("-")
    if not (len(parts) == 3 and parts[0] == LOCAL and parts[2].endswith("t")
            and parts[2][:-1].isdigit()):
        return None
    level = next((lv for lv in ISA_LEVELS if lv.name == parts[1]), None)
    return None if level is None else (level, int(parts[2][:-1]))


def native_fingerprint_at(machine: str, threads: int, cores: int) -> str:
    """The fingerprint of the code of its own ISA at ``threads`` on the machine whose
    ``local`` fingerprint is ``machine`` (of ``cores`` cores): ``local`` itself at every
    core (as :func:`_profile_specs` names it), else its native profile."""
    if threads == cores:
        return machine
    return profile_fingerprint(machine, next(lv for lv in ISA_LEVELS if lv.mcpu is None),
                               threads)


# ---- devices the user adds ---------------------------------------------------------------
def user_registry_path() -> Path:
    from dlas_predict.paths import dlas_home

    return dlas_home() / "devices.json"


def _user_entries() -> list[dict[str, Any]]:
    path = user_registry_path()
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
        entries = data["devices"]
        if not isinstance(entries, list):
            raise TypeError("'devices' is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DeviceError(f"the user device registry {path} is unreadable ({exc}); fix or "
                          "remove it") from None
    return entries


def _write_user_entries(entries: list[dict[str, Any]]) -> None:
    path = user_registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"devices": entries}, indent=1) + "\n")
    os.replace(tmp, path)


def _check_target(target: Any, kind: str) -> dict[str, Any]:
    """A TVM target as a JSON dict that TVM accepts, of the right kind for ``kind``."""
    if isinstance(target, str):
        try:
            target = json.loads(target)
        except ValueError as exc:
            raise DeviceError(f"{param('target')} is not JSON ({exc}); give a TVM target dict "
                              "such as "
                              '\'{"kind": "llvm", "mtriple": "aarch64-linux-gnu", '
                              '"mcpu": "cortex-a72"}\'') from None
    if not isinstance(target, dict) or "kind" not in target:
        raise DeviceError(f"{param('target')} must be a JSON object with a 'kind', got {target!r}")
    cpu_kinds, gpu_kinds = {"llvm", "c"}, {"cuda", "opencl", "vulkan", "metal", "rocm"}
    if kind == "cpu" and target["kind"] not in cpu_kinds:
        raise DeviceError(f"a cpu device needs an llvm target, got kind {target['kind']!r}")
    if kind == "gpu" and target["kind"] not in gpu_kinds:
        raise DeviceError(f"a gpu device needs one of {sorted(gpu_kinds)} as its target "
                          f"kind, got {target['kind']!r}")
    try:
        import tvm

        tvm.target.Target(target)
    except Exception as exc:  # noqa: BLE001 - TVM's own message says what is wrong
        msg = str(exc).strip().splitlines()
        raise DeviceError(f"TVM rejects the target {json.dumps(target)}: "
                          f"{msg[-1] if msg else type(exc).__name__}") from None
    return target


def add_device(name: str, kind: str, target: Any, cores: int, peak_gflops: float,
               bandwidth_gbs: float, rpc_key: str | None = None,
               description: str | None = None) -> Device:
    """Register a device in ``DLAS_HOME/devices.json``; its figures are labelled ``spec``."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name or ""):
        raise DeviceError(f"device name {name!r}: use letters, digits, '.', '_' and '-' "
                          "(at most 64 characters)")
    if name == LOCAL or is_profile_name(name):
        raise DeviceError(f"{name!r} is the name of this machine or one of its profiles")
    if name in {e["name"] for e in registry_entries()}:
        raise DeviceError(f"{name!r} is a shipped device; choose another name")
    if kind not in DeviceKind.words():
        raise DeviceError(f"{param('kind')} must be {' or '.join(DeviceKind.words())}, "
                          f"got {kind!r}")
    if cores < 1:
        raise DeviceError(f"{param('cores')} must be a positive number, got {cores}")
    for name_, value in (("peak_gflops", peak_gflops), ("bandwidth_gbs", bandwidth_gbs)):
        if not (value > 0) or value != value or value == float("inf"):
            raise DeviceError(f"{param(name_)} must be a positive figure, got {value}")
    target = _check_target(target, kind)
    entry = {"name": name, "kind": kind,
             "description": description or f"user device ({kind}, {cores} cores)",
             "target": target, "cores": int(cores), "clock_ghz": None, "simd_bits": None,
             "peak_gflops": {"float32": float(peak_gflops)},
             "mem_bandwidth_gbs": float(bandwidth_gbs), "rpc_key": rpc_key or None,
             "source": "spec"}
    entries = [e for e in _user_entries() if e.get("name") != name]
    entries.append(entry)
    _write_user_entries(entries)
    return get_device(name)


def remove_device(name: str) -> None:
    """Remove a device ``add_device`` registered; shipped and detected ones cannot be."""
    entries = _user_entries()
    if name not in {e.get("name") for e in entries}:
        if name in device_names():
            raise DeviceError(f"{name!r} is not a user device (shipped and detected devices "
                              "cannot be removed)")
        raise DeviceError(f"no user device {name!r}; user devices: "
                          f"{', '.join(e['name'] for e in entries) or 'none'}")
    _write_user_entries([e for e in entries if e.get("name") != name])


# ---- lookup ------------------------------------------------------------------------------
def device_names() -> list[str]:
    return ([LOCAL] + profile_names() + [e["name"] for e in registry_entries()]
            + [e["name"] for e in _user_entries()])


def get_device(name: str, with_target: bool = True) -> Device:
    """Look a device up by name; an unknown name lists the known ones."""
    if name == LOCAL:
        return detect_local(with_target=with_target)
    for pname, level, threads in _profile_specs():
        if pname == name:
            return _profile(name, level, threads, with_target)
    for entry in registry_entries():
        if entry["name"] == name:
            return _remote_device(entry)
    for entry in _user_entries():
        if entry.get("name") == name:
            return replace(_remote_device(entry), origin="user")
    raise DeviceError(f"unknown device {name!r}; known devices: {', '.join(device_names())}")


def all_devices(with_target: bool = True) -> list[Device]:
    return [get_device(n, with_target=with_target) for n in device_names()]


def rows_device(name: str, fingerprint: str) -> Device:
    """The device of corpus rows (see :func:`corpus_device`); a name the registry no longer
    knows has no roofs."""
    from dlas_predict.errors import DlasError

    try:
        return corpus_device(name, fingerprint)
    except DlasError:
        return Device(name=name, kind="cpu", description=name, target={}, cores=1,
                      clock_ghz=None, simd_bits=None, peak_gflops={}, mem_bandwidth_gbs=None,
                      source="unknown")


def fingerprint_here(device: str) -> str | None:
    """The fingerprint ``device`` has on this machine: ``local``'s or a profile's; None for
    any other device (measured elsewhere by nature)."""
    from dlas_predict.errors import DlasError

    if device != LOCAL and not is_profile_name(device):
        return None
    try:
        return get_device(device, with_target=False).fingerprint
    except DlasError:
        return None  # a profile this CPU cannot run


def model_dir(name: str) -> Path:
    """The shipped model folder of device ``name`` on this machine. The local CPU (and its
    profiles) are whatever machine the tool runs on: where the project measured this very
    machine, its models are ``models_store/machines/FINGERPRINT/NAME`` (FINGERPRINT this
    machine's); otherwise, and for every other device, ``models_store/NAME``."""
    from dlas_predict.paths import MODELS_STORE, machine_model_dir

    if name == LOCAL or is_profile_name(name):
        mine = machine_model_dir(name, local_fingerprint())
        if (mine / "layer.json").is_file():
            return mine
    return MODELS_STORE / name
