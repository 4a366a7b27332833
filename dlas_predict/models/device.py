"""A device's trained models as one record: its layer and network models and what they were
trained on, loaded from the device's model folder."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dlas_predict.errors import DlasError
from dlas_predict.space.devices import Device, model_dir


@dataclass(frozen=True)
class DeviceModels:
    """The models that price one device: the layer model, the network model (the sum of the
    conv layers for a device measured kernel by kernel only), and ``info``: the folder, the
    device and fingerprint they were trained on, the roofs their features saw, and how many
    kernels and whole networks they learned from."""

    layer: Any
    network: Any
    info: dict[str, Any]
    #: the network model of matrix networks (MLPs, transformers), where one was trained
    matrix_network: Any = None


def load_models(device_name: str, directory: Path | None = None) -> DeviceModels:
    """The layer and network models for ``device_name`` (its shipped folder on this machine,
    :func:`~dlas_predict.space.devices.model_dir`, unless ``directory``); a clear error when
    there are none."""
    from dlas_predict.models.costmodel import LayerCostModel
    from dlas_predict.models.netmodel import MATRIX_NETWORK, NetworkCostModel

    directory = Path(directory) if directory else model_dir(device_name)
    if not (directory / "layer.json").is_file():
        hint = ("collect a corpus on this machine with `dlas-predict collect --network "
                "zoo:resnet18-cifar --whole-network --store S` (repeat for more networks), "
                "then `dlas-predict train --store S`" if device_name == "local" else
                f"there is no corpus for {device_name!r}: its kernels must be measured on "
                f"the device itself (`dlas-predict collect --device {device_name} ...` once "
                f"RPC reaches it), then `dlas-predict train --device {device_name}`")
        raise DlasError(f"no cost model for device {device_name!r} in {directory}: {hint}")
    layer = LayerCostModel.load(directory)
    if (directory / "network.json").is_file():
        network = NetworkCostModel.load(directory)
    else:  # a device measured kernel by kernel only (e.g. a GPU through a bundle)
        from dlas_predict.models.netmodel import ConvSumModel

        network = ConvSumModel()
    info = {"directory": str(directory), "trained_on": layer.meta_.get("device"),
            "device_fingerprint": layer.meta_.get("device_fingerprint"),
            "corpus_fingerprint": layer.meta_.get("corpus_fingerprint"),
            "device_roofs": layer.meta_.get("device_roofs"),
            "kernels": layer.meta_.get("n_train"), "whole_networks": network.meta_.get("n_train"),
            "tuned_kernels": layer.meta_.get("tuned_kernels", 0)}
    matrix = None
    if (directory / f"{MATRIX_NETWORK}.json").is_file():
        matrix = NetworkCostModel.load(directory, MATRIX_NETWORK)
    return DeviceModels(layer, network, info, matrix)


def features_device(dev: Device, info: dict[str, Any]) -> Device:
    """``dev`` as a layer model's features see it: with the roofs the model was trained
    with (its sidecar's), where they differ from the registry's."""
    roofs = info.get("device_roofs")
    if roofs and (roofs["peak_gflops"] != dev.peak_gflops
                  or roofs["mem_bandwidth_gbs"] != dev.mem_bandwidth_gbs):
        return replace(dev, peak_gflops=dict(roofs["peak_gflops"]),
                       mem_bandwidth_gbs=roofs["mem_bandwidth_gbs"])
    return dev
