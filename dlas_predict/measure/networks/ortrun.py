"""onnxruntime as a backend of the grid: the incumbent runtime, timed like our builds.

One :class:`~dlas_predict.measure.execution.tasks.OrtTask` runs in the isolated worker:

- ``fp32``: the model as given, every graph optimisation on;
- ``int8``: static QDQ quantisation from ``onnxruntime.quantization`` (int8 weights per
  channel, int8 activations per tensor, MinMax calibration on the task's inputs);
- ``float16``: the model converted to float16 (inputs and outputs kept float32). The CPU
  provider has no float16 kernel for some ops; a session that cannot be created is the
  task's error, with onnxruntime's reason.

The session runs ``threads`` intra-op threads, one inter-op thread, sequentially. Outputs
are checked against the float32 reference (the ``check`` file, onnxruntime's float32
outputs of the unoptimised model), then the session is timed with the study's protocol and
the same contention probes as a TVM build
(:func:`dlas_predict.measure.execution.contention.timed_fields`). onnxruntime runs on this machine only:
over TVM RPC a board has no onnxruntime to call.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dlas_predict.measure.execution.tasks import OrtTask
from dlas_predict.measure.networks.plans import as_input

#: onnxruntime configurations, by the compression whose model they run.
MODES = ("fp32", "int8", "float16")


def mode_of(compression) -> str:
    """The onnxruntime mode of a compression: pruned models run in float32."""
    from dlas_predict.measure.networks.plans import onnxruntime_mode

    return onnxruntime_mode(compression)



#: Seconds onnxruntime's pool threads are given to stop after a session is released.
PARK_S = 0.2


def session_options(threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.intra_op_num_threads = max(1, int(threads))
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return opts


def quantize_int8(src: Path, dst: Path, input_name: str, calibration: np.ndarray) -> None:
    """Static QDQ int8 of ``src`` into ``dst``, calibrated on ``calibration`` (N inputs
    stacked on a first axis)."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(as_input(calibration[i]) for i in range(len(calibration)))

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {input_name: x}

    pre = dst.with_suffix(".pre.onnx")
    try:
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        source = pre
    except Exception:  # noqa: BLE001 - pre-processing is an optimisation, not required
        source = src
    quantize_static(str(source), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    per_channel=True)


def to_float16(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst))


def prepare_model(task: OrtTask, workdir: Path) -> Path:
    """The file the session loads for ``task.mode``."""
    src = Path(task.onnx)
    if task.mode == "fp32":
        return src
    dst = workdir / f"{src.stem}.{task.mode}.onnx"
    if task.mode == "int8":
        if not task.calibration:
            raise ValueError("int8 needs calibration inputs")
        quantize_int8(src, dst, task.input_name, np.load(task.calibration)["x"])
    elif task.mode == "float16":
        to_float16(src, dst)
    else:
        raise ValueError(f"unknown onnxruntime mode {task.mode!r}; modes: {', '.join(MODES)}")
    return dst


def run_ort_task(task: OrtTask) -> dict[str, Any]:
    """Worker entry: prepare, check and time one onnxruntime configuration."""
    import onnxruntime as ort

    from dlas_predict.measure.execution.remote import execution
    from dlas_predict.measure.execution.tasks import plan_timing
    from dlas_predict.measure.execution.contention import timed_fields

    if execution().remote:
        raise RuntimeError("onnxruntime runs on this machine only: a board reached over TVM "
                           "RPC has no onnxruntime to call")
    with tempfile.TemporaryDirectory(prefix="dlas-ort-") as tmp:
        t0 = time.perf_counter()
        path = prepare_model(task, Path(tmp))
        # the timing's sessions outlive the prepared file: they load its bytes
        source = str(path) if path == Path(task.onnx) else path.read_bytes()

        def session():
            return ort.InferenceSession(source, session_options(task.threads),
                                        providers=["CPUExecutionProvider"])
        try:
            sess = session()
        except Exception as exc:  # noqa: BLE001 - e.g. no float16 kernel on this provider
            raise RuntimeError(f"onnxruntime {ort.__version__} cannot run the {task.mode} "
                               f"model on its CPU provider: {str(exc)[:400]}") from None
        prepare_s = time.perf_counter() - t0
    check = np.load(task.check)
    xs, refs = as_input(check["x"]), check["y"]
    outs = np.stack([np.asarray(sess.run(None, {task.input_name: xs[i]})[0],
                                np.float64).reshape(-1) for i in range(len(xs))])
    refs_a = refs.reshape(len(refs), -1).astype(np.float64)
    err = float(np.max(np.abs(outs - refs_a)))
    scale = max(1.0, float(np.max(np.abs(refs_a))))
    agree = float(np.mean(outs.argmax(1) == refs_a.argmax(1)))
    result: dict[str, Any] = {
        "compile_s": prepare_s, "max_error": err, "relative_error": err / scale,
        "top1_agreement": agree,
        "verified": bool(err <= 1e-3 * scale) if task.mode == "fp32" else bool(agree >= 0.9),
        "details": {"backend": "onnxruntime", "version": ort.__version__, "mode": task.mode,
                    "threads": task.threads,
                    **({"calibration": task.calibration_source} if task.mode == "int8"
                       else {})}}
    feed = {task.input_name: xs[0]}
    t0 = time.perf_counter()
    sess.run(None, feed)
    single = time.perf_counter() - t0
    number, repeats = plan_timing(single, task.protocol)
    warm = len(xs) + 1  # the runs the checked session made before its timing
    # the probes before and after a timing must read the machine, not onnxruntime: a live
    # session's pool threads, spinning after a run (tens of ms) or parked, made the chain
    # probe read TVM's pool 2x slow on 2 cores in about one probe in four, however long it
    # waited; without the session it never did. Each timing runs a session of its own.
    del sess
    time.sleep(PARK_S)

    def run() -> list[float]:
        timed_session = session()
        for _ in range(warm):
            timed_session.run(None, feed)
        secs = []
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(number):
                timed_session.run(None, feed)
            secs.append((time.perf_counter() - t) / number)
        del timed_session
        time.sleep(PARK_S)
        return secs

    result.update(number=number, repeats=repeats,
                  **timed_fields(run, task.target, task.protocol, task.fingerprint,
                                 task.simd_bits))
    return result
