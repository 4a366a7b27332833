"""MetaSchedule for the CUDA kernels, searched here and measured on a GPU machine.

MetaSchedule measures its candidates while it searches, so it needs TVM's compiler beside the
GPU. A lent GPU machine has no network and takes a 64 MiB working tree, which TVM's compiler
library (259 MB) does not fit. The search is therefore run in rounds, each a kernel bundle:

1. here, :func:`propose` runs one iteration of MetaSchedule's evolutionary search on a dense
   kernel's unscheduled TensorIR (the compute of
   :func:`dlas_predict.measure.kernels.cuda.gpu_prim_func`, so a candidate takes the hand-scheduled
   kernel's arguments) for a CUDA target: design spaces from MetaSchedule's CUDA schedule rules, a
   population sampled and evolved under its XGBoost cost model, GPU validity checked by its
   post-processors. The cost model is trained on what the tuning database already holds for the
   workload, and the database's fastest schedules seed the population; a first round has neither, as
   a first iteration of ``tune_tir`` has not;
2. the bundle builds each candidate (:func:`candidate_func` replays its trace) and the GPU
   machine verifies and times it like every other kernel;
3. :func:`record_round` files each measured candidate in the tuning database (MetaSchedule's
   JSON database: the trace and its run times), so the next round learns from it.

A tuned record is the fastest verified candidate of the search so far, the hand schedule
included (the search's first candidate, as in the knob search).
"""

from __future__ import annotations

import logging
import time
import tvm

from dlas_predict.measure.kernels.spec import KernelSpec

#: Evolutionary search's population for a round of ``trials`` candidates: MetaSchedule's
#: default (512) from 64 trials up, eight candidates per trial below (at least 64).
POPULATION_TRIALS = 64


def ms_target(arch: str = "sm_90") -> "tvm.target.Target":
    """The CUDA target with the limits MetaSchedule's GPU checks read (on a machine with no
    GPU nothing queries them): 1,024 threads and the 48 KiB of static shared memory a block
    may declare, 64 Ki registers."""
    from dlas_predict.measure.kernels import cuda

    base = cuda.cuda_target(arch)
    return tvm.target.Target({**{k: v for k, v in base.export().items() if k != "host"},
                              "max_threads_per_block": 1024, "max_num_threads": 1024,
                              "max_shared_memory_per_block": cuda.MAX_STATIC_SHARED,
                              "thread_warp_size": 32, "registers_per_block": 65536,
                              "host": {"kind": "llvm"}})


def workload(ks: KernelSpec) -> tvm.IRModule:
    """The unscheduled TensorIR a dense CUDA kernel is tuned from
    (:func:`dlas_predict.measure.kernels.cuda.unscheduled`), so a tuned kernel takes the
    hand-scheduled one's arguments."""
    from dlas_predict.measure.kernels import cuda

    if ks.sparse:
        raise ValueError("CSR kernels have data-dependent loops; MetaSchedule cannot "
                         "sample them (their tuned variant is the knob search)")
    return tvm.IRModule({"main": cuda.unscheduled(ks).with_attr("global_symbol", "main")})


def _replay(mod: tvm.IRModule, trace: str) -> "tvm.s_tir.Schedule":
    """The schedule of a candidate's trace (TVM JSON) replayed on its workload."""
    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.schedule.Trace.apply_json_to_schedule(tvm.ir.load_json(trace), sch)
    return sch


def _cost_model(ctx, records, wl_mod: tvm.IRModule, seed: int):
    """MetaSchedule's XGBoost cost model trained on ``records``, the database's measured
    schedules of the workload; with none, its random model seeded with ``seed`` (a first
    iteration of ``tune_tir`` ranks at random too)."""
    from tvm.s_tir import meta_schedule as ms

    if not records:
        return ms.cost_model.RandomModel(seed=seed)
    model = ms.cost_model.XGBModel(adaptive_training=False, num_warmup_samples=0)
    cands, results = [], []
    for rec in records:
        sch = tvm.s_tir.Schedule(wl_mod)
        rec.trace.apply_to_schedule(sch, remove_postproc=False)
        cands.append(ms.MeasureCandidate(sch, rec.args_info))
        results.append(ms.runner.RunnerResult(list(rec.run_secs), None))
    model.update(ctx, cands, results)
    return model


def propose(ks: KernelSpec, target: "tvm.target.Target", trials: int, db=None,
            seed: int = 0) -> tuple[list[str], float]:
    """One round of MetaSchedule's evolutionary search for ``ks``: up to ``trials`` new
    candidates, each its schedule trace as TVM JSON text (post-processing included), and the
    seconds the search took. ``db``: MetaSchedule's database of earlier rounds.

    The same workload, database and ``seed`` give the same candidates: the search runs on
    one thread (two threads race for the population's indices, each with its own random
    stream), and a round with no measurements ranks with MetaSchedule's seeded random model
    (the untrained XGBoost model draws from numpy's global generator)."""
    from tvm.s_tir import meta_schedule as ms

    from dlas_predict.measure.kernels.tuning import CPU_INTRINSICS, import_tensor_intrinsics

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    import_tensor_intrinsics(CPU_INTRINSICS + ("cuda",))  # TuneContext imports the package
    mod = workload(ks)
    population = 512 if trials >= POPULATION_TRIALS else max(64, 8 * trials)
    ctx = ms.TuneContext(
        mod=mod, target=target, space_generator="post-order-apply",
        # a small workload's design space holds few distinct valid schedules: ask the
        # initial population for as many new ones as the round measures, not 50
        search_strategy=ms.search_strategy.EvolutionarySearch(
            population_size=population, init_min_unmeasured=max(1, min(50, trials)),
            max_fail_count=20),
        task_name="conv", rand_state=seed + 1, num_threads=1)
    spaces = ctx.space_generator.generate_design_space(mod)
    records = (db.get_top_k(db.commit_workload(mod), 10 ** 6)
               if db is not None and db.has_workload(mod) else [])
    cost = _cost_model(ctx, records, mod, seed)
    memory = ms.database.MemoryDatabase()
    for rec in records:
        memory.commit_tuning_record(ms.database.TuningRecord(
            rec.trace, memory.commit_workload(mod), rec.run_secs, rec.target, rec.args_info))
    ctx.search_strategy.pre_tuning(trials, trials, spaces, memory, cost)
    try:
        found = ctx.search_strategy.generate_measure_candidates() or []
    finally:
        ctx.search_strategy.post_tuning()
    seen = {tvm.ir.save_json(r.trace.as_json(remove_postproc=False))
            for r in memory.get_all_tuning_records()}
    traces: list[str] = []
    for cand in found:
        text = tvm.ir.save_json(cand.sch.trace.as_json(remove_postproc=False))
        if text not in seen and len(traces) < trials:
            seen.add(text)
            traces.append(text)
    return traces, time.perf_counter() - t0


def candidate_func(ks: KernelSpec, trace: str) -> "tvm.tirx.PrimFunc":
    """The CUDA TensorIR of one MetaSchedule candidate: its trace replayed on the workload."""
    return _replay(workload(ks), trace).mod["main"]


def record_round(db, ks: KernelSpec, target: "tvm.target.Target",
                 measured: list[tuple[str, list[float] | None]]) -> int:
    """File measured candidates in MetaSchedule's database ``db``: (trace JSON, run seconds,
    or None for a candidate that failed or did not verify, kept as MetaSchedule keeps a
    failed run: with no times). Returns how many were filed."""
    from tvm.s_tir import meta_schedule as ms

    mod = workload(ks)
    wl = db.commit_workload(mod)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    n = 0
    for trace_json, secs in measured:
        db.commit_tuning_record(ms.database.TuningRecord(
            _replay(mod, trace_json).trace, wl, [float(s) for s in secs] if secs else None,
            tvm.target.Target(target.export()), args))
        n += 1
    return n
