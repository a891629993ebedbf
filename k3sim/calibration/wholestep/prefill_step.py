"""Mixed prefill step (issue 14 item 1): one prefill chunk of T tokens after a cached prefix of P tokens
(KDA from the prefix's recurrent and conv state, MLA attention of the chunk against prefix + chunk), with
D decodes at context C riding along in the same forward (projections and experts see T + D tokens;
chunk_kda and SDPA serve the chunk, fused_recurrent_kda and MLA decode the decodes).

Eager, timed with CUDA events after a GPU sleep that covers the host's enqueue time (`timing.time_cuda`):
prefill steps are long enough that launch gaps are a small share, and serving engines run them eagerly
(vLLM captures graphs for decode-only batches). The LM head scores each sequence's last token only.
"""

from __future__ import annotations

from k3sim.calibration.wholestep import spec as S

REPS = 10


def measure_point(model, st: S.StepShape, trace: bool = True, profile: list | None = None):
    import torch

    from k3sim.calibration.timing import time_cuda
    from k3sim.calibration.wholestep.decode_step import static_input

    states = model.alloc_states(st)
    inp = static_input(model, st)

    def step():
        return model.forward(inp, st, states)

    with torch.no_grad():
        step()
        torch.cuda.synchronize()
        traced = model.trace(inp, st, states) if trace else None
        if profile is not None:
            from k3sim.calibration.wholestep.decode_step import kernel_profile

            try:
                profile.extend(kernel_profile(step))
            except Exception as err:  # noqa: BLE001
                print(f"[wholestep] kernel profile failed: {type(err).__name__}: {err}", flush=True)
        t = time_cuda(step, reps=REPS, warmup=2, budget_s=4.0)
    del states
    torch.cuda.empty_cache()
    return t, traced
