"""Training forward and forward+backward of a layer slice (issue 15 item 2): sequence T x micro-batch
b, bf16 weights as trainable leaves (the whole model: token ids in, every token's logits out, weight
gradients dropped as they are made so weights and gradients need not fit together), autograd through fla's chunk_kda and causal_conv1d, torch SDPA (flash,
causal) and torch._grouped_mm. Input hidden states require grad (the slice sits inside a model); the
backward is driven by a random output gradient. Weight gradients are computed (and reset, untimed,
before each repetition), no optimizer step. Timed with CUDA events (`timing.time_cuda`).
"""

from __future__ import annotations

from k3sim.calibration.wholestep import spec as S

REPS = 8


def measure_point(model, st: S.StepShape, trace: bool = True, profile: dict | None = None):
    """Timings {"fwd", "fwd_bwd"} of one point and the traced kernel list; with `profile` (a dict), one
    eager call of each phase is profiled by kernel into profile["fwd"] / profile["fwd_bwd"]."""
    import torch

    from k3sim.calibration.timing import time_cuda

    g = torch.Generator(device="cuda").manual_seed(2)
    if model.spec.embed_head:  # the whole model: token ids in, logits of every token out
        x = torch.randint(0, model.spec.vocab_local, (st.tokens,), device="cuda", generator=g)
        dy = torch.randn((st.tokens, model.spec.vocab_local), device="cuda", generator=g).to(torch.bfloat16)
    else:
        x = torch.randn((st.tokens, model.spec.hidden), device="cuda", generator=g).to(torch.bfloat16).requires_grad_(True)
        dy = torch.randn((st.tokens, model.spec.hidden), device="cuda", generator=g).to(torch.bfloat16)

    def fwd():
        return model.forward(x, st)

    def fwd_bwd():
        model.forward(x, st).backward(dy)

    def reset():
        x.grad = None
        for p in model.params:
            p.grad = None

    out = {}
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd()  # compiles fla's forward and backward kernels for this shape family
    reset()
    torch.cuda.synchronize()
    print(f"[wholestep] train T={st.chunk} mb={st.seqs}: peak {torch.cuda.max_memory_allocated() / 1e9:.1f} GB "
          f"allocated in fwd+bwd", flush=True)
    traced = model.trace(x, st) if trace else None
    if profile is not None:
        from k3sim.calibration.wholestep.decode_step import kernel_profile

        try:
            profile["fwd"] = kernel_profile(fwd)
            reset()
            profile["fwd_bwd"] = kernel_profile(fwd_bwd)
            reset()
        except Exception as err:  # noqa: BLE001
            print(f"[wholestep] kernel profile failed: {type(err).__name__}: {err}", flush=True)
    out["fwd"] = time_cuda(fwd, reps=REPS, warmup=2, budget_s=4.0)
    out["fwd_bwd"] = time_cuda(fwd_bwd, reps=REPS, warmup=2, before_each=reset, budget_s=6.0)
    reset()
    torch.cuda.empty_cache()
    return out, traced
