"""Our CUDA kernels against cuDNN (through torch), measured in the same call on the GPU.

Run on the GPU machine after ``measure.gpu_run`` in the same command:

    python benchmarks/bench_gpu.py --results R1.jsonl [R2.jsonl ...] [--json OUT.json]

For every 3×3 dense float32 workload measured in the results (untuned; tuned where a knob
search ran, whose first candidate is the untuned kernel), it times
``torch.nn.functional.conv2d`` on the same shape with cuDNN (``cudnn.benchmark`` on, so cuDNN
picks its fastest algorithm; TF32 off, so both sides compute in float32 on the CUDA cores) with
CUDA events around the replay of a CUDA graph of 20 convolutions (GPU time, not Python's launch
overhead), the median of 150 replays after a warm-up, and prints ours / cuDNN per workload and
the geometric mean. Targets: the best untuned kernel within 3× of cuDNN, tuned within 1.5×.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def cudnn_ms(spec: dict, runs: int = 150, inner: int = 20) -> float:
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(1, spec["C"], spec["H"], spec["W"], device="cuda")
    w = torch.randn(spec["K"], spec["C"] // spec["groups"], spec["R"], spec["S"],
                    device="cuda")

    def run():
        return torch.nn.functional.conv2d(
            x, w, stride=(spec["stride_h"], spec["stride_w"]),
            padding=(spec["pad_t"], spec["pad_l"]), groups=spec["groups"],
            dilation=(spec["dilation_h"], spec["dilation_w"]))

    for _ in range(10):
        run()
    torch.cuda.synchronize()
    # a CUDA graph of ``inner`` convolutions: GPU time, not Python's launch overhead
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(inner):
                run()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def _untuned_knobs(row: dict) -> bool:
    """Whether a tuned candidate's knobs are the untuned schedule's."""
    try:
        from dlas_predict.measure.knobs import resolve_gpu_knobs
    except ImportError:  # a checkout, not an installed package (the GPU machine)
        from measure.knobs import resolve_gpu_knobs
    from dlas_predict.space.config import ConvSpec, Variant

    v = Variant(row["algorithm"], row["compression"], float(row["ratio"]))
    return dict(row["knobs"]) == resolve_gpu_knobs(ConvSpec.from_dict(row["conv"]), v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, nargs="+", required=True,
                    help="results files of measure.gpu_run (one run)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=60, help="workloads at most")
    args = ap.parse_args()
    best: dict[tuple, dict[str, tuple[float, str]]] = {}
    for line in (ln for path in args.results if path.is_file()
                 for ln in path.read_text().splitlines()):
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut short when the run was stopped
        c = r["conv"]
        if (r.get("error") or r["dtype"] != "float32" or r["sparse"] or c["R"] != 3
                or c["S"] != 3 or not r.get("run_secs") or r["compression"] != "dense"):
            continue
        ms = statistics.median(r["run_secs"]) * 1e3
        key = tuple(sorted(c.items()))
        slot = best.setdefault(key, {})
        kinds = [r.get("tuning", "untuned")]
        if kinds == ["tuned"] and _untuned_knobs(r):
            kinds.append("untuned")  # a knob search's first candidate is the untuned kernel
        for tn in kinds:
            if tn not in slot or ms < slot[tn][0]:
                slot[tn] = (ms, r["algorithm"])
    rows = []
    for key in sorted(best, key=lambda k: -dict(k)["C"] * dict(k)["K"])[:args.limit]:
        spec = dict(key)
        ref = cudnn_ms(spec)
        row = {"conv": spec, "cudnn_ms": ref}
        for tn, (ms, alg) in best[key].items():
            row[f"{tn}_ms"], row[f"{tn}_algorithm"], row[f"{tn}_ratio"] = ms, alg, ms / ref
        rows.append(row)
    print(f"{'workload':44s} {'cuDNN ms':>9s} {'untuned ms':>11s} {'alg':>12s} {'×':>6s}"
          f" {'tuned ms':>9s} {'×':>6s}")
    for r in rows:
        s = r["conv"]
        label = (f"C={s['C']},H={s['H']},W={s['W']},K={s['K']},stride={s['stride_h']}"
                 + (f",groups={s['groups']}" if s["groups"] > 1 else ""))
        un = r.get("untuned_ms")
        tu = r.get("tuned_ms")
        ur, tr = r.get("untuned_ratio"), r.get("tuned_ratio")
        print(f"{label:44s} {r['cudnn_ms']:9.4f} "
              f"{'' if un is None else f'{un:11.4f}':>11s} {r.get('untuned_algorithm', ''):>12s} "
              f"{'' if un is None else f'{ur:6.2f}':>6s} "
              f"{'' if tu is None else f'{tu:9.4f}':>9s} "
              f"{'' if tu is None else f'{tr:6.2f}':>6s}")
    summary = {}
    for tn in ("untuned", "tuned"):
        ratios = [r[f"{tn}_ratio"] for r in rows if f"{tn}_ratio" in r]
        if ratios:
            summary[tn] = {"workloads": len(ratios),
                           "geomean_ratio": math.exp(sum(map(math.log, ratios)) / len(ratios)),
                           "median_ratio": statistics.median(ratios),
                           "within_target": sum(x <= (3.0 if tn == "untuned" else 1.5)
                                                for x in ratios)}
            print(f"{tn}: {len(ratios)} workloads, ours/cuDNN geometric mean "
                  f"{summary[tn]['geomean_ratio']:.2f}, median {summary[tn]['median_ratio']:.2f}"
                  f", {summary[tn]['within_target']} within "
                  f"{3.0 if tn == 'untuned' else 1.5}×")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
