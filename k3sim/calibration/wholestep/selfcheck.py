"""A whole-step configuration's model checked on the GPU without timing anything (`python3 -m
k3sim.calibration.wholestep.selfcheck CONFIG [--layers N]`): the numerical self-checks (`checks.run_all`), then at
one decode point and one mixed prefill point an eager step whose traced kernel list must equal the manifest, and
the decode step captured in one CUDA graph and replayed (finite output). Prints pass / fail lines only: a harness
is made to work before its predictions are committed, and no step time of the check exists before that commit.
"""

from __future__ import annotations

import argparse
import sys

from k3sim.calibration.wholestep import spec as S

POINTS = (S.StepShape(decodes=8, context=4096), S.StepShape(decodes=4, context=4096, chunk=2048, prefix=8192),
          S.StepShape(chunk=2048))


def first_layers(spec: S.StepSpec, n: int) -> S.StepSpec:
    """The configuration with its first `n` layers (embedding and head kept): the same kernels, fewer weights."""
    return S.StepSpec.from_dict(dict(spec.to_dict(), layers=spec.layers[:n]))


def check(cfg: str, layers: int) -> bool:
    import torch

    from k3sim.calibration.wholestep import checks
    from k3sim.calibration.wholestep.decode_step import static_input
    from k3sim.calibration.wholestep.model import WholeStepModel
    from k3sim.calibration.wholestep.run import _match

    model = WholeStepModel(first_layers(S.load_specs()[cfg], layers))
    res = checks.run_all(model)
    print(f"[selfcheck] {cfg} first {layers} layers: checks {res}", flush=True)
    ok = all(not isinstance(v, str) for v in res.values())
    ok &= all(x < 3e-2 for v in res.values() if isinstance(v, dict) for x in v.values())
    ok &= all(v < 3e-2 for v in res.values() if isinstance(v, float))
    for st in POINTS:
        states = model.alloc_states(st)
        inp = static_input(model, st)
        with torch.no_grad():
            out = model.forward(inp, st, states)
            good, diff = _match(model, st, model.trace(inp, st, states))
            finite = bool(torch.isfinite(out.float()).all())
            replay = None
            if not st.chunk:
                g = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    model.forward(inp, st, states)
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(g):
                    y = model.forward(inp, st, states)
                g.replay()
                torch.cuda.synchronize()
                replay = bool(torch.isfinite(y.float()).all())
        print(f"[selfcheck] {st}: manifest_ok={good} {diff} finite={finite} graph_replay_finite={replay} "
              f"impl={model.impl}", flush=True)
        ok &= good and finite and replay is not False
        del states
        torch.cuda.empty_cache()
    print(f"[selfcheck] {cfg}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m k3sim.calibration.wholestep.selfcheck", description=__doc__)
    ap.add_argument("config")
    ap.add_argument("--layers", type=int, default=4, help="first N layers of the configuration (default 4)")
    a = ap.parse_args(argv)
    specs = S.load_specs()
    if a.config not in specs or a.layers < 1:
        print(f"error: unknown configuration {a.config!r} or --layers < 1; known: {', '.join(specs)}", file=sys.stderr)
        return 2
    return 0 if check(a.config, a.layers) else 1


if __name__ == "__main__":
    sys.exit(main())
