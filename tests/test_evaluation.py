"""The whole-network records the network model learns from: stored summaries computed
again where a field is newer, records superseded by probed ones or by the current engine's,
a carried engine build, and channel-pruning records paired with the layers they timed."""
import dataclasses
import json
from pathlib import Path

import pytest

from dlas_predict.space.config import ConvSpec
from dlas_predict.space.devices import get_device


def test_a_stored_summary_without_a_newer_field_is_computed_again(tmp_path):
    """Whole-network rows stored before a summary field existed stay usable: a generated
    network is built again from its name (its weights are seeded by it)."""
    from dataclasses import asdict

    from dlas_predict.models.evaluation import stored_summary
    from dlas_predict.networks.generate import generate
    from dlas_predict.networks.summary import NetworkSummary
    from dlas_predict.networks.graph import read_network

    (m,) = generate("cnn", ["block=inverted", "kernels=8", "layers=2", "activation=silu",
                            "se=1"], tmp_path)
    fresh = NetworkSummary.of(read_network(m.path))
    assert fresh.broadcast_bytes > 0
    old = {k: v for k, v in asdict(fresh).items() if k != "broadcast_bytes"}
    assert stored_summary(m.path.stem, json.dumps(old)) == fresh
    assert stored_summary(m.path.stem, json.dumps(asdict(fresh))) == fresh
    # neither a zoo network nor a name the generator writes: unusable, not a guess
    assert stored_summary("my-net", json.dumps(old)) is None
    # another network's summary under this name (a channel-pruned build, its zeroed filters
    # removed): not replaced by the named network's
    removed = {**old, "nonconv_bytes": old["nonconv_bytes"] // 2}
    assert stored_summary(m.path.stem, json.dumps(removed)) is None
    # only the int8-only fields missing, of a network not built again by name: they are 0
    # (its other fields serve every model; onnxruntime's int8 rows of it are left out)
    from dlas_predict.models.evaluation import INT8_ONLY

    assert fresh.qdq_float_conv_macs > 0
    older = {k: v for k, v in asdict(fresh).items() if k not in INT8_ONLY}
    kept = stored_summary("my-net", json.dumps(older))
    assert kept == NetworkSummary(**older) and kept.qdq_float_conv_macs == 0
    assert stored_summary(m.path.stem, json.dumps(older)) == fresh


def test_a_nasbench201_cell_s_summary_is_computed_again_from_its_name(tmp_path):
    """A cell's name is its architecture's code: a row stored before a summary field
    existed is rebuilt from it, and a stored summary that disagrees is unusable."""
    from dataclasses import asdict

    from dlas_predict.models.evaluation import stored_summary
    from dlas_predict.networks.summary import NetworkSummary
    from dlas_predict.networks import nasbench201 as nb
    from dlas_predict.networks.graph import read_network

    (path,) = nb.generate([nb.parse_arch("p3s1np")], tmp_path)
    fresh = NetworkSummary.of(read_network(path))
    assert fresh.pool_window_elems > 0
    old = {k: v for k, v in asdict(fresh).items() if k != "pool_window_elems"}
    assert stored_summary(path.stem, json.dumps(old)) == fresh
    # another network's summary lacking a field that does not scale with non-conv bytes
    other = {k: v for k, v in old.items() if k != "exp_elems"}
    assert stored_summary(path.stem, json.dumps({**other, "layers": old["layers"] + 1})) is None
    assert stored_summary("nasbench201-p3s1nx", json.dumps(old)) is None  # no such code
    # the cell's channel-pruned build, stored before the field: its pools' window reads are
    # the named cell's, scaled by the two's non-conv bytes
    removed = {**old, "nonconv_bytes": old["nonconv_bytes"] // 2}
    assert stored_summary(path.stem, json.dumps(removed)).pool_window_elems == \
        round(fresh.pool_window_elems * (old["nonconv_bytes"] // 2) / old["nonconv_bytes"])


def test_an_unprobed_whole_network_record_is_superseded_by_a_probed_one():
    """A configuration timed again with the probes may have picked another per-layer plan (a
    record of its own): the old plan's unprobed record no longer counts; an unprobed record
    with no probed one, and every probed one, stay."""
    from dlas_predict.measure.networks.plans import NetworkMeasurement
    from dlas_predict.models.evaluation import drop_superseded

    def rec(config, plan, slowdown, network="n"):
        return NetworkMeasurement(key=f"{network}{config}{plan}", device="local",
                                  fingerprint="f", network=network, config=config,
                                  algorithm="per_layer", plan=plan, dtype="float32",
                                  run_secs=[1e-3], slowdown=slowdown)

    old, new = rec("channel_pruning@0.5", "a", None), rec("channel_pruning@0.5", "b", 1.01)
    alone = rec("weight_pruning@0.5", "a", None)
    other_net = rec("channel_pruning@0.5", "a", None, network="m")
    twice = [rec("dense", "a", 1.0), rec("dense", "b", 1.2)]
    kept = drop_superseded([old, new, alone, other_net, *twice])
    assert kept == [new, alone, other_net, *twice]
    assert drop_superseded([]) == []


def test_a_record_of_an_older_engine_counts_until_the_current_engine_measures_it():
    """Records of the engine that ran each conv's epilogue separately train the network
    model until the same configuration is measured again; onnxruntime's keep their version
    and their keys."""
    from dlas_predict.measure.networks.plans import (NETWORK_VERSION, ONNXRUNTIME,
                                                     ONNXRUNTIME_VERSION, PREVIOUS_NETWORK_VERSIONS,
                                                     NetworkMeasurement, engine_version)
    from dlas_predict.models.evaluation import drop_older_engines

    old = PREVIOUS_NETWORK_VERSIONS[0]

    def rec(config, version, algorithm="spatial_pack", tuned=True):
        return NetworkMeasurement(key=f"{config}{version}{algorithm}", device="local",
                                  fingerprint="f", network="n", config=config,
                                  algorithm=algorithm, plan="[]", dtype="float32",
                                  run_secs=[1e-3], version=version,
                                  tuned_layers=[0] if tuned else None)

    stale, fresh = rec("dense/tuned", old), rec("dense/tuned", NETWORK_VERSION)
    only_old = rec("int8/tuned", old)
    ort = rec("dense", engine_version(ONNXRUNTIME), ONNXRUNTIME)
    assert drop_older_engines([stale, fresh, only_old, ort]) == [fresh, only_old, ort]
    assert rec("dense", "").to_row()["kernels_version"] == NETWORK_VERSION
    assert rec("dense", "", tuned=False).to_row()["kernels_version"] == \
        engine_version("spatial_pack")
    assert NetworkMeasurement.from_row(stale.to_row()).version == old
    assert NETWORK_VERSION not in PREVIOUS_NETWORK_VERSIONS
    for algorithm in ("direct", "gemm", "spatial_pack", "per_layer"):
        assert engine_version(algorithm, tuned=True) == NETWORK_VERSION
    assert engine_version(ONNXRUNTIME) == ONNXRUNTIME_VERSION
    assert engine_version(ONNXRUNTIME, tuned=True) == ONNXRUNTIME_VERSION
    # every build of ours takes the newest engine's version (the unchanged builds of the
    # carried engines count as today's through their layers, not their key)
    for algorithm in ("direct", "gemm", "spatial_pack", "per_layer"):
        assert engine_version(algorithm) == NETWORK_VERSION != old
    direct = rec("dense", engine_version("direct"), "direct", tuned=False)
    old_direct = rec("dense", old, "direct", tuned=False)
    untuned = rec("int8", engine_version("spatial_pack"), tuned=False)
    assert drop_older_engines([fresh, direct, old_direct, untuned]) == [fresh, direct, untuned]
    # an untuned record of the current engine replaces an older one of its configuration
    older = rec("int8", PREVIOUS_NETWORK_VERSIONS[-1], tuned=False)
    assert drop_older_engines([older, untuned]) == [untuned]


def test_a_gpu_engines_network_records_are_current_and_train_the_network_model():
    """Whole networks timed on a GPU carry the GPU engine's version: current, channel-pruned
    ones built with their filters removed, and read by the network model's training rows."""
    from dlas_predict.measure.networks.plans import (CHANNEL_REMOVAL_VERSION, GPU_NETWORK_VERSION,
                                                     NETWORK_VERSION, NetworkMeasurement,
                                                     removes_channels)
    from dlas_predict.models.evaluation import current_engine, drop_older_engines

    assert removes_channels(GPU_NETWORK_VERSION) and removes_channels(NETWORK_VERSION)
    assert removes_channels(CHANNEL_REMOVAL_VERSION) and not removes_channels("4")
    assert not removes_channels("g0")
    gpu = NetworkMeasurement(key="k", device="h200", fingerprint="f", network="n",
                             config="dense", algorithm="direct", plan="[]", dtype="float32",
                             run_secs=[1e-3], version=GPU_NETWORK_VERSION)
    assert current_engine(gpu) and drop_older_engines([gpu]) == [gpu]


@pytest.mark.slow  # trains on a shipped snapshot
def test_the_shipped_gpu_corpus_trains_a_network_model_from_its_whole_networks(tmp_path):
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.models.evaluation import load_corpus, whole_rows

    store = tmp_path / "h200.sqlite"
    with CorpusStore(store) as db:
        db.import_snapshot(Path(__file__).resolve().parent.parent / "datasets" / "corpus"
                           / "h200.parquet")
    rows = whole_rows(load_corpus(store, "h200"), store)
    networks = {r.network for r in rows}
    assert len(rows) >= 200 and {"resnet18-cifar", "resnet50"} <= networks
    assert any(n.startswith("cnn_") for n in networks)  # generated networks too


def test_once_enough_networks_are_timed_by_the_current_engine_older_builds_are_left_out():
    from dlas_predict.measure.networks.plans import (NETWORK_VERSION, ONNXRUNTIME,
                                                     PREVIOUS_NETWORK_VERSIONS, NetworkMeasurement,
                                                     engine_version)
    from dlas_predict.models.evaluation import MIN_CURRENT_ENGINE_NETWORKS, drop_older_engines

    def rec(network, version, algorithm="gemm"):
        return NetworkMeasurement(key=f"{network}{version}{algorithm}", device="local",
                                  fingerprint="f", network=network, config="dense",
                                  algorithm=algorithm, plan="[]", dtype="float32",
                                  run_secs=[1e-3], version=version)

    old = PREVIOUS_NETWORK_VERSIONS[0]
    stale = rec("elsewhere", old)
    ort = rec("elsewhere", engine_version(ONNXRUNTIME), ONNXRUNTIME)
    fresh = [rec(f"n{i}", NETWORK_VERSION) for i in range(MIN_CURRENT_ENGINE_NETWORKS)]
    # one network short: the older engine's build of another network still counts
    assert drop_older_engines([stale, ort, *fresh[1:]]) == [stale, ort, *fresh[1:]]
    # enough: only today's engine (and onnxruntime, whose version is its own) is kept
    assert drop_older_engines([stale, ort, *fresh]) == [ort, *fresh]
    # onnxruntime's runs do not count as networks our engine has timed
    ort_only = [rec(f"n{i}", engine_version(ONNXRUNTIME), ONNXRUNTIME)
                for i in range(MIN_CURRENT_ENGINE_NETWORKS)]
    assert stale in drop_older_engines([stale, *ort_only])


@pytest.mark.parametrize("simd_bits", [512, 256], ids=["avx512", "avx2"])
@pytest.mark.slow
def test_a_carried_engine_build_todays_engine_builds_the_same_way_counts_as_today(simd_bits):
    """Engine 11 changed only direct and GEMM layers whose filter count has no block of at
    least four, engine 12 only spatial pack layers whose block of filters was a divisor of no
    whole vector, engine 13 only networks with a sigmoid, engine 15 only networks with an
    erf or a softmax, engine 16 only float32 pointwise GEMM layers and the tiles of
    depthwise direct layers of small maps, engine 17 only networks with a concatenation
    and spatial pack rows it splits evenly: the carried engines' records of other builds stay
    in, even once today's engine has timed enough networks to leave older builds out. The
    device is a CPU of each vector width, whatever this machine is: the spatial pack's 124
    filters were reblocked on 16 lanes only."""
    from dlas_predict.measure.networks.plans import (CARRIED_VERSIONS, NETWORK_VERSION,
                                                     NetworkMeasurement, rebuilt_since)
    from dlas_predict.models.evaluation import (MIN_CURRENT_ENGINE_NETWORKS, drop_older_engines,
                                                unchanged_builds)

    assert NETWORK_VERSION not in CARRIED_VERSIONS
    even = "C=16,H=8,W=8,K=64,R=3,S=3,stride=1,pad=1"
    odd = "C=16,H=8,W=8,K=59,R=3,S=3,stride=1,pad=1"
    reblocked = "C=16,H=8,W=8,K=124,R=3,S=3,stride=1,pad=1"  # 31 a block; now 32, padded
    layers_of = {(net, "dense"): [{"network": net, "config": "dense", "layer_index": 0,
                                   "conv": conv, "compression": "dense", "ratio": 0.0}]
                 for net, conv in (("even", even), ("odd", odd), ("reblocked", reblocked))}

    def rec(network, version, algorithm="direct", sparse=False, i=0, exp_elems=0):
        return NetworkMeasurement(key=f"{network}{version}{algorithm}{sparse}{i}",
                                  device="local", fingerprint="f", network=network,
                                  config="dense", algorithm=algorithm,
                                  plan=f'[["{algorithm}", {str(sparse).lower()}]]',
                                  dtype="float32", run_secs=[1e-3], version=version,
                                  summary=json.dumps({"exp_elems": exp_elems,
                                                      "concat_inputs": 0}))

    cpu = dataclasses.replace(get_device("local", with_target=False), simd_bits=simd_bits,
                              isa_flags=())
    unchanged = unchanged_builds(layers_of, cpu)
    kept, rebuilt = rec("even", "11"), rec("odd", "10")
    csr = rec("odd", "10", "gemm", sparse=True)
    # engine 11's build of the odd layer is today's; 12 changed no direct layer
    odd11 = rec("odd", "11")
    pack_kept = rec("odd", "10", "spatial_pack")      # 59 filters: two padded vectors in 11
    pack_rebuilt = rec("reblocked", "11", "spatial_pack")
    # a network with a sigmoid (its exp-like ops compute elements) or no known summary: 13
    # builds it otherwise
    gated = rec("even", "12", exp_elems=64)
    unknown = dataclasses.replace(rec("even", "12"), summary=None)
    reblocked_here = simd_bits == 512
    for m in (kept, csr, odd11, pack_kept, rec("even", "12"),
              *(() if reblocked_here else (pack_rebuilt,))):
        assert unchanged(m), m.network
    for m in (rebuilt, gated, unknown, *((pack_rebuilt,) if reblocked_here else ())):
        assert not unchanged(m), m.network
    fresh = [rec(f"n{i}", NETWORK_VERSION, i=i) for i in range(MIN_CURRENT_ENGINE_NETWORKS)]
    assert drop_older_engines([kept, rebuilt, csr, pack_rebuilt, *fresh], unchanged) == [
        kept, csr, *(() if reblocked_here else (pack_rebuilt,)), *fresh]
    # without the check every carried build is left out
    assert drop_older_engines([kept, rebuilt, csr, *fresh]) == fresh
    # an engine older than the carried ones is never today's
    older = rec("even", "9")
    assert drop_older_engines([older, *fresh], unchanged) == fresh
    # 59 filters pad on every vector width; 64 on none (a network of no exp-like op)
    NONE = {"exp_elems": 0, "concat_inputs": 0}
    for bits in (128, 256, 512):
        assert rebuilt_since("10", [["gemm", False]], [ConvSpec.parse(odd)], bits, NONE)
        assert not rebuilt_since("11", [["gemm", False]], [ConvSpec.parse(odd)], bits, NONE)
        assert not rebuilt_since("10", [["gemm", False]], [ConvSpec.parse(even)], bits, NONE)
        assert rebuilt_since("12", [["gemm", False]], [ConvSpec.parse(even)], bits,
                             {"exp_elems": 1})
    # 124 filters: 31 a block on 16 lanes (reblocked), 2-vector blocks of 16 on 8 lanes (kept)
    plan = [["spatial_pack", False]]
    assert rebuilt_since("11", plan, [ConvSpec.parse(reblocked)], 512, NONE)
    assert not rebuilt_since("11", plan, [ConvSpec.parse(reblocked)], 256, NONE)
    assert not rebuilt_since("11", [["spatial_pack", True]], [ConvSpec.parse(reblocked)], 512,
                             NONE)
    # an int8 network's ungrouped GEMM layers run on VNNI where the CPU has it
    from dlas_predict.space.config import DType

    gemm, grouped = ConvSpec.parse(even), ConvSpec.parse("C=8,H=8,W=8,K=8,R=3,S=3,groups=8")
    assert rebuilt_since("13", [["gemm", False]], [gemm], 512, NONE, DType.INT8, True)
    assert rebuilt_since("13", [["gemm", False]], [gemm], 512, NONE, None, True)  # dtype unknown
    for plan, convs, dtype, vnni in (([["gemm", False]], [gemm], DType.INT8, False),
                                     ([["gemm", False]], [gemm], DType.FLOAT32, True),
                                     ([["direct", False]], [gemm], DType.INT8, True),
                                     ([["gemm", False]], [grouped], DType.INT8, True)):
        assert not rebuilt_since("13", plan, convs, 512, NONE, dtype, vnni)
    # a network with an erf or a softmax (a transformer's): 15 builds it otherwise; a
    # summary of the engine before the count, or of a sigmoid alone, not
    for summary, rebuilt in (({**NONE, "erf_softmax_elems": 64, "exp_elems": 64}, True),
                             ({**NONE, "erf_softmax_elems": 0, "exp_elems": 64}, False),
                             ({**NONE, "exp_elems": 64}, False), (None, True)):
        assert rebuilt_since("14", [["gemm", False]], [gemm], 512, summary) is rebuilt
    # a float32 network's pointwise GEMM layers: 16 runs them on overlapping register tiles,
    # on every vector width; a 3x3 GEMM, a direct layer, an int8 network not
    pointwise = ConvSpec.parse("C=16,H=7,W=7,K=24,R=1,S=1,stride=1,pad=0")
    for bits in (128, 256, 512):
        assert rebuilt_since("15", [["gemm", False]], [pointwise], bits, NONE, DType.FLOAT32)
        assert rebuilt_since("15", [["gemm", False]], [pointwise], bits, NONE)  # dtype unknown
        for plan, convs, dtype in (([["gemm", False]], [gemm], DType.FLOAT32),
                                   ([["direct", False]], [pointwise], DType.FLOAT32),
                                   ([["gemm", True]], [pointwise], DType.FLOAT32),
                                   ([["gemm", False]], [pointwise], DType.INT8)):
            assert not rebuilt_since("15", plan, convs, bits, NONE, dtype)
    # a depthwise direct layer of a small map: its tiles changed in 16, at any dtype; one of
    # a large map kept them
    small = ConvSpec.parse("C=96,H=4,W=4,K=96,R=3,S=3,stride=1,pad=1,groups=96")
    large = ConvSpec.parse("C=96,H=32,W=32,K=96,R=3,S=3,stride=1,pad=1,groups=96")
    for dtype in (DType.FLOAT32, DType.INT8):
        assert rebuilt_since("15", [["direct", False]], [small], 512, NONE, dtype)
        assert not rebuilt_since("15", [["direct", False]], [large], 512, NONE, dtype)
    assert not rebuilt_since("15", [["spatial_pack", False]], [small], 512, NONE)
    # a network with a concatenation: 17 schedules it otherwise, whatever its layers; a
    # summary stored before the count is unknown, unless a network of that name is built
    # again (densenet161 joins 1,143 inputs, resnet18-cifar none)
    for summary, rebuilt in (({**NONE, "concat_inputs": 3}, True), (NONE, False),
                             ({"exp_elems": 0}, True), (None, True)):
        assert rebuilt_since("16", [["direct", False]], [large], 512, summary) is rebuilt
    # a dense spatial pack layer whose row 17 splits evenly (9 columns: two tiles of 5, not
    # of 8), on every vector width; a row a tile divides, CSR or another algorithm, not
    nine = ConvSpec.parse("C=64,H=9,W=9,K=64,R=3,S=3,stride=1,pad=1")
    wide_row = ConvSpec.parse("C=64,H=32,W=32,K=64,R=3,S=3,stride=1,pad=1")
    for bits in (128, 256, 512):
        assert rebuilt_since("16", [["spatial_pack", False]], [nine], bits, NONE)
        for plan, convs in (([["spatial_pack", False]], [wide_row]),
                            ([["spatial_pack", True]], [nine]), ([["direct", False]], [nine])):
            assert not rebuilt_since("16", plan, convs, bits, NONE)
    named = {**layers_of, **{(net, "dense"): layers_of[("even", "dense")]
                             for net in ("densenet161", "resnet18-cifar")}}
    unchanged = unchanged_builds(named, cpu)
    before_count = {"exp_elems": 0}
    for net, kept in (("densenet161", False), ("resnet18-cifar", True), ("even", False)):
        m = dataclasses.replace(rec(net, "16"), summary=json.dumps(before_count))
        assert unchanged(m) is kept, net


def test_a_channel_pruning_record_pairs_only_with_the_layers_it_timed():
    """Engines before channel removal timed a channel-pruned network at its dense shapes;
    later ones the removed network. A record counts only beside the layers it ran."""
    from dlas_predict.measure.networks.plans import (CHANNEL_REMOVAL_VERSION, NETWORK_VERSION,
                                                     ONNXRUNTIME, NetworkMeasurement)
    from dlas_predict.models.evaluation import channels_removed, timed_these_layers

    def rec(config, version, algorithm="gemm"):
        return NetworkMeasurement(key="k", device="local", fingerprint="f", network="n",
                                  config=config, algorithm=algorithm, plan="[]",
                                  dtype="float32", run_secs=[1e-3], version=version)

    def rows(config, *convs):
        return [{"network": "n", "config": config, "layer_index": i, "conv": c}
                for i, c in enumerate(convs)]

    dense = rows("dense", "C=3,H=8,W=8,K=16,R=3,S=3", "C=16,H=8,W=8,K=16,R=3,S=3")
    same = rows("channel_pruning@0.5", "C=3,H=8,W=8,K=16,R=3,S=3",
                "C=16,H=8,W=8,K=16,R=3,S=3")
    removed = rows("channel_pruning@0.5", "C=3,H=8,W=8,K=7,R=3,S=3",
                   "C=7,H=8,W=8,K=16,R=3,S=3")
    assert not channels_removed(same, dense) and channels_removed(removed, dense)
    before = str(int(CHANNEL_REMOVAL_VERSION) - 1)
    for layers, old_counts in ((same, True), (removed, False)):
        layers_of = {("n", "dense"): dense, ("n", "channel_pruning@0.5"): layers}
        assert timed_these_layers(rec("channel_pruning@0.5", before), layers_of) is old_counts
        assert timed_these_layers(rec("channel_pruning@0.5", NETWORK_VERSION),
                                  layers_of) is not old_counts
        assert timed_these_layers(rec("dense", before), layers_of)
        assert timed_these_layers(rec("channel_pruning@0.5", "2", ONNXRUNTIME), layers_of)


def test_the_summary_counts_the_inputs_of_chained_concatenations():
    """A DenseNet's concatenations are counted by their inputs; an unrolled recurrent
    network's join of its steps is not (its builds pick by a balanced tree). A stored
    summary without the count takes the named network's, as it is for a channel-pruned
    build (removing channels leaves every join), and zero for a network not built by name."""
    from dataclasses import asdict

    from dlas_predict.models.evaluation import named_summary, stored_summary
    from dlas_predict.networks.zoo import named_network

    densenet = named_summary("densenet161")
    assert densenet.concat_inputs == 1143
    rnn = "rnn_layers=1_hidden=64_embedding=64_vocab=500_seq=8_batch=1_cell=rnn"
    assert any(l.op == "Concat" and len(l.input_shapes) == 8
               for l in named_network(rnn).layers)
    assert named_summary(rnn).concat_inputs == 0
    old = {k: v for k, v in asdict(densenet).items() if k != "concat_inputs"}
    removed = {**old, "nonconv_bytes": old["nonconv_bytes"] // 2}
    assert stored_summary("densenet161", json.dumps(removed)).concat_inputs == 1143
    assert stored_summary("densenet161", json.dumps(old)) == densenet
    assert stored_summary("my-net", json.dumps(old)).concat_inputs == 0
