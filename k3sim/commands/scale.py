"""The serving-at-scale layout options `decode` and `serve` share (attention DP, EP, DeepEP-class kernels,
dispatch dtype, redundant experts, node-limited routing, two-batch overlap, router skew): their names, the
scenario field each one sets, and the one renaming of a refusal to the option the user can change.

A layout refusal names a `Parallelism` field (`check_layout`: "parallelism.ep", ...); the EP all-to-all
model (`k3sim.comm.ep`) names its own parameters (T, kernel, dtype_bytes, ...). Both are renamed here so the
error line says `--ep`, `--ep-kernel`, ... whichever command raised it.
"""

from __future__ import annotations

from contextlib import contextmanager

# --ep-kernel as written -> the schema's spelling (Parallelism.ep_kernel, the CLI's: low-latency with a hyphen)
EP_KERNEL_NAMES = {"auto": "auto", "normal": "normal", "low-latency": "low-latency", "low_latency": "low-latency",
                   "nccl": "nccl"}
TBO_VARIANT_NAMES = {"auto": "auto", "overlap": "overlap", "five-stage": "five-stage", "five_stage": "five-stage"}
GPUS_PER_NODE = 8  # a node of the H200/H100/H800 HGX boards: what "per node" and the EP group's nodes count
ZIPF = "--zipf/--routing-zipf"  # the option's names, as errors name it (either may be written)
# Parallelism / check_layout field (last path part) -> the option that sets it
LAYOUT_OPTIONS = {"tp": "--tp", "pp": "--pp", "ep": "--ep", "dp": "--attention-dp", "attention_dp": "--attention-dp",
                  "num_gpus": "--attention-dp", "redundant_experts": "--redundant-experts",
                  "max_nodes_per_token": "--max-nodes-per-token", "ep_kernel": "--ep-kernel",
                  "dispatch_dtype": "--dispatch-dtype", "tbo": "--tbo", "tbo_variant": "--tbo-variant",
                  "routing_zipf": ZIPF, "gpus_per_node": "--hardware", "mla_decode_kernel": "--mla-kernel"}
# EP all-to-all op parameters (k3sim.comm.ep, CONTRACTS) -> option; "T" (tokens per rank) is the batch's
# (E: the weighted routing's work bound, topk: its range; both lifted by uniform routing or fewer ranks)
EP_PARAM_OPTIONS = {"kernel": "--ep-kernel", "dtype_bytes": "--dispatch-dtype", "nodes_max": "--max-nodes-per-token",
                    "R": "--redundant-experts", "ep": "--ep", "G": "--ep", "zipf_milli": ZIPF, "E": "--ep",
                    "topk": ZIPF}
# The fields' defaults: an option left at its default does not override the scenario
UNSET = {"dp": 1, "ep": 1, "redundant_experts": 0, "ep_kernel": "auto", "dispatch_dtype": "auto",
         "max_nodes_per_token": None, "tbo": False, "tbo_variant": "auto", "routing_zipf": 0.0,
         "mla_decode_kernel": "measured"}
MLA_KERNEL_HELP = ("absorbed MLA decode: measured (the project's split-K Triton kernel, H200 runs) or flashmla "
                   "(FlashMLA, what DeepSeek/SGLang/vLLM run, from its published throughput, never slower than "
                   "measured)")


def layout_overrides(**fields) -> dict:
    """The Parallelism fields the options set (None = not given), spelled as the schema spells them."""
    out = {k: v for k, v in fields.items() if v is not None}
    if "ep_kernel" in out:
        out["ep_kernel"] = EP_KERNEL_NAMES.get(out["ep_kernel"], out["ep_kernel"])
    if "tbo_variant" in out:
        out["tbo_variant"] = TBO_VARIANT_NAMES.get(out["tbo_variant"], out["tbo_variant"])
    return out


def _raised_by_ep_model(err) -> bool:
    """The InputError came from the EP all-to-all model (`k3sim.comm.ep.EPParamError`) or from the registry's
    range check of its ops (reason prefixed by the op name): its fields are that model's parameters (T,
    kernel, dtype_bytes, ...), not the options'."""
    from k3sim.comm.ep import EPParamError

    return isinstance(err, EPParamError) or err.reason.startswith(("ep_dispatch", "ep_combine"))


def ep_option(err, given: dict[str, str], batch_option: str = "--batch") -> str | None:
    """The option behind an InputError the EP all-to-all model raised (the low-latency buffer, FP8 dispatch on
    a profile without FP8, EP past the expert slots, ...), from its field; None if it is not that model's."""
    from k3sim.errors import InputError

    # simpy re-raises a process's exception as a copy built from its message, the original as __cause__
    while err.field is None and not err.source and isinstance(err.__cause__, InputError):
        err = err.__cause__
    if err.source or not _raised_by_ep_model(err):
        return None
    f = (err.field or "").split(".")[-1]
    if f == "T":  # tokens per rank past the low-latency buffer: the kernel if the user chose it, else the batch
        return given.get("--ep-kernel", batch_option)
    return EP_PARAM_OPTIONS.get(f) or LAYOUT_OPTIONS.get(f) or "--ep"


@contextmanager
def ep_errors_named(given: dict[str, str], batch_option: str = "--batch"):
    """Rename an EP-kernel refusal raised inside the step model to the option the user can change
    (`batch_option`: what sets the tokens per rank, decode's --batch; serve's engine batches, so its kernel)."""
    from k3sim.errors import InputError

    try:
        yield
    except InputError as err:
        option = ep_option(err, given, batch_option)
        if option is None:
            raise
        origin = err.__cause__ if err.field is None and isinstance(err.__cause__, InputError) else err
        raise InputError(origin.reason, source=option) from None


@contextmanager
def layout_errors_named(overrides: dict):
    """Rename a layout refusal of a field the options overrode (`parallelism.<field>` of the scenario) to its
    option: the scenario file did not set that value, the option did."""
    from k3sim.errors import InputError

    try:
        yield
    except InputError as err:
        f = (err.field or "").split(".")[-1]
        if f in overrides and f in LAYOUT_OPTIONS:
            raise InputError(err.reason, source=LAYOUT_OPTIONS[f], field=None) from None
        raise


def checked_layout(model, hw, given: dict, *, tp: int, pp: int, ep: int, attention_dp: int, expert_kernel: str,
                   convention: str):
    """(Parallelism, StepLayout) of a serving replica spelled by command options (`given`: the serving-at-scale
    `Parallelism` fields the user set), through the one layout check (`check_layout`, mode serve, on a cluster of
    this replica's GPUs in nodes of `GPUS_PER_NODE`); a refusal names the option that set the field
    (`LAYOUT_OPTIONS`). Decode, prefill, compare and diff all build their layout here."""
    import pydantic

    from k3sim.configs.parallel import Cluster, Parallelism, check_layout
    from k3sim.errors import InputError
    from k3sim.step import StepLayout

    try:
        par = Parallelism(tp=tp, pp=pp, ep=ep, dp=attention_dp, **given)
        check_layout(model, par, mode="serve", hardware=hw,
                     cluster=Cluster(num_gpus=par.gpus, gpus_per_node=GPUS_PER_NODE))
    except pydantic.ValidationError as err:
        e = err.errors()[0]
        name = str(e["loc"][0]) if e.get("loc") else ""
        raise InputError(e.get("msg", str(err)), source=LAYOUT_OPTIONS.get(name, "--tp")) from None
    except InputError as err:
        f = (err.field or "").split(".")[-1]
        if f in LAYOUT_OPTIONS:
            raise InputError(err.reason, source=LAYOUT_OPTIONS[f], field=None) from None
        raise
    return par, StepLayout.from_parallelism(par, gpus_per_node=GPUS_PER_NODE, expert_kernel=expert_kernel,
                                            convention=convention)
