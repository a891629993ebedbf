"""`k3sim kernel-time OP --hardware h200 --set M=64 ...`: one kernel's predicted time and its source.

Every parameter is checked before any prediction against its op's range, a kind of the bounds table
(`k3sim.kernels.ops.ParamRange`, `k3sim.configs.bounds.BOUNDS`); a refusal names what the user wrote
(`--set T=0`), never the predictor's internal field.
"""

from __future__ import annotations

import difflib
from typing import List

import typer

from k3sim.errors import InputError


def parse_sets(items: list[str]) -> dict[str, str]:
    """`--set NAME=VALUE` pairs to a dict; a malformed or repeated pair is bad input."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InputError(f"expected NAME=VALUE, got {item!r}", source="--set")
        if name in out:
            raise InputError(f"parameter {name} given twice; give each --set NAME once",
                             source=f"--set {name}={value}")
        out[name] = value
    return out


CP_MODEL = "models/kimi-k3.yaml"  # `k3sim cp`'s default --model: its KDA heads / --tp give the op's H


def kcp_refusal(op: str, given: dict[str, str], hardware: str) -> InputError:
    """KCP (`chunk_kda_cp_fwd[_bwd]`) has one answer, `k3sim cp` pricing it from its parts (local chunk_kda,
    pre-process, all-gather, merge: `k3sim.cp.kcp_parts`); the refusal gives that command for the user's
    shape: T -> --seq-len, gpus -> --cp, docs -> --docs, and H -> the --tp that leaves H KDA heads per rank."""
    from k3sim.errors import shorten
    from k3sim.kernels.ops import PRICED_BY_CP

    val = {k: shorten(v, 24) for k, v in given.items()}
    cmd = ["k3sim cp", f"--hardware {shorten(hardware, 40)}" if hardware != "h200" else "",
           f"--seq-len {val.get('T', '<T>')}", f"--cp {val.get('gpus', '<gpus>')}",
           f"--docs {val['docs']}" if val.get("docs", "1") != "1" else ""]
    heads, note = _cp_model_heads(), ""
    try:
        h = int(float(given["H"])) if "H" in given else heads
    except ValueError:
        h = None
    if heads and h and heads % h == 0:
        cmd.append(f"--tp {heads // h}" if h != heads else "")
    else:
        cmd.append("--tp <N>")
        note = " (N: the model's KDA heads / H)"
    read = "kda.fwd.time_s" if PRICED_BY_CP[op] == "forward" else "kda_layer_time_s"
    return InputError(f"{op} is not a kernel op: KCP is priced from its parts by `k3sim cp --strategy kcp`; "
                      f"the equivalent: `{' '.join(c for c in cmd if c)} --strategy kcp --json`{note}, key {read}",
                      source="OP")


def _cp_model_heads() -> int | None:
    """KDA heads of `k3sim cp`'s default model (None when it cannot be read: the refusal still stands)."""
    try:
        from k3sim.configs import load_model

        kda = load_model(CP_MODEL).kda
    except InputError:
        return None
    return int(kda.num_heads) if kda is not None else None


def op_spec(op: str):
    """The op's spec; an unknown name is refused with the closest known names (the full list, 30 names,
    would pass the error line's length cap; the README lists it with each op's parameters)."""
    from k3sim.kernels.ops import OPS

    if op in OPS:
        return OPS[op]
    close = difflib.get_close_matches(op, list(OPS), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise InputError(f"unknown op {op!r}; {hint}the README ('k3sim kernel-time') lists the {len(OPS)} ops and "
                     "their parameters", source="OP")


def as_written(err: InputError, spec, sets: dict[str, str], hardware: str) -> InputError:
    """The same refusal, naming what the user typed: the predictor and the collective model name a
    parameter by its field (`T`); the user wrote `--set T=...`, or left it out (then `--set` says how to
    add it), or the field is the hardware profile's (then `--hardware` names the profile)."""
    if err.source is not None or err.field is None:
        return err
    name = str(err.field)
    if name in sets:
        return InputError(err.reason, source=f"--set {name}={sets[name]}")
    if name in spec.params or name in spec.optional:
        fix = "" if "--set" in err.reason else f"; add --set {name}=VALUE"
        return InputError(err.reason + fix, source="--set")
    return InputError(err.reason, source=f"--hardware {hardware}", field=name)


def register(app: typer.Typer) -> None:
    @app.command("kernel-time")
    def kernel_time(
        op: str = typer.Argument(..., help="Op name, e.g. gemm_bf16, chunk_kda_fwd, all_gather (README "
                                           "'k3sim kernel-time' lists every op and its parameters)."),
        hardware: str = typer.Option("h200", "--hardware", help="Profile name in hardware_profiles/ or a path."),
        sets: List[str] = typer.Option([], "--set", help="Op parameter NAME=VALUE (repeat); each is checked "
                                       "against its op's range (k3sim/configs/bounds.py) before any prediction."),
        convention: str = typer.Option("graph", "--convention",
                                       help="graph (kernel as a CUDA-graph replay runs it) or eager (+ host launch)."),
        topology: str = typer.Option("", "--topology",
                                     help="Collectives only: a topology file (gpus, links) instead of the "
                                          "profile's placement (k3sim/comm/topology.py)."),
        as_json: bool = typer.Option(False, "--json", help="Stable JSON, SI units."),
    ) -> None:
        """Predicted time of one kernel: measured, interpolated, fitted model or datasheet roofline."""
        from k3sim.kernels.ops import validate_params
        from k3sim.kernels.store import CONVENTIONS  # the predictor's list, named here for the option
        from k3sim.output import human_seconds, print_json, print_kv

        from k3sim.kernels.ops import PRICED_BY_CP

        given = parse_sets(sets)
        if op in PRICED_BY_CP:
            raise kcp_refusal(op, given, hardware)
        spec = op_spec(op)
        if convention not in CONVENTIONS:
            raise InputError(f"must be one of {', '.join(CONVENTIONS)}, got {convention!r}", source="--convention")
        if topology and spec.kind != "collective":
            raise InputError(f"applies to collectives only, not {op}", source="--topology")
        try:
            params = validate_params(spec, given)
            kt = _predict(op, params, hardware, convention, topology)
        except InputError as err:
            raise as_written(err, spec, given, hardware) from None
        result = {"op": op, "hardware": hardware, "params": params, "seconds": kt.seconds, "source": kt.source,
                  "convention": kt.convention,
                  "method": kt.method, "detail": kt.detail}
        if as_json:
            print_json(result)
            return
        print_kv(f"{op} on {hardware}", [*((k, _param_text(k, v)) for k, v in params.items()),
                                         ("time", human_seconds(kt.seconds)), ("source", kt.source),
                                         ("convention", kt.convention), ("method", kt.method), ("detail", kt.detail)])


def _param_text(name: str, value) -> str:
    """An op parameter in the table: counts with separators, a byte count with its size in binary units
    beside (the unit every table prints sizes in): bytes=1000000000 -> "1,000,000,000 (953.67 MiB)"."""
    from k3sim.output import human_bytes

    if not isinstance(value, int) or isinstance(value, bool):
        return str(value)
    return f"{value:,} ({human_bytes(value)})" if name == "bytes" else f"{value:,}"


def _predict(op: str, params: dict[str, int], hardware: str, convention: str, topology: str):
    """The prediction; a collective over `--topology` goes to the collective model directly, with the series the
    facade would pick for `convention` (`k3sim.predict.COLLECTIVE_CONVENTION`; the answer names its rows')."""
    from k3sim.predict import COLLECTIVE_CONVENTION, predict_kernel_time

    if not topology:
        return predict_kernel_time(op, params, hardware=hardware, convention=convention)
    from k3sim.comm import collective_time

    return collective_time(op, params["bytes"], params["gpus"], hardware, topology=topology,
                           gpus_per_node=params.get("gpus_per_node") or None,
                           convention=COLLECTIVE_CONVENTION[convention])
