"""The serving whole-step check of a hybrid model (issue 23 item 7): predictions for the Qwen3-Next-shaped
random-weight model of `k3sim/calibration/wholestep/` (16 layers at TP 1: 12 Gated DeltaNet + 4 gated GQA, 512-expert
MoE, embedding and LM head; decode steps under one CUDA graph, eager mixed prefill steps on one H200), written
before the run, in the format of Kimi-Linear's (`decode_step.write_predictions`), so `decode_step.check_tables` /
`write_check` compare them with the run afterwards.

The same two predictions per point as Kimi-Linear's, both under the CUDA-graph convention:
- `model`: the step model (`step.layers.layer_calls` over the configuration's layers, every mixer kind priced by
  its own calls; one rank's compute, no collectives): `decode_step.model_prediction`;
- `manifest`: the sum of per-kernel predictions over the exact kernel list the measured model launches
  (`wholestep.spec.sequence`), `decode_step.manifest_prediction`; the hybrid layers' own entries (`gdn_gating`,
  `gqa_prefix_causal_fwd`) are priced there (`decode_step._hybrid_call`), so `decode_step.check_tables` splits a
  measured Qwen3-Next step by family with the same calls.
"""

from __future__ import annotations

from typing import Any, Callable

from k3sim.step.batch import Batch
from k3sim.validation.decode_step import _decode_kernel, _spec_layers, manifest_prediction, model_prediction
from k3sim.validation.runs import run_file

PREDICTIONS = "reports/decode/wholestep_predictions_qwen3_next.csv"  # committed before the run (phase 2 runs it)


def prediction_rows(hw: Any = "h200", kernel_time: Callable | None = None, plan: str | None = None) -> list[dict]:
    """One row per point the Qwen3-Next plan measures (run.py's grids for its configuration), both predictions."""
    from k3sim.calibration.wholestep import run as R
    from k3sim.calibration.wholestep import spec as S
    from k3sim.configs import load_hardware, load_model

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    specs = S.load_specs(S.SPECS_PATH)
    rows: list[dict] = []
    for cfg, kernel, part, _secs in R.parse_plan(plan or R.QWEN_PLAN, specs, "grouped_bf16"):
        spec = specs[cfg]
        model = load_model(spec.model)

        def both(st, batch):
            man, info = manifest_prediction(S.sequence(spec, st, kernel), hw, kernel_time)
            mod = model_prediction(model, hw, tp=spec.tp, ep=spec.ep, layers=_spec_layers(spec), embed_head=spec.embed_head,
                                   batch=batch, expert_kernel=_decode_kernel(spec, kernel), kernel_time=kernel_time)
            return dict(config=cfg, part=part, expert_kernel=kernel, predicted_model_s=mod, predicted_manifest_s=man,
                        proxy_share=info["by_source"].get("proxy", 0.0) / man)

        if part == "decode":
            for c in R.DECODE_C.get(cfg, R.DECODE_C["default"]):
                for b in R.DECODE_B:
                    rows.append(dict(both(S.StepShape(decodes=b, context=c), Batch.decode(b, c)), B=b, C=c))
        elif part == "prefill":
            for r in R.PREFILL_RIDE:
                for p in R.PREFILL_PREFIX:
                    for ch in R.CHUNKS_OF.get(cfg, R.PREFILL_CHUNKS):
                        st = S.StepShape(decodes=r, context=R.RIDE_CONTEXT if r else 0, chunk=ch, prefix=p)
                        b = Batch(decode_contexts=(R.RIDE_CONTEXT,) * r, prefill=((ch, p),))
                        rows.append(dict(both(st, b), chunk=ch, prefix=p, decodes=r))
    return rows


COLUMNS = ["config", "part", "expert_kernel", "B", "C", "predicted_model_s", "predicted_manifest_s", "proxy_share",
           "chunk", "prefix", "decodes"]  # Kimi-Linear's predictions file, column for column


def write_predictions(out=PREDICTIONS, plan: str | None = None) -> int:
    """The predictions of every point the Qwen3-Next plan measures, written atomically before the run (the lead
    commits them; the check runs after that commit). Returns the number of rows."""
    import pandas as pd

    from k3sim.files import atomic_write_text, check_output_file

    check_output_file(out, source="OUT")
    df = pd.DataFrame(prediction_rows(plan=plan), columns=COLUMNS)
    atomic_write_text(out, df.to_csv(index=False, float_format="%.6g"))
    return len(df)


# The measured model's glue (`wholestep/model.py` moe, `hybrid.py`) by the torch / fla kernel names torch.profiler
# records for it: which piece of the unmeasured family ("elementwise, routing, copies") a profiled kernel is. First
# match wins; the names are the aten kernels the calls above launch (index_add -> indexFunc*Index<..ReduceAdd>, the
# expert counts' scatter_add_ -> _scatter_gather..<ReduceAdd>,
# where -> where_kernel_impl, x * w and x + y in bf16 -> BinaryFunctor / CUDAFunctor_add on BFloat16, .float() /
# .to() / .contiguous() -> direct_copy / bfloat16_copy, xin[tok] -> vectorized_gather / index kernels).
GLUE_PIECES = (
    ("fla chunk output (GDN kernel, filed as glue)", ("chunk_fwd_kernel_o",)),
    ("MoE combine: fp32 index_add (+ expert-count scatter_add)", ("ReduceAdd>",)),
    ("select (torch.where)", ("where_kernel_impl",)),
    ("bf16 multiply / add", ("BinaryFunctor<c10::BFloat16", "CUDAFunctor_add<c10::BFloat16>")),
    ("copies and casts", ("direct_copy_kernel", "bfloat16_copy_kernel", "Memcpy", "CatArrayBatchedCopy")),
    ("gathers (permute, indexing)", ("vectorized_gather_kernel", "index_elementwise_kernel", "indexSelect")),
    ("top-k, sorts, softmax (router, permute)", ("mbtopk", "sbtopk", "radixSort", "RadixSort", "bitonicSort",
                                                 "softmax_warp", "scan_by_key", "DeviceScan")),
    ("SiLU, sigmoid", ("silu_kernel", "sigmoid_kernel")),
)
GLUE_REST = "rest (fills, fp32 arithmetic, small ops)"


def glue_piece(kernel: str) -> str:
    """The GLUE_PIECES label of a profiled kernel name (GLUE_REST when none matches)."""
    for label, keys in GLUE_PIECES:
        if any(k in kernel for k in keys):
            return label
    return GLUE_REST


def glue_split(run_dir):
    """The profiled kernels of the unmeasured family (`step.families.OTHER`) of a whole-step run, split into the
    implementation pieces they come from: one row per profiled point and piece (calls, gpu_s). What a whole-step
    miss in glue is made of, read from the run's kernels.csv (no prediction involved)."""
    import pandas as pd

    from k3sim.step.families import OTHER, kernel_family

    K = pd.read_csv(run_file(run_dir, "kernels.csv", "serving whole-step"))
    K = K[K.kernel.map(kernel_family) == OTHER].assign(piece=K.kernel.map(glue_piece))
    keys = ["config", "part", "B", "C", "chunk", "prefix", "decodes", "piece"]
    return K.groupby(keys, dropna=False, sort=False).agg(calls=("calls", "sum"), gpu_s=("gpu_s", "sum")).reset_index()


def main(argv: list[str] | None = None) -> int:  # python3 -m k3sim.validation.decode_step_hybrid [OUT.csv]
    import sys

    from k3sim.errors import InputError

    args = sys.argv[1:] if argv is None else argv
    try:
        n = write_predictions(args[0] if args else PREDICTIONS)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{n} predictions written to {args[0] if args else PREDICTIONS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
