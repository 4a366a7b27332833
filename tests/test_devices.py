import os
import sys

import pytest

from dlas_predict.space.devices import device_names, get_device, local_fingerprint
from dlas_predict.errors import DeviceError


@pytest.mark.machine
def test_registry_has_the_study_and_tophub_devices():
    names = device_names()
    for name in ("local", "i7-8700", "hikey970-cpu", "hikey970-gpu", "xavier-cpu", "xavier",
                 "rpi3b", "rk3399-cpu", "rk3399-mali", "titanx", "1080ti", "jetson-nano"):
        assert name in names
    x = get_device("xavier")
    assert x.kind == "gpu" and x.target["arch"] == "sm_72" and x.peak_gflops["float32"] > 0


def test_unknown_device_lists_known_ones():
    with pytest.raises(DeviceError, match="known devices: local, .*i7-8700"):
        get_device("pentium-ii")


@pytest.mark.machine
def test_local_is_detected_with_a_specific_target_and_stable_fingerprint():
    local = get_device("local")
    assert local.target["kind"] == "llvm" and local.target.get("mcpu")
    assert local.target["mcpu"] != "generic" and local.target["num-cores"] == local.cores
    assert local.fingerprint == local_fingerprint() == get_device("local").fingerprint
    assert local.cores >= 1 and local.source in ("estimate", "measured")
    # measured roofs come with a bandwidth; an estimate has none
    assert (local.mem_bandwidth_gbs is not None) == (local.source == "measured")


def test_two_generations_alike_in_name_and_flags_are_two_machines(monkeypatch):
    """A virtual machine names a Zen 1 and a Zen 3 alike ("AMD EPYC", the same AVX2
    flags): their family and model numbers make them two keys. A machine whose shipped data
    is keyed without its numbers keeps that key where its numbers agree."""
    from dlas_predict.space import devices as D

    flags = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})
    keys = {}
    for cpu_id in ("23/1", "25/1", ""):
        monkeypatch.setattr(D, "_native_cpuinfo", lambda c=cpu_id: ("AMD EPYC", flags,
                                                                     2000.0, c))
        monkeypatch.setattr(D, "_cpu_id", lambda c=cpu_id: c)
        keys[cpu_id] = D.native_fingerprint()
    assert len(set(keys.values())) == 3
    assert keys[""] == D._fingerprint("AMD EPYC", flags)  # no numbers: name and flags
    plain = D._fingerprint("AMD EPYC", flags)
    monkeypatch.setitem(D._KEYS_WITHOUT_CPU_ID, plain, "25/1")
    assert D._own_key("AMD EPYC", flags, "25/1") == plain
    assert D._own_key("AMD EPYC", flags, "23/1") == keys["23/1"] != plain
    monkeypatch.setitem(D._KEYS_WITHOUT_CPU_ID, plain, "")  # numbers not recorded
    assert D._own_key("AMD EPYC", flags, "23/1") == plain


def test_estimated_roofs_are_of_the_kernels_arithmetic_not_the_isas_best():
    """Unmeasured, a CPU's roofs are what our kernels execute: float16 converted and
    multiply-added in float32, int8 widened to int32 and multiplied then added (half the
    float32 rate); VNNI and native FP16, which no kernel uses, count for nothing."""
    from dlas_predict.space.devices import _estimated_peaks

    plain = _estimated_peaks(2, 2.6, 512, {"fma", "avx512f"})
    assert plain == {"float32": 332.8, "float16": 332.8, "int8": 166.4}
    assert _estimated_peaks(2, 2.6, 512, {"fma", "avx512f", "avx512_vnni",
                                          "avx512_fp16"}) == plain
    assert _estimated_peaks(1, 3.0, 128, set())["float32"] == 24.0  # no FMA: one unit
    assert _estimated_peaks(2, None, 512, {"fma"}) == {}


@pytest.mark.machine
def test_measured_roofs_replace_the_estimate():
    import json

    from dlas_predict.space import devices as D

    fp = local_fingerprint()
    entry = {"fingerprint": fp, "cpu_model": "test", "cores": 2, "simd_bits": 512,
             "peak_gflops": {"float32": 123.0, "float16": 120.0, "int8": 99.0},
             "mem_bandwidth_gbs": 12.5}
    path = D.save_measured_peaks(entry)
    try:
        local = get_device("local", with_target=False)
        assert local.source == "measured" and local.peak_gflops["float32"] == 123.0
        assert local.mem_bandwidth_gbs == 12.5
        assert json.loads(open(path).read())["fingerprint"] == fp
    finally:
        import os

        os.remove(path)
    # another machine's local rows: its shipped roofs, or none at all
    other = D.corpus_device("local", "0000000000000000")
    assert other.source == "unknown" and other.peak_gflops == {}
    assert D.corpus_device("rk3399-cpu", "whatever").source == "spec"


def test_fma_kernel_matches_numpy():
    """The int8 FMA-bound kernel computes exactly what it says (so its FLOPs are real)."""
    import numpy as np
    import tvm
    from tvm.script import from_source

    from dlas_predict.measure import peaks

    p, lanes = 4, 16
    ex = tvm.compile(tvm.IRModule({"main": from_source(peaks.fma_source("int8", lanes, p))}),
                     target="llvm")
    rng = np.random.default_rng(0)
    a = rng.integers(-3, 3, (p, lanes), dtype=np.int8)
    b = np.ones((peaks.BROWS, lanes), dtype=np.int8)
    out = tvm.runtime.tensor(np.zeros((p, lanes), dtype=np.int32))
    ex["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    # acc_j = a + j, then ITERS steps of acc = acc * 1 + a; summed over the chains
    acc = a.astype(np.int64)[:, :, None] * (peaks.ITERS + 1) + np.arange(peaks.ACCS)
    np.testing.assert_array_equal(out.numpy(), acc.sum(axis=2))


def test_vnni_dot_kernel_matches_numpy():
    """The int8 dot-product-bound kernel adds four products per lane each step (so its
    operations are real); it runs only where this CPU has AVX-512 VNNI."""
    import numpy as np
    import tvm
    from tvm.script import from_source

    from dlas_predict.measure import peaks

    if not get_device("local", with_target=False).vnni:
        pytest.skip("this CPU has no AVX-512 VNNI")
    p, lanes = 3, 16
    ex = tvm.compile(tvm.IRModule({"main": from_source(peaks.dot_source(lanes, p))}),
                     target=tvm.target.Target(get_device("local").target))
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, (p, 4 * lanes), dtype=np.int8)
    b = rng.integers(-2, 3, (peaks.BROWS, 4 * lanes), dtype=np.int8)
    out = tvm.runtime.tensor(np.zeros((p, lanes), dtype=np.int32))
    ex["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    # chain j starts at a[:, lane] + j; each step adds sum_q a[4 lane + q] * b[it % BROWS, ...]
    prod = (a.astype(np.int64).reshape(p, 1, lanes, 4)
            * b.astype(np.int64).reshape(1, peaks.BROWS, lanes, 4)).sum(axis=3)
    steps = sum(prod[:, it % peaks.BROWS] for it in range(peaks.ITERS))
    start = a[:, :lanes].astype(np.int64)
    want = sum(start + j + steps for j in range(peaks.ACCS))
    np.testing.assert_array_equal(out.numpy(), want)


def test_warm_cache_kernel_sweeps_its_arrays_and_levels_grow():
    """The cache-bandwidth kernel computes a = 0.5 a + b once per sweep (every sweep is
    done), and each level's working set exceeds the one below it."""
    import numpy as np
    import tvm
    from tvm.script import from_source

    from dlas_predict.measure import peaks

    n, cores, sweeps, v = 64, 2, 3, 8
    src = peaks._WARM.format(N=n, O=cores, R=sweeps, I=n // (cores * v), V=v)
    ex = tvm.compile(tvm.IRModule({"main": from_source(src)}), target="llvm")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(n).astype("float32"), rng.standard_normal(n).astype("float32")
    ta = tvm.runtime.tensor(a)
    ex["main"](ta, tvm.runtime.tensor(b))
    want = a.copy()
    for _ in range(sweeps):
        want = want * np.float32(0.5) + b
    np.testing.assert_allclose(ta.numpy(), want, rtol=1e-6)
    sets = peaks.cache_working_sets({"L1d_kb": 32, "L2_kb": 1024, "L3_kb": 32768}, 2)
    assert sets == {"L1": 32 * 1024, "L2": 1024 * 1024, "L3": 16 * 1024 * 1024}
    # an L3 no larger than the cores' L2s together measures nothing new
    assert "L3" not in peaks.cache_working_sets({"L2_kb": 2048, "L3_kb": 2048}, 4)


@pytest.mark.slow
def test_devices_measure_peaks(tmp_path):
    import json

    from typer.testing import CliRunner

    from cli import app

    res = CliRunner().invoke(app, ["devices", "--measure-peaks", "--json", "--save-to",
                                   str(tmp_path / "peaks.json")])
    assert res.exit_code == 0, res.output
    entry = json.loads(res.output[res.output.index("{"):])
    estimate = _isa_estimate()
    for dtype in ("float32", "float16", "int8"):
        assert 0.5 < entry["peak_gflops"][dtype] < 3 * estimate  # a real, plausible figure
    assert 0.5 < entry["mem_bandwidth_gbs"] < 2000
    local = get_device("local", with_target=False)
    # each cache level this machine reports is measured, warm, at a plausible rate
    levels = [lv for lv, key in (("L1", "L1d_kb"), ("L2", "L2_kb"), ("L3", "L3_kb"))
              if key in local.caches]
    assert set(entry["cache_bandwidth_gbs"]) <= set(levels) and entry["cache_bandwidth_gbs"]
    assert all(0.5 < v < 20000 for v in entry["cache_bandwidth_gbs"].values())
    # the int8 dot-product roof where the int8 GEMM kernels use VNNI, above the plain one
    assert (entry["int8_dot_gflops"] is not None) == local.vnni
    if local.vnni:
        assert entry["int8_dot_gflops"] > entry["peak_gflops"]["int8"]
    shipped = json.loads((tmp_path / "peaks.json").read_text())
    assert shipped["machines"][entry["fingerprint"]]["peak_gflops"] == entry["peak_gflops"]
    assert local.source == "measured"


class _PeaksBoard:
    """A runner that answers a roofs task as a board would, without measuring."""

    def __init__(self, ok: bool):
        self.ok, self.tasks, self.board = ok, [], None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def call(self, task):
        from dlas_predict.measure.execution.tasks import WorkerReply

        self.tasks.append(task)
        return WorkerReply(ok=self.ok, error=None if self.ok else "board lost",
                           peak_gflops={"float32": 100.0, "float16": 90.0, "int8": 80.0},
                           mem_bandwidth_gbs=20.0, int8_dot_gflops=300.0,
                           cache_bandwidth_gbs={"L1": 400.0, "L2": 200.0}, details={},
                           tvm_version="0.x")


@pytest.mark.machine
def test_measured_roofs_are_stored_with_the_device_and_read_back(tmp_path, monkeypatch):
    import json

    from dlas_predict.measure.peaks import measure_device_peaks
    from dlas_predict.space.devices import measured_peaks

    monkeypatch.setenv("DLAS_HOME", str(tmp_path / "home"))  # these roofs are made up
    dev = get_device("local", with_target=False)
    board = _PeaksBoard(ok=True)
    peaks, cache = measure_device_peaks(dev, lambda: board, tmp_path / "peaks.json")
    (task,) = board.tasks
    assert task.kind == "peaks" and task.cores == dev.cores
    assert peaks.peak_gflops["float32"] == 100.0 and peaks.method.startswith("measure/peaks")
    assert measured_peaks(dev.fingerprint) == json.loads(open(cache).read())
    shipped = json.loads((tmp_path / "peaks.json").read_text())
    assert shipped["machines"][dev.fingerprint] == peaks.to_dict()
    again = get_device("local", with_target=False)
    assert again.peak_gflops["float32"] == 100.0 and again.int8_dot_gflops == 300.0
    assert again.cache_bandwidth_gbs == {"L1": 400.0, "L2": 200.0}
    assert task.caches == dev.caches and task.vnni == dev.vnni


@pytest.mark.machine
def test_a_failed_roofs_measurement_is_one_error_and_stores_nothing():
    from dlas_predict.measure.peaks import measure_device_peaks
    from dlas_predict.space.devices import measured_peaks

    dev = get_device("local", with_target=False)
    before = measured_peaks(dev.fingerprint)
    with pytest.raises(DeviceError, match="measuring the roofs failed: board lost"):
        measure_device_peaks(dev, lambda: _PeaksBoard(ok=False))
    assert measured_peaks(dev.fingerprint) == before


def _isa_estimate() -> float:
    """The ISA x clock estimate of this CPU's float32 peak (an upper bound, roughly)."""
    from dlas_predict.space import devices as D

    model, flags, mhz = D._cpuinfo()
    simd = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    return D.local_cores() * (mhz or 4000) / 1000 * simd / 32 * 2 * 2


# ---- profiles of this CPU -----------------------------------------------------------------
@pytest.mark.machine
def test_profiles_are_this_cpu_with_their_own_code_generation_threads_and_fingerprint():
    from dlas_predict.space.devices import is_profile_name, profile_names

    names = profile_names()
    local = get_device("local")
    assert names and all(is_profile_name(n) for n in names)
    assert "local-native-1t" in names or local.cores == 1
    fps = {local.fingerprint}
    for name in names:
        dev = get_device(name)
        assert dev.profile_of == "local" and dev.measured_here and dev.kind == "cpu"
        assert dev.target["num-cores"] == dev.cores == int(name.rsplit("-", 1)[1][:-1])
        assert "profile of this machine" in dev.description
        fps.add(dev.fingerprint)
    assert len(fps) == len(names) + 1  # every profile is a device of its own
    if "local-avx2-1t" in names:
        assert get_device("local-avx2-1t").target["mcpu"] == "x86-64-v3"
    # AVX-512 VNNI (the int8 GEMM's) where the CPU has it and the code may use it
    assert local.vnni == ("avx512_vnni" in local.isa_flags)
    for name in names:
        dev = get_device(name)
        assert dev.vnni == (local.vnni and "native" in name)


@pytest.mark.machine
def test_a_profile_measures_with_its_own_isa_and_threads():
    """The x86-64-v2 profile's kernels hold no AVX instruction; local's may."""
    from dlas_predict.space.devices import profile_names

    if "local-sse42-1t" not in profile_names():
        pytest.skip("not an x86-64 machine with SSE4.2")
    import tvm

    from dlas_predict.measure.kernels.build import build_kernel
    from dlas_predict.measure.kernels.spec import KernelSpec
    from dlas_predict.measure.kernels.knobs import resolve_knobs
    from dlas_predict.space.config import ConvSpec, DType, Variant

    spec, v = ConvSpec.parse("C=16,H=8,W=8,K=16,R=3,S=3,stride=1,pad=1"), Variant("gemm",
                                                                                 "dense")
    ks = KernelSpec(conv=spec, algorithm=v.algorithm, sparse=False, dtype=DType.FLOAT32,
                    knobs=resolve_knobs(spec, v))
    asm = build_kernel(ks, tvm.target.Target(get_device("local-sse42-1t").target)).mod \
        .inspect_source("asm")
    assert "%ymm" not in asm and "%zmm" not in asm and "%xmm" in asm


# ---- devices the user adds ----------------------------------------------------------------
ADD = ("devices", "add", "myboard", "--kind", "cpu", "--target",
       '{"kind":"llvm","mtriple":"aarch64-linux-gnu","mcpu":"cortex-a72"}', "--cores", "4",
       "--peak-gflops", "40", "--bandwidth-gbs", "12.8")


@pytest.mark.machine
def test_devices_add_then_remove():
    from conftest import run_cli

    r = run_cli(*ADD, "--rpc-key", "rk")
    assert r.exit_code == 0, r.output
    dev = get_device("myboard")
    assert dev.origin == "user" and dev.source == "spec" and dev.rpc_key == "rk"
    assert dev.peak_gflops == {"float32": 40.0} and dev.mem_bandwidth_gbs == 12.8
    listed = run_cli("devices", "--json")
    assert "myboard" in {d["name"] for d in __import__("json").loads(listed.output)}
    assert run_cli("devices", "remove", "myboard").exit_code == 0
    with pytest.raises(DeviceError, match="unknown device 'myboard'"):
        get_device("myboard")


@pytest.mark.parametrize("change,needle", [
    ({"--target": "{not json"}, "not JSON"),
    ({"--target": '{"kind":"nosuchkind"}'}, "llvm target"),
    ({"--target": '{"kind":"llvm","mcpu":7}'}, "TVM rejects the target"),
    ({"--kind": "fpga"}, "'fpga' is not one of 'cpu', 'gpu'"),
    ({"--cores": "0"}, "--cores must be a positive"),
    ({"--peak-gflops": "-1"}, "--peak-gflops must be a positive"),
    ({"--bandwidth-gbs": "0"}, "--bandwidth-gbs must be a positive"),
    ({2: "xavier"}, "shipped device"),
    ({2: "local-avx2-1t"}, "this machine or one of its profiles"),
    ({2: "bad name!"}, "letters, digits"),
])
def test_devices_add_refuses_bad_input_with_one_clean_error(change, needle):
    from conftest import assert_clean_error, run_cli

    args = list(ADD)
    for k, v in change.items():
        if isinstance(k, int):
            args[k] = v
        else:
            args[args.index(k) + 1] = v
    assert_clean_error(run_cli(*args), needle)


def test_devices_remove_refuses_a_shipped_or_unknown_device():
    from conftest import assert_clean_error, run_cli

    assert_clean_error(run_cli("devices", "remove", "xavier"), "not a user device")
    assert_clean_error(run_cli("devices", "remove", "nope"), "no user device 'nope'")


# ---- cross-compilation ----------------------------------------------------------------------
@pytest.mark.slow
def test_every_kernel_kind_cross_compiles_to_an_aarch64_shared_library(tmp_path):
    """Direct, gemm and spatial pack, dense in float32, float16 and int8, and CSR: each
    built here for the HiKey 970's Cortex-A73 and linked with Debian's cross g++."""
    import shutil
    import subprocess

    if shutil.which("aarch64-linux-gnu-g++") is None:
        if __import__("os").environ.get("CI") == "true":
            pytest.fail("aarch64-linux-gnu-g++ is missing: setup.sh installs it")
        pytest.skip("no aarch64 cross compiler (setup.sh installs it as root)")
    import tvm

    from dlas_predict.measure.kernels.build import build_kernel
    from dlas_predict.measure.kernels.spec import KernelSpec
    from dlas_predict.measure.kernels.knobs import resolve_knobs
    from dlas_predict.measure.execution.remote import export_shared
    from dlas_predict.space.config import ConvSpec, DType, Variant

    target = get_device("hikey970-cpu").target
    spec = ConvSpec.parse("C=8,H=8,W=8,K=8,R=3,S=3,stride=1,pad=1")
    cases = [(alg, comp) for alg in ("direct", "gemm", "spatial_pack")
             for comp in ("dense", "float16", "int8", "weight_pruning")]
    for alg, comp in cases:
        v = Variant(alg, comp, 0.9) if comp == "weight_pruning" else Variant(alg, comp)
        ks = KernelSpec(conv=spec, algorithm=v.algorithm, sparse=v.sparse, dtype=v.dtype,
                        knobs=resolve_knobs(spec, v))
        path = export_shared(build_kernel(ks, tvm.target.Target(target)),
                             str(tmp_path / f"{alg}-{comp}.so"), target)
        head = subprocess.run(["readelf", "-h", path], capture_output=True, text=True).stdout
        assert "AArch64" in head and "DYN" in head, (alg, comp, head)


# ---- the tests on a CPU of a lower ISA ---------------------------------------------------
@pytest.mark.machine
def test_a_forced_isa_level_is_this_cpu_at_that_level_or_a_clean_error(monkeypatch):
    """``DLAS_FORCE_ISA`` makes ``local`` a CPU of a lower x86-64 level: that level's flags,
    vector width, fingerprint and code generation; a level this CPU cannot run, or no
    level at all, is one clear error."""
    import platform

    from dlas_predict.space import devices as D

    _, flags, _ = D._cpuinfo()
    if platform.machine() not in ("x86_64", "AMD64") or "avx2" not in flags:
        pytest.skip("forcing AVX2 needs an x86-64 CPU with AVX2")
    native = get_device("local", with_target=False)
    try:
        monkeypatch.setenv(D.FORCE_ISA_ENV, "avx2")
        D._cpuinfo.cache_clear()
        forced = get_device("local", with_target=False)
        assert forced.simd_bits == 256 and not forced.vnni
        assert set(forced.isa_flags) <= {"sse4_2", "avx", "avx2", "fma", "f16c"}
        assert (forced.fingerprint == native.fingerprint) == (native.simd_bits == 256
                                                              and not native.vnni)
        # the key holds the CPU's family and model: two generations alike in name, forced
        # alike, are two machines (at its own level, unless its shipped key has none)
        model, own, _, _ = D._native_cpuinfo()
        cut = {f for f in own if f in D._FINGERPRINT_FLAGS} - {
            "sse4_2", "avx", "avx2", "fma", "f16c"}
        kept = D._fingerprint(model, own) in D._KEYS_WITHOUT_CPU_ID
        monkeypatch.setattr(D, "_cpu_id", lambda: "0/0")
        assert (D.local_fingerprint() != forced.fingerprint) == (bool(cut) or not kept)
        monkeypatch.setenv(D.FORCE_ISA_ENV, "avx9")
        D._cpuinfo.cache_clear()
        with pytest.raises(DeviceError, match="allowed: sse42, avx2, native"):
            D._cpuinfo()
    finally:
        monkeypatch.undo()  # the level this process ran with, if any
        D._cpuinfo.cache_clear()
    back = get_device("local", with_target=False)
    assert (back.fingerprint, back.simd_bits, back.isa_flags) == (
        native.fingerprint, native.simd_bits, native.isa_flags)


@pytest.mark.slow  # the machine-reading modules' tests again, in a process of their own
def test_the_tests_that_read_this_machine_pass_on_an_avx2_only_cpu():
    """The tests that ask what this machine is (its devices, profiles and the models and
    maps chosen for it) pass where ``local`` is an AVX2-only CPU, as on a Zen 3: run again
    with ``DLAS_FORCE_ISA=avx2`` on a CPU with more (on an AVX2-only one the suite itself
    is that run)."""
    import subprocess

    from conftest import ROOT
    from dlas_predict.space import devices as D

    local = get_device("local", with_target=False)
    if local.simd_bits != 512:
        pytest.skip("this CPU is no wider than AVX2: the suite already ran as on one")
    env = {**os.environ, D.FORCE_ISA_ENV: "avx2"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "machine",
                          "-p", "no:cacheprovider", "tests"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout
