"""Whole networks for a GPU that no tracker reaches: built here, timed there, imported back.

The kernel bundles' three steps (:mod:`dlas_predict.measure.gpu.bundle`), for whole networks:

1. :func:`write_network_bundle` (here): each configuration's network is prepared as for the
   CPU (compressed, channel-pruned filters removed, int8 scales calibrated, onnxruntime's
   outputs on sample inputs as the check), lowered by :func:`~.netbuild.lower_cuda` and
   exported as ``net-NNNN.so`` with its ``net-NNNN.check.npz``, one line of
   ``manifest.jsonl`` each (``kind: network``). A network that fails to build is a recorded
   failure in ``build_failures.jsonl``.
2. ``python -m dlas_predict.measure.gpu.run BUNDLE --out R`` (there): each network is loaded into
TVM's Relax VM, checked against onnxruntime's outputs and timed with the bundle's protocol.
3. :func:`dlas_predict.corpus.gpu.import_results` (here) files the results as
   whole-network measurements.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dlas_predict.measure.networks.plans import GPU_NETWORK_VERSION, first_output
from dlas_predict.errors import DlasError
from dlas_predict.space.devices import Device


#: Timing protocol of whole networks on a GPU (as the kernels', a longer budget).
NETWORK_PROTOCOL = {"max_repeats": 150, "min_repeats": 10, "min_repeat_ms": 1.0,
                    "time_budget_s": 1.0}


class _Preparer:
    """Prepares each plan's network as the CPU runner does (:func:`~.netrunner.prepare_network`),
    in a temporary folder of its own."""

    def __init__(self, timing: bool = False) -> None:
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(prefix="dlas-gpunet-")
        self._cache: dict = {}
        self.timing = timing

    def __call__(self, plan):
        from dlas_predict.measure.networks.runner import prepare_network

        return prepare_network(plan, Path(self._tmp.name), self._cache, timing=self.timing)

    def close(self) -> None:
        self._tmp.cleanup()


def plan_line(plan, device: Device) -> dict[str, Any]:
    """A network plan's manifest fields: what its record and a re-filed key are made of."""
    return {"kind": "network", "key": plan.key(device), "model": str(plan.model),
            "network": plan.network, "config": plan.config, "algorithm": plan.algorithm,
            "compression": plan.compression.value, "ratio": plan.ratio,
            "layers": [[a, bool(s)] for a, s in plan.layers], "plan": plan.plan_json(),
            "dtype": plan.dtype.value}


def write_network_bundle(plans: list, device: Device, out: Path,
                         log: Callable[[str], None] | None = None,
                         timing_weights: bool = False) -> dict[str, int]:
    """Build each plan's network for ``device``'s CUDA target into the bundle ``out``
    (resumable: plans already in its manifest or failures are skipped). onnxruntime plans
    are not built: the GPU grid runs our kernels. ``timing_weights``: each network's large
    weights become a compressible pattern (:func:`~.netrunner.timing_weights`), so that a
    bundle of big networks fits a small transfer. Returns counts."""
    import onnx
    import tvm

    from dlas_predict.measure.kernels import cuda
    from dlas_predict.measure.gpu.bundle import (GPU_KERNELS_VERSION, append_lines, done_keys,
                                                 require_cuda)
    from dlas_predict.measure.networks.build import LayerChoice, lower_cuda
    from dlas_predict.space.config import Algorithm

    require_cuda(device, "GPU network bundles")
    out.mkdir(parents=True, exist_ok=True)
    manifest, failures = out / "manifest.jsonl", out / "build_failures.jsonl"
    header = {"device": device.name, "fingerprint": device.fingerprint,
              "target": device.target, "gpu": device.gpu, "protocol": NETWORK_PROTOCOL,
              "kernels_version": GPU_KERNELS_VERSION,
              "network_version": GPU_NETWORK_VERSION, "tvm_version": tvm.__version__}
    (out / "bundle.json").write_text(json.dumps(header, indent=1) + "\n")
    done = done_keys(manifest) | done_keys(failures)
    todo = [p for p in plans if p.backend == "tvm" and p.key(device) not in done]
    target = cuda.cuda_target(device.target.get("arch", "sm_90"))
    n = len(list(out.glob("net-*.so")))
    built = failed = 0
    t_start = time.time()
    prep_of = _Preparer(timing_weights)
    try:
        for plan in todo:
            line = plan_line(plan, device)
            t0 = time.time()
            try:
                prep = prep_of(plan)
                choices = [LayerChoice(Algorithm.parse(a), bool(s)) for a, s in plan.layers]
                mod = lower_cuda(onnx.load(str(prep.path)), prep.input_name,
                                 tuple(prep.input_shape), plan.dtype, choices, target,
                                 list(prep.specs), prep.scales)
                exe = tvm.compile(mod, target=target)
                over = _over_shared(exe)
                if over:
                    raise DlasError(over)
                name = f"net-{n:04d}"
                exe.export_library(str(out / f"{name}.so"))
                shutil.copyfile(prep.check, out / f"{name}.check.npz")
            except Exception as exc:  # noqa: BLE001 - a failed build is a recorded failure
                text = str(exc).strip().splitlines()
                append_lines(failures, [{**line, "error": f"build: {type(exc).__name__}: "
                                    f"{(text[-1] if text else '')[:500]}"}])
                failed += 1
                continue
            append_lines(manifest, [{**line, "chunk": f"{name}.so", "check": f"{name}.check.npz",
                                "input_shape": list(prep.input_shape),
                                "summary": prep.summary, "notes": list(prep.notes),
                                "weights": "timing" if timing_weights else "model",
                                "build_s": round(time.time() - t0, 3)}])
            n += 1
            built += 1
            if log:
                log(f"built {built + failed}/{len(todo)} networks ({failed} failed) in "
                    f"{time.time() - t_start:.0f} s")
    finally:
        prep_of.close()
    return {"planned": len(plans), "skipped": len(plans) - len(todo), "built": built,
            "failed": failed}


def _over_shared(exe) -> str | None:
    """Why NVRTC would refuse the executable's CUDA module (a block over its static shared
    memory), or None."""
    from dlas_predict.measure.kernels import cuda

    used = cuda.shared_bytes(cuda.cuda_source(exe))
    worst = max(used.items(), key=lambda kv: kv[1], default=("", 0))
    if worst[1] > cuda.MAX_STATIC_SHARED:
        return (f"{worst[0]} declares {worst[1]} bytes of static shared memory, over the "
                f"GPU's {cuda.MAX_STATIC_SHARED}")
    return None


def measure_network(mod, line: dict[str, Any], bundle: Path, dev, proto: dict) -> dict:
    """On the GPU: run one loaded network on its check inputs, compare with onnxruntime's
    outputs, and time it (TVM's ``time_evaluator`` on the VM's ``main``: CUDA events)."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from dlas_predict.space.config import DType
    from dlas_predict.measure.execution.tasks import Protocol, plan_timing

    vm = VirtualMachine(mod, dev)
    check = np.load(bundle / line["check"])
    xs, refs = check["x"], check["y"]
    outs = []
    for i in range(len(xs)):
        out = first_output(vm["main"](tvm.runtime.tensor(_as_fed(xs[i]), dev)))
        outs.append(np.asarray(out.numpy(), dtype=np.float64).reshape(-1))
    outs_a, refs_a = np.stack(outs), refs.reshape(len(refs), -1).astype(np.float64)
    err = float(np.max(np.abs(outs_a - refs_a)))
    scale = max(1.0, float(np.max(np.abs(refs_a))))
    agree = float(np.mean(outs_a.argmax(1) == refs_a.argmax(1)))
    tol = {DType.FLOAT32: 1e-3}.get(DType.parse(line["dtype"]))
    verified = bool(err <= tol * scale) if tol else bool(agree >= 0.9)
    x = tvm.runtime.tensor(_as_fed(xs[0]), dev)
    vm["main"](x)
    dev.sync()
    t0 = time.perf_counter()
    vm["main"](x)
    dev.sync()
    number, repeats = plan_timing(time.perf_counter() - t0, Protocol(**proto))
    runs = list(vm.time_evaluator("main", dev, number=number, repeat=repeats)(x).results)
    result = {"run_secs": runs, "number": number, "verified": verified, "max_error": err,
              "top1_agreement": agree, "error": None}
    if not verified and tol:  # float32 off onnxruntime: a wrong build, not timed
        result["error"] = (f"verification failed: max error {err:.3g}, top-1 agreement "
                           f"{agree:.0%} against onnxruntime")
    return result


def _as_fed(x: np.ndarray) -> np.ndarray:
    """A check input as the network takes it: token ids keep their integer type, anything
    else is float32."""
    return x if np.issubdtype(x.dtype, np.integer) else x.astype(np.float32)


def _lossy_unverified(row: dict[str, Any]) -> bool:
    """A float16 or int8 network whose top-1 agreement with onnxruntime is under 90 %: an
    accuracy figure, not a wrong build. As on the CPU, its time is kept with ``verified``
    false (a row whose runner wrote it as a verification failure is read the same way)."""
    return (row.get("dtype") != "float32" and bool(row.get("run_secs"))
            and str(row.get("error") or "").startswith("verification failed"))


def network_record(row: dict[str, Any], header: dict[str, Any]):
    """A results row of a network (or its build failure) as a whole-network record, filed
    under the header's device."""
    from dlas_predict.measure.networks.plans import NetworkMeasurement

    if _lossy_unverified(row):
        row = {**row, "error": None, "verified": False}
    ok = row.get("error") is None
    details = {"engine": "cuda", "epilogue": "separate", "gpu_engine": GPU_NETWORK_VERSION,
               "weights": row.get("weights", "model")}
    if row.get("notes"):
        details["prepared"] = row["notes"]
    return NetworkMeasurement(
        key=row["key"], device=header["device"], fingerprint=header["fingerprint"],
        network=row["network"], config=row["config"], algorithm=row["algorithm"],
        plan=row["plan"], dtype=row["dtype"], run_secs=list(row.get("run_secs") or [])
        if ok else [], compile_s=row.get("compile_s") or row.get("build_s"),
        verified=row.get("verified"), max_error=row.get("max_error"),
        top1_agreement=row.get("top1_agreement"), error=row.get("error"),
        timestamp=row.get("timestamp") or time.time(), summary=row.get("summary"),
        details=details, version=GPU_NETWORK_VERSION)


def network_key(row: dict[str, Any], header: dict[str, Any]) -> str:
    """A network row's key for the header's device (its plan's key there)."""
    from dlas_predict.measure.networks.plans import NetworkPlan
    from dlas_predict.space.config import Compression
    from dlas_predict.space.devices import get_device

    plan = NetworkPlan(row["model"], row["network"], Compression.parse(row["compression"]),
                       row["ratio"], row["algorithm"],
                       tuple((a, bool(s)) for a, s in row["layers"]))
    return plan.key(get_device(header["device"], with_target=False))
