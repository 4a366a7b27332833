"""The benchmarks' scoring: what a rescore compares a measurement with."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))


def _row(*cands):
    return {"family": "cnn plain", "name": "n", "candidates": list(cands)}


def test_a_rescore_scores_a_per_layer_build_only_against_a_prediction_of_its_layers():
    import bench_unseen as bu

    direct = {"config": "dense direct", "backend": "tvm", "predicted_ms": 1.0,
              "measured_ms": 2.0, "note": None}
    built = [["direct", False], ["gemm", False]]
    per_layer = {"config": "dense per_layer", "backend": "tvm", "predicted_ms": 1.0,
                 "measured_ms": 4.0, "note": None, "layers": built}
    unrecorded = {**per_layer, "config": "int8 per_layer"}
    del unrecorded["layers"]
    ort = {"config": "dense onnxruntime", "backend": "onnxruntime", "predicted_ms": 1.0,
           "measured_ms": 1.0, "note": None}
    row = _row(direct, per_layer, unrecorded, ort)

    pred = {("tvm", "dense direct"): (1.8, None), ("tvm", "dense per_layer"): (3.0, built),
            ("tvm", "int8 per_layer"): (3.0, built),
            ("onnxruntime", "dense onnxruntime"): (1.5, None)}
    same = bu._rescored(row, pred)
    assert [(c["config"], c["predicted_ms"]) for c in same["now"]] == [
        ("dense direct", 1.8), ("dense per_layer", 3.0), ("dense onnxruntime", 1.5)]
    assert [c["predicted_ms"] for c in same["then"]] == [1.0, 1.0, 1.0]
    assert same["skipped"] == 1  # the int8 build's layers are not in the file
    # adapting a map of our kernels: onnxruntime's runs are left out
    assert [c["config"] for c in bu._rescored(row, pred, False)["now"]] == [
        "dense direct", "dense per_layer"]

    other = [["gemm", False], ["gemm", False]]
    moved = bu._rescored(row, {("tvm", "dense direct"): (1.8, None),
                               ("tvm", "dense per_layer"): (3.0, other)})
    assert [c["config"] for c in moved["now"]] == ["dense direct"]
    assert moved["skipped"] == 1
    s = bu.summarise([{"candidates": same["now"]}])
    assert s["n"] == 2 and s["within_10"] == 0.5  # 1.8 / 2.0 is within 10 %, 3 / 4 is not
    s = bu.summarise([{"candidates": same["now"]}], "onnxruntime")
    assert s["n"] == 1 and s["within_10"] == 0.0  # 1.5 / 1.0




def test_the_unseen_kinds_of_the_accuracy_check_are_matrix_networks_of_ten_classes(tmp_path):
    """Each network bench_accuracy --unseen trains takes its input and gives ten logits,
    and is read as a matrix network (its weights mostly in matrix layers)."""
    import torch

    import bench_accuracy as ba
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network
    from dlas_predict.networks.matrix import is_matrix_network

    for name, (factory, shape, epochs) in ba.unseen_networks().items():
        net = factory(shape[0], shape[1]).eval()
        assert net(torch.zeros(2, *shape)).shape == (2, 10), name
        assert epochs > 0
    assert is_matrix_network(read_network(zoo.export_model(net, shape, tmp_path / "n.onnx")))
