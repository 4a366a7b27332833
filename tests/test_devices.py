import pytest

from dlas_predict.space.devices import device_names, get_device, local_fingerprint
from dlas_predict.errors import DeviceError


def test_registry_has_the_study_and_tophub_devices():
    names = device_names()
    for name in ("local", "i7-8700", "hikey970-cpu", "hikey970-gpu", "xavier-cpu", "xavier",
                 "rpi3b", "rk3399-cpu", "rk3399-mali", "titanx", "1080ti", "jetson-nano"):
        assert name in names
    x = get_device("xavier")
    assert x.kind == "gpu" and x.target["arch"] == "sm_72" and x.peak_gflops["float32"] > 0


def test_unknown_device_lists_known_ones():
    with pytest.raises(DeviceError, match="known devices: local, i7-8700"):
        get_device("pentium-ii")


def test_local_is_detected_with_a_specific_target_and_stable_fingerprint():
    local = get_device("local")
    assert local.target["kind"] == "llvm" and local.target.get("mcpu")
    assert local.target["mcpu"] != "generic" and local.target["num-cores"] == local.cores
    assert local.fingerprint == local_fingerprint() == get_device("local").fingerprint
    assert local.cores >= 1 and local.source in ("estimate", "measured")
    # measured roofs come with a bandwidth; an estimate has none
    assert (local.mem_bandwidth_gbs is not None) == (local.source == "measured")


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
    shipped = json.loads((tmp_path / "peaks.json").read_text())
    assert shipped["machines"][entry["fingerprint"]]["peak_gflops"] == entry["peak_gflops"]
    assert get_device("local", with_target=False).source == "measured"


def _isa_estimate() -> float:
    """The ISA x clock estimate of this CPU's float32 peak (an upper bound, roughly)."""
    from dlas_predict.space import devices as D

    model, flags, mhz = D._cpuinfo()
    simd = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    return D.local_cores() * (mhz or 4000) / 1000 * simd / 32 * 2 * 2
