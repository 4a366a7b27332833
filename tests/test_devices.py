import pytest

from dlas_predict.devices import device_names, get_device, local_fingerprint
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
    assert local.cores >= 1 and local.source == "estimate"
