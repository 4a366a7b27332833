"""Our CUDA kernels against cuDNN (through torch), timed the same way in the same call.

Run on the GPU machine after ``dlas_predict.measure.gpu.run`` in the same command:

    python benchmarks/bench_gpu.py --results R1.jsonl [R2.jsonl ...] --bundles B1 [B2 ...]
                                   [--json OUT.json]

For every 3×3 dense float32 workload in the results it takes our fastest verified kernel of
each kind: untuned (the hand schedule), tuned by the knob search, tuned by MetaSchedule (its
candidates alone, the hand schedule left out), and tuned (the fastest of all). Each is loaded
from its bundle and timed like cuDNN: the replay of a CUDA graph of 20 launches, timed with
CUDA events, the median of 150 replays after a warm-up; this is GPU time, without the
launch overhead. cuDNN runs through ``torch.nn.functional.conv2d`` with ``cudnn.benchmark``
on (it picks its fastest algorithm) and TF32 off (both sides compute in float32 on the CUDA
cores). Each kernel's output is checked against cuDNN's before it is timed. The table also
gives our untuned kernel's corpus time (TVM's ``time_evaluator``: back-to-back launches,
launch overhead included). Targets: the best untuned kernel within 3× of cuDNN, tuned
within 1.5×.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

RUNS, INNER = 150, 20
KINDS = ("untuned", "knob-search", "metaschedule", "tuned")
_MODULES: dict = {}


def _graph_ms(launch) -> float:
    """Median GPU milliseconds of one ``launch()``: a CUDA graph of INNER launches replayed
    RUNS times between CUDA events."""
    import torch
    import tvm_ffi

    for _ in range(3):
        launch()  # warm-up: module load, workspace pools, cuDNN's algorithm choice
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with tvm_ffi.use_torch_stream(torch.cuda.graph(graph, stream=stream)):
        for _ in range(INNER):
            launch()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(RUNS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / INNER)
    return statistics.median(times)


def _cudnn(spec: dict, x, w):
    import torch

    def run():
        return torch.nn.functional.conv2d(
            x, w, stride=(spec["stride_h"], spec["stride_w"]),
            padding=(spec["pad_t"], spec["pad_l"]), groups=spec["groups"],
            dilation=(spec["dilation_h"], spec["dilation_w"]))
    return run


def _ours(row: dict, bundles: dict[str, Path], x_np, w_np):
    """A launcher of the kernel of results row ``row`` (loaded from its bundle), and its
    output as a numpy array after one launch."""
    import tvm

    from dlas_predict.measure.gpu.bundle import kernel_spec
    from dlas_predict.measure.kernels.build import device_args

    bundle, line = bundles[row["key"]]
    path = str(bundle / line["chunk"])
    if path not in _MODULES:  # NVRTC compiles a module's CUDA C once, at load
        _MODULES[path] = tvm.runtime.load_module(path)
    func = _MODULES[path][line["func"]]
    ks = kernel_spec(line)
    args = device_args(ks, x_np, w_np, tvm.cuda(0))
    func(*args)
    tvm.cuda(0).sync()
    out = args[-1].numpy().reshape(ks.conv.output_shape)
    return (lambda: func(*args)), out


def _kinds(row: dict) -> list[str]:
    """Which columns a results row competes in. A search's hand-schedule candidate is the
    untuned kernel, and part of the knob search (its first setting) but not of MetaSchedule's
    column."""
    if row.get("tuning", "untuned") == "untuned":
        return ["untuned"]
    if row.get("schedule") == "metaschedule":
        return ["metaschedule", "tuned"]
    tuner = row.get("tuner", "knob-search")
    if _hand_knobs(row):
        return ["untuned", "tuned"] + (["knob-search"] if tuner == "knob-search" else [])
    return [tuner, "tuned"] if tuner in KINDS else ["tuned"]


def _hand_knobs(row: dict) -> bool:
    """Whether a tuned candidate's knobs are the untuned schedule's."""
    from dlas_predict.space.config import ConvSpec, Variant
    from dlas_predict.measure.kernels.knobs import resolve_gpu_knobs

    v = Variant(row["algorithm"], row["compression"], float(row["ratio"]))
    return dict(row["knobs"]) == resolve_gpu_knobs(ConvSpec.from_dict(row["conv"]), v)


def _bundle_lines(paths: list[Path]) -> dict[str, tuple[Path, dict]]:
    """Each kernel of the bundles by key: its bundle and manifest line."""
    from dlas_predict.measure.gpu.bundle import read_lines

    return {line["key"]: (b, line) for b in paths for line in read_lines(b / "manifest.jsonl")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, nargs="+", required=True,
                    help="results files of dlas_predict.measure.gpu.run (one run)")
    ap.add_argument("--bundles", type=Path, nargs="+", required=True,
                    help="the bundles those results measured")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=60, help="workloads at most")
    args = ap.parse_args()

    import numpy as np
    import torch

    from dlas_predict.space.config import ConvSpec, DType
    from dlas_predict.measure.gpu.run import load_cuda_runtime
    from dlas_predict.measure.kernels.reference import make_inputs

    load_cuda_runtime()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    bundles = _bundle_lines(args.bundles)
    best: dict[tuple, dict[str, tuple[float, dict]]] = {}
    for line in (ln for path in args.results if path.is_file()
                 for ln in path.read_text().splitlines()):
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut short when the run was stopped
        c = r["conv"]
        if (r.get("error") or r["dtype"] != "float32" or r["sparse"] or c["R"] != 3
                or c["S"] != 3 or not r.get("run_secs") or r["compression"] != "dense"
                or r["key"] not in bundles):
            continue
        ms = statistics.median(r["run_secs"]) * 1e3
        slot = best.setdefault(tuple(sorted(c.items())), {})
        for kind in _kinds(r):
            if kind not in slot or ms < slot[kind][0]:
                slot[kind] = (ms, r)
    rows = []
    _header()
    for key in sorted(best, key=lambda k: -dict(k)["C"] * dict(k)["K"])[:args.limit]:
        spec = dict(key)
        x_np, w_np = make_inputs(ConvSpec.from_dict(spec), DType.FLOAT32, seed=7)
        x, w = torch.from_numpy(x_np).cuda(), torch.from_numpy(w_np).cuda()
        ref_run = _cudnn(spec, x, w)
        ref = ref_run().cpu().numpy()
        row = {"conv": spec, "cudnn_ms": _graph_ms(ref_run)}
        for kind, (ms, r) in best[key].items():
            row[f"{kind}_evaluator_ms"], row[f"{kind}_algorithm"] = ms, r["algorithm"]
            try:
                launch, out = _ours(r, bundles, x_np, w_np)
                err = float(np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
                if not err < 1e-4:
                    raise ValueError(f"output off cuDNN's by {err:.3g} of its scale")
                row[f"{kind}_ms"] = _graph_ms(launch)
                row[f"{kind}_ratio"] = row[f"{kind}_ms"] / row["cudnn_ms"]
            except Exception as exc:  # noqa: BLE001 - reported in the row, the run goes on
                row[f"{kind}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
        _print(row)
    summary = {}
    for kind in KINDS:
        ratios = [r[f"{kind}_ratio"] for r in rows if f"{kind}_ratio" in r]
        if not ratios:
            continue
        target = 3.0 if kind == "untuned" else 1.5
        summary[kind] = {"workloads": len(ratios),
                         "geomean_ratio": math.exp(sum(map(math.log, ratios)) / len(ratios)),
                         "median_ratio": statistics.median(ratios),
                         "within_target": sum(x <= target for x in ratios), "target": target}
        s = summary[kind]
        print(f"{kind}: {s['workloads']} workloads, ours/cuDNN geometric mean "
              f"{s['geomean_ratio']:.2f}, median {s['median_ratio']:.2f}, "
              f"{s['within_target']} within {target}×")
    errors = [(r["conv"], k, r[f"{k}_error"]) for r in rows for k in KINDS
              if f"{k}_error" in r]
    for conv, kind, text in errors:
        print(f"not timed: {kind} {conv}: {text}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


def _header() -> None:
    print(f"{'workload':42s} {'cuDNN':>7s} | {'untuned ×':>14s} {'evaluator':>9s} | "
          f"{'knob search ×':>14s} | {'MetaSchedule ×':>14s} | {'tuned ×':>14s} {'alg':>12s}",
          flush=True)


def _print(r: dict) -> None:
    def cell(kind: str) -> str:
        if f"{kind}_ms" not in r:
            return f"{'-':>8s} {'':>5s}"
        return f"{r[f'{kind}_ms']:8.4f} {r[f'{kind}_ratio']:5.2f}"

    s = r["conv"]
    label = (f"C={s['C']},H={s['H']},W={s['W']},K={s['K']},stride={s['stride_h']}"
             + (f",groups={s['groups']}" if s["groups"] > 1 else ""))
    ev = r.get("untuned_evaluator_ms")
    print(f"{label:42s} {r['cudnn_ms']:7.4f} | {cell('untuned')} "
          f"{'' if ev is None else f'{ev:9.4f}':>9s} | {cell('knob-search')} | "
          f"{cell('metaschedule')} | {cell('tuned')} {r.get('tuned_algorithm', ''):>12s}",
          flush=True)


if __name__ == "__main__":
    main()
