"""Whole-step measurement on one GPU: `python3 -m k3sim.calibration.wholestep.run --out DIR [--plan ...]`.

A plan is an ordered list of CONFIG[@KERNEL]:PART=SECONDS items (configurations in specs.json; KERNEL
grouped_bf16 or mxfp4 for the routed experts, default --expert-kernel; parts decode, prefill, train);
each item stops starting new points at its time box and a failed point is recorded
(status failed) while the run goes on. Consecutive serving items of one configuration share one built
model. Rows go to DIR/{decode,prefill,train}_step.csv as they are measured, beside provenance.yaml and
manifest.json (per configuration and part: the kernel list of one layer of each kind at the first point,
from `spec.manifest`; each CSV row says whether the kernels traced in that point's eager call equal the
CPU-side list, `manifest_ok`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from k3sim.calibration.wholestep import spec as S

PARTS = ("decode", "prefill", "train")
# Time boxes: a box stops new points, not a running one, and the first point of a part pays its fla
# compiles (smoke run 2026-12-01: chunk_kda forward family ~90 s), so the boxes leave room for that.
SERVE_PLAN = ("kimi-linear-48b:decode=120,k3-tp8-ep8-l5-8@mxfp4:decode=40,kimi-linear-48b:prefill=190,"
              "k3-tp8-ep8-l5-8@grouped_bf16:decode=30")
TRAIN_PLAN = "kimi-linear-48b-l5-8:train=240,k3-tp8-ep8-l5-8:train=230"  # fwd + bwd compiles per head count
DEFAULT_PLAN = SERVE_PLAN + "," + TRAIN_PLAN
# Qwen3-Next (issue 23 item 7): decode B 1-256 x C 4K/16K/32K (27 points) then prefill chunks 2K-32K (20 points).
# fla's GDN kernels at 16/32 heads are in the hybrid runs' Triton cache (.tcache); its conv and gated norm are not.
QWEN = "qwen3-next-80b-l1-16h"
QWEN_PLAN = f"{QWEN}:decode=170,{QWEN}:prefill=170"
PLANS = {"serve": SERVE_PLAN, "train": TRAIN_PLAN, "all": DEFAULT_PLAN, "qwen": QWEN_PLAN}  # --plan names
KERNELS = ("grouped_bf16", "mxfp4")
# Point grids (issue 10 item 6, issue 14 item 1, issue 15 item 2; the brief's values).
DECODE_B = [1, 2, 4, 8, 16, 32, 64, 128, 256]
DECODE_C = {"kimi-linear-48b": [1024, 4096, 16384, 65536], QWEN: [4096, 16384, 32768], "default": [4096, 32768]}
PREFILL_CHUNKS = [512, 1024, 2048, 4096, 8192]
CHUNKS_OF = {QWEN: [2048, 4096, 8192, 16384, 32768]}  # prefill chunks per configuration (else PREFILL_CHUNKS)
PREFILL_PREFIX = [0, 8192]
PREFILL_RIDE = [0, 32]
RIDE_CONTEXT = 4096
TRAIN_SEQ = [4096]
TRAIN_MB = [1, 2]
TRAIN_PROFILE = ["4096x1"]  # SEQxMB points whose fwd and fwd+bwd kernels are profiled


def parse_plan(text: str, specs: dict, default_kernel: str = "grouped_bf16") -> list[tuple[str, str, str, float]]:
    """-> [(config, expert kernel, part, seconds)]; training always runs bf16 grouped experts."""
    from k3sim.errors import InputError

    text = PLANS.get(text, text)
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        head, _, secs = item.partition("=")
        cfg, _, part = head.partition(":")
        cfg, _, kernel = cfg.partition("@")
        kernel = kernel or default_kernel
        if kernel not in KERNELS:
            raise InputError(f"unknown expert kernel {kernel!r} in {item!r}; choose from {', '.join(KERNELS)}",
                             source="--plan", field="kernel")
        if cfg not in specs:
            raise InputError(f"unknown configuration {cfg!r}; known: {', '.join(specs)}", source="--plan", field="config")
        if part not in PARTS:
            raise InputError(f"unknown part {part!r} in {item!r}; choose from {', '.join(PARTS)}", source="--plan", field="part")
        try:
            s = float(secs)
        except ValueError:
            raise InputError(f"expected CONFIG:PART=SECONDS, got {item!r}", source="--plan") from None
        if not 0 < s < float("inf"):
            raise InputError(f"time box must be a positive number of seconds, got {item!r}", source="--plan")
        out.append((cfg, "grouped_bf16" if part == "train" else kernel, part, s))
    if not out:
        raise InputError("empty plan", source="--plan")
    return out


def int_list(text: str, option: str) -> list[int]:
    from k3sim.errors import InputError

    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}", source=option) from None
    if not vals or any(v < 0 for v in vals):
        raise InputError(f"expected non-negative integers, got {text!r}", source=option)
    return vals


def _match(model, st, traced: list[dict]) -> tuple[bool, str]:
    want = S.sequence(model.spec, st, model.expert_kernel)
    if traced == want:
        return True, ""
    for i, (a, b) in enumerate(zip(traced, want)):
        if a != b:
            return False, f"op {i}: traced {a} vs manifest {b}"
    return False, f"traced {len(traced)} ops vs manifest {len(want)}"


class Runner:
    def __init__(self, a, specs):
        self.a, self.specs = a, specs
        self.out = Path(a.out)
        self.writers: dict = {}
        self.manifest: dict = {}
        self.model = None
        self.model_key = None
        self._profiled: set = set()

    def writer(self, part):
        from k3sim.calibration.records import OpWriter

        if part not in self.writers:
            cols = {"decode": ["config", "B", "C", "timer"],
                    "prefill": ["config", "chunk", "prefix", "decodes", "decode_context"],
                    "train": ["config", "seq", "micro_batch", "phase"]}[part]
            self.writers[part] = OpWriter(self.out, f"{part}_step", cols,
                                          ["expert_kernel", "tokens", "manifest_ok", "manifest_diff", "impl"])
        return self.writers[part]

    def get_model(self, cfg: str, kernel: str, grad: bool):
        import torch

        from k3sim.calibration.wholestep.model import WholeStepModel

        key = (cfg, kernel, grad)
        if self.model_key != key:
            self.model = None
            torch.cuda.empty_cache()
            t0 = time.monotonic()
            # the whole model's weights and gradients do not fit together: gradients dropped as made
            self.model = WholeStepModel(self.specs[cfg], expert_kernel=kernel, grad=grad,
                                        free_grads=grad and self.specs[cfg].embed_head)
            torch.cuda.synchronize()
            self.model_key = key
            print(f"[wholestep] built {cfg} ({kernel}, grad={grad}) in {time.monotonic() - t0:.1f}s; "
                  f"{torch.cuda.memory_allocated() / 1e9:.1f} GB allocated", flush=True)
            if self.a.check:
                self.checks(self.model)
        return self.model

    def checks(self, model):
        """Numerical self-checks on small inputs: grouped-GEMM MoE vs a per-expert loop; the MLA decode
        kernel in use vs the torch reference. Printed and kept in the manifest."""
        from k3sim.calibration.wholestep import checks

        res = checks.run_all(model)
        print(f"[wholestep] checks {model.spec.name}: {res}", flush=True)
        self.manifest.setdefault(model.spec.name, {})["checks"] = res

    PROFILE_AT = {"decode": (1, 8, 64, 256), "prefill": (512, 2048, 8192, 32768)}  # points whose kernels are profiled

    def profile_this(self, cfg, part, x) -> bool:
        """One eager call per (config, part, x) at the first context gets a per-kernel GPU-time profile."""
        key = (cfg, part, x)
        if x not in self.PROFILE_AT.get(part, ()) or key in self._profiled:
            return False
        self._profiled.add(key)
        return True

    def write_profile(self, prof, base: dict) -> None:
        """Append the kernels of one profiled call to kernels.csv (config, point, kernel, calls, gpu_s)."""
        if not prof:
            return
        import csv

        path = self.out / "kernels.csv"
        new = not path.exists()
        cols = ["config", "part", "expert_kernel", "B", "C", "chunk", "prefix", "decodes", "seq", "micro_batch",
                "phase", "kernel", "calls", "gpu_s"]
        with path.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            if new:
                w.writeheader()
            for r in prof:
                w.writerow({**{k: base.get(k, "") for k in cols}, **r})

    def note_manifest(self, cfg, kernel, part, st):
        d = self.manifest.setdefault(cfg, {})
        name = part if part == "train" else f"{part}@{kernel}"
        if name not in d:
            d[name] = S.manifest(self.specs[cfg], st, kernel)

    def extras(self, model, st, traced):
        ok, diff = _match(model, st, traced) if traced is not None else ("", "")
        impl = ";".join(f"{k}={v}" for k, v in sorted(model.impl.items()))
        return dict(expert_kernel=model.expert_kernel, tokens=st.tokens, manifest_ok=ok, manifest_diff=diff, impl=impl)

    # ------------------------------------------------------------------ parts
    def decode(self, cfg, kernel, deadline):
        import torch

        from k3sim.calibration.wholestep import decode_step

        model = self.get_model(cfg, kernel, grad=False)
        w = self.writer("decode")
        want = [(st.decodes, st.context) for st in item_points(self.a, cfg, "decode")]
        batches = sorted({b for b, _ in want})
        contexts = list(dict.fromkeys(c for _, c in want))
        pools = S.plan_pools(model.spec, batches, contexts, decode_step.free_bytes())
        planned = [p for pts, _, _ in pools for p in pts]
        for b, c in (p for p in want if p not in planned):
            w.failed(dict(config=cfg, B=b, C=c, timer="graph"), "skipped: MLA cache + KDA state do not fit beside the weights")
        n = 0
        for pts, max_b, cache_tokens in pools:
            if time.monotonic() > deadline:
                for b, c in pts:
                    w.failed(dict(config=cfg, B=b, C=c, timer="graph"), "skipped: part time budget exhausted")
                continue
            pool = model.decode_pool(max_b, cache_tokens)
            n += self._decode_points(model, cfg, kernel, pts, pool, w, deadline)
            del pool
            torch.cuda.empty_cache()
        return n

    def _decode_points(self, model, cfg, kernel, pts, pool, w, deadline):
        import torch

        from k3sim.calibration.wholestep import decode_step

        n = 0
        for b, c in pts:  # noqa: B007
            st = S.StepShape(decodes=b, context=c)
            self.note_manifest(cfg, kernel, "decode", st)
            base = dict(config=cfg, B=b, C=c)
            if time.monotonic() > deadline:
                w.failed(dict(base, timer="graph"), "skipped: part time budget exhausted")
                continue
            try:
                prof = [] if self.profile_this(cfg, "decode", b) else None
                res, traced = decode_step.measure_point(model, st, pool, trace=not self.a.no_trace, profile=prof)
                self.write_profile(prof, dict(config=cfg, part="decode", expert_kernel=kernel, B=b, C=c))
                ex = self.extras(model, st, traced)
                for timer, t in res.items():
                    w.ok(dict(base, timer=timer), t, **ex)
                n += 1
                g = res.get("graph")
                print(f"[wholestep] decode {cfg} B={b} C={c}: graph {g.seconds * 1e3 if g else float('nan'):.3f} ms, "
                      f"eager {res['eager_events'].seconds * 1e3:.3f} ms, manifest_ok={ex['manifest_ok']}", flush=True)
            except Exception as err:  # noqa: BLE001 - recorded, the run goes on
                w.failed(dict(base, timer="graph"), err)
                print(f"[wholestep] decode {cfg} B={b} C={c} failed: {type(err).__name__}: {err}", flush=True)
                torch.cuda.empty_cache()
        return n

    def prefill(self, cfg, kernel, deadline):
        import torch

        from k3sim.calibration.wholestep import prefill_step

        model = self.get_model(cfg, kernel, grad=False)
        w = self.writer("prefill")
        n = 0
        for st in item_points(self.a, cfg, "prefill"):
            self.note_manifest(cfg, kernel, "prefill", st)
            base = dict(config=cfg, chunk=st.chunk, prefix=st.prefix, decodes=st.decodes, decode_context=st.context)
            what = f"prefill {cfg} chunk={st.chunk} prefix={st.prefix} decodes={st.decodes}"
            if time.monotonic() > deadline:
                w.failed(base, "skipped: part time budget exhausted")
                continue
            try:
                prof = [] if self.profile_this(cfg, "prefill", st.chunk) and st.prefix == 0 else None
                t, traced = prefill_step.measure_point(model, st, trace=not self.a.no_trace, profile=prof)
                self.write_profile(prof, dict(config=cfg, part="prefill", expert_kernel=kernel, chunk=st.chunk,
                                              prefix=st.prefix, decodes=st.decodes))
                ex = self.extras(model, st, traced)
                w.ok(base, t, **ex)
                n += 1
                print(f"[wholestep] {what}: {t.seconds * 1e3:.3f} ms, manifest_ok={ex['manifest_ok']}", flush=True)
            except Exception as err:  # noqa: BLE001
                w.failed(base, err)
                print(f"[wholestep] {what} failed: {type(err).__name__}: {err}", flush=True)
                torch.cuda.empty_cache()
        return n

    def train(self, cfg, kernel, deadline):
        import torch

        from k3sim.calibration.wholestep import train_step

        model = self.get_model(cfg, kernel, grad=True)
        w = self.writer("train")
        n = 0
        for st in item_points(self.a, cfg, "train"):
            mb, seq = st.seqs, st.chunk
            self.note_manifest(cfg, kernel, "train", st)
            base = dict(config=cfg, seq=seq, micro_batch=mb)
            if time.monotonic() > deadline:
                w.failed(dict(base, phase="fwd_bwd"), "skipped: part time budget exhausted")
                continue
            try:
                prof = {} if f"{seq}x{mb}" in self.a.profile_train else None
                res, traced = train_step.measure_point(model, st, trace=not self.a.no_trace, profile=prof)
                ex = self.extras(model, st, traced)
                for phase, t in res.items():
                    w.ok(dict(base, phase=phase), t, **ex)
                for phase, rows in (prof or {}).items():
                    self.write_profile(rows, dict(base, part="train", expert_kernel=kernel, phase=phase))
                n += 1
                print(f"[wholestep] train {cfg} T={seq} mb={mb}: fwd {res['fwd'].seconds * 1e3:.2f} ms, "
                      f"fwd+bwd {res['fwd_bwd'].seconds * 1e3:.2f} ms, manifest_ok={ex['manifest_ok']}"
                      f"{', profiled' if prof else ''}", flush=True)
            except Exception as err:  # noqa: BLE001
                w.failed(dict(base, phase="fwd_bwd"), err)
                print(f"[wholestep] train {cfg} T={seq} mb={mb} failed: {type(err).__name__}: {err}", flush=True)
                torch.cuda.empty_cache()
        return n


def item_points(a, cfg: str, part: str) -> list[S.StepShape]:
    """The step shapes a plan item measures, in order (decode: before the memory filter)."""
    if part == "decode":
        contexts = a.contexts or DECODE_C.get(cfg, DECODE_C["default"])
        return [S.StepShape(decodes=b, context=c) for c in contexts for b in (a.batches or DECODE_B)]
    if part == "prefill":
        chunks = a.chunks or CHUNKS_OF.get(cfg, PREFILL_CHUNKS)
        return [S.StepShape(decodes=r, context=a.ride_context if r else 0, chunk=ch, prefix=p)
                for r in a.ride_decodes for p in a.prefixes for ch in chunks]
    if getattr(a, "train_points", None):
        return [S.StepShape(chunk=q, seqs=mb, train=True) for q, mb in a.train_points.get(cfg, [])]
    return [S.StepShape(chunk=q, seqs=mb, train=True) for q in a.seq for mb in a.micro_batches]


def write_manifest_only(a) -> Path:
    """CPU side, no torch: for every plan item its points and the kernel list of one layer of each kind
    at the first point, so a step model can be checked op by op before the device run."""
    from k3sim.files import atomic_write_text

    specs = S.load_specs(Path(a.specs) if a.specs else S.SPECS_PATH)
    out = Path(a.out)
    doc: dict = {}
    for cfg, kernel, part, _ in parse_plan(a.plan, specs, a.expert_kernel):
        pts = item_points(a, cfg, part)
        name = part if part == "train" else f"{part}@{kernel}"
        doc.setdefault(cfg, {})[name] = dict(S.manifest(specs[cfg], pts[0], kernel),
                                             points=[asdict(p) for p in pts])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "manifest.json", json.dumps(doc, indent=1) + "\n")
    return out


def run(a) -> Path:
    from k3sim.calibration.records import provenance, write_provenance
    from k3sim.files import atomic_write_text

    specs = S.load_specs(Path(a.specs) if a.specs else S.SPECS_PATH)
    plan = parse_plan(a.plan, specs, a.expert_kernel)
    try:
        import torch
    except ImportError:
        from k3sim.errors import InputError

        raise InputError("the whole-step measurement needs PyTorch with CUDA and fla-core", source="wholestep run",
                         field="torch") from None
    if not torch.cuda.is_available():
        from k3sim.errors import InputError

        raise InputError("no CUDA GPU visible", source="wholestep run", field="gpu")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    info = provenance(" ".join(shlex.quote(x) for x in sys.argv), 1, sorted({p for _, _, p, _ in plan}))
    info["plan"] = PLANS.get(a.plan, a.plan)
    info["expert_kernel"] = a.expert_kernel
    info["timing_wholestep"] = ("decode: graph = CUDA-event time of one CUDA-graph replay of the whole step "
                                "(L2 flushed before each, median); eager_events = same step launched op by op "
                                "after a GPU sleep; eager_wall = host wall time of a synchronised eager step. "
                                "prefill/train: eager, CUDA events after a GPU sleep (timing.time_cuda)")
    write_provenance(out, info)
    r = Runner(a, specs)
    start = time.monotonic()
    for cfg, kernel, part, secs in plan:
        t0 = time.monotonic()
        try:
            n = getattr(r, part)(cfg, kernel, t0 + secs)
        except Exception as err:  # noqa: BLE001 - e.g. the model does not build: next item
            n = 0
            print(f"[wholestep] {cfg}@{kernel}:{part} failed: {type(err).__name__}: {err}", flush=True)
        print(f"[wholestep] {cfg}@{kernel}:{part}: {n} points in {time.monotonic() - t0:.0f}s", flush=True)
        atomic_write_text(out / "manifest.json", json.dumps(r.manifest, indent=1, default=str) + "\n")
    for w in r.writers.values():
        w.close()
    r.model = None
    info["elapsed_s"] = round(time.monotonic() - start, 1)
    write_provenance(out, info)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m k3sim.calibration.wholestep.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="run directory (created)")
    ap.add_argument("--plan", default="all", help="serve | train | all | qwen | CONFIG[@KERNEL]:PART=SECONDS,... in order")
    ap.add_argument("--specs", default="", help="specs JSON (default: specs.json beside this module)")
    ap.add_argument("--expert-kernel", default="grouped_bf16", choices=list(KERNELS),
                    help="routed-expert kernel of plan items without @KERNEL")
    ap.add_argument("--batches", default="", help="decode batch sizes (default 1..256)")
    ap.add_argument("--contexts", default="", help="decode contexts (default per configuration)")
    ap.add_argument("--chunks", default="", help=f"prefill chunks (default per configuration: {PREFILL_CHUNKS}, "
                                                 f"Qwen3-Next {CHUNKS_OF[QWEN]})")
    ap.add_argument("--prefixes", default=",".join(map(str, PREFILL_PREFIX)))
    ap.add_argument("--ride-decodes", default=",".join(map(str, PREFILL_RIDE)))
    ap.add_argument("--ride-context", type=int, default=RIDE_CONTEXT)
    ap.add_argument("--seq", default=",".join(map(str, TRAIN_SEQ)), help="training sequence lengths")
    ap.add_argument("--micro-batches", default=",".join(map(str, TRAIN_MB)))
    ap.add_argument("--train-points", default="",
                    help="CONFIG:SEQxMB,... training points per configuration (instead of --seq x --micro-batches)")
    ap.add_argument("--profile-train", default=",".join(TRAIN_PROFILE),
                    help="SEQxMB training points whose kernels are profiled (fwd and fwd+bwd)")
    ap.add_argument("--check", action="store_true", help="numerical self-checks after each model build")
    ap.add_argument("--no-trace", action="store_true", help="skip the per-point kernel-list check")
    ap.add_argument("--manifest-only", action="store_true",
                    help="write DIR/manifest.json (points and kernel lists of the plan) without a GPU, and stop")
    return ap


def parse_args(argv: list[str] | None = None):
    """Parsed and validated arguments (InputError on bad values); no torch needed."""
    from k3sim.errors import InputError

    a = build_parser().parse_args(argv)
    a.batches = int_list(a.batches, "--batches") if a.batches else []
    a.contexts = int_list(a.contexts, "--contexts") if a.contexts else []
    a.chunks = int_list(a.chunks, "--chunks") if a.chunks else []
    a.prefixes = int_list(a.prefixes, "--prefixes")
    a.ride_decodes = int_list(a.ride_decodes, "--ride-decodes")
    a.micro_batches = int_list(a.micro_batches, "--micro-batches")
    a.seq = int_list(a.seq, "--seq")
    a.profile_train = [x.strip() for x in a.profile_train.split(",") if x.strip()]
    for x in a.profile_train:
        q, _, m = x.partition("x")
        if not (q.isdigit() and m.isdigit() and int(q) > 0 and int(m) > 0):
            raise InputError(f"expected positive SEQxMB points like 4096x1, got {x!r}", source="--profile-train")
    tp: dict = {}
    for x in (x.strip() for x in a.train_points.split(",") if x.strip()):
        cfg, _, sm = x.partition(":")
        q, _, m = sm.partition("x")
        if not (cfg and q.isdigit() and m.isdigit() and int(q) > 0 and int(m) > 0):
            raise InputError(f"expected CONFIG:SEQxMB points like k3-tp8-ep8-l5-8:4096x1, got {x!r}",
                             source="--train-points")
        tp.setdefault(cfg, []).append((int(q), int(m)))
    a.train_points = tp
    for opt, vals in (("--batches", a.batches), ("--contexts", a.contexts), ("--chunks", a.chunks),
                      ("--micro-batches", a.micro_batches), ("--seq", a.seq)):
        if any(v == 0 for v in vals):
            raise InputError(f"values must be positive, got {vals}", source=opt)
    for opt, v in (("--ride-context", a.ride_context),):
        if v <= 0:
            raise InputError(f"must be positive, got {v}", source=opt)
    specs = S.load_specs(Path(a.specs) if a.specs else S.SPECS_PATH)
    plan = parse_plan(a.plan, specs, a.expert_kernel)
    trained = {c for c, _, part, _ in plan if part == "train"}
    for cfg in a.train_points:
        if cfg not in trained:
            raise InputError(f"{cfg!r} is not a training item of the plan (trained: {', '.join(sorted(trained)) or 'none'})",
                             source="--train-points")
    return a


def main(argv: list[str] | None = None) -> int:
    from k3sim.errors import InputError

    try:
        a = parse_args(argv)
        out = write_manifest_only(a) if a.manifest_only else run(a)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[wholestep] results in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
