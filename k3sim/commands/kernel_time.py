"""`k3sim kernel-time OP --hardware h200 --set M=64 ...`: one kernel's predicted time and its source."""

from __future__ import annotations

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
            raise InputError(f"parameter {name} given twice", source="--set", field=name)
        out[name] = value
    return out


def register(app: typer.Typer) -> None:
    @app.command("kernel-time")
    def kernel_time(
        op: str = typer.Argument(..., help="Op name, e.g. gemm_bf16, chunk_kda_fwd, all_gather."),
        hardware: str = typer.Option("h200", "--hardware", help="Profile name in hardware_profiles/ or a path."),
        sets: List[str] = typer.Option([], "--set", help="Op parameter NAME=VALUE (repeat)."),
        convention: str = typer.Option("graph", "--convention",
                                       help="graph (kernel as a CUDA-graph replay runs it) or eager (+ host launch)."),
        topology: str = typer.Option("", "--topology",
                                     help="Collectives only: a topology file (gpus, links) instead of the "
                                          "profile's placement (k3sim/comm/topology.py)."),
        as_json: bool = typer.Option(False, "--json", help="Stable JSON, SI units."),
    ) -> None:
        """Predicted time of one kernel: measured, interpolated, fitted model or datasheet roofline."""
        from k3sim.kernels.ops import get_op, validate_params
        from k3sim.kernels.predict import predict_kernel_time
        from k3sim.output import human_seconds, print_json, print_kv

        spec = get_op(op)
        try:
            params = validate_params(spec, parse_sets(sets))
        except InputError as err:  # a bad parameter value came in through --set: say so
            raise InputError(err.reason, source=err.source or "--set", field=err.field) from None
        from k3sim.kernels.store import CONVENTIONS  # the predictor's list, named here for the option

        if convention not in CONVENTIONS:
            raise InputError(f"must be one of {', '.join(CONVENTIONS)}, got {convention!r}", source="--convention")
        if topology:
            if spec.kind != "collective":
                raise InputError(f"applies to collectives only, not {op}", source="--topology")
            from k3sim.comm import collective_time

            kt = collective_time(op, params["bytes"], params["gpus"], hardware, topology=topology,
                                 gpus_per_node=params.get("gpus_per_node") or None, convention="barrier")
        else:
            kt = predict_kernel_time(op, params, hardware=hardware, convention=convention)
        result = {"op": op, "hardware": hardware, "params": params, "seconds": kt.seconds, "source": kt.source,
                  "convention": kt.convention,
                  "method": kt.method, "detail": kt.detail}
        if as_json:
            print_json(result)
            return
        print_kv(f"{op} on {hardware}", [*params.items(), ("time", human_seconds(kt.seconds)), ("source", kt.source),
                                         ("convention", kt.convention), ("method", kt.method), ("detail", kt.detail)])
