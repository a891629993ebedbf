"""The layout one step runs under.

Serving layouts (vLLM / SGLang style): attention heads split over `tp` ranks; routed experts split over
`ep` ranks of the same stage; `attention_dp` replicas of attention each take their own batch (DP
attention), their tokens meeting in the experts through all-to-all; `pp` stages in sequence. Which layers
a stage holds, and how weights shard, come from the memory planner (`k3sim.memory.layout`), so the bytes a
step streams are the bytes the memory plan places.
"""

from __future__ import annotations

from dataclasses import dataclass

EXPERT_KERNELS = ("auto", "mxfp4_token", "grouped_bf16", "grouped_fp8", "deepgemm_fp8")
CONVENTIONS = ("graph", "eager")
# Expert-parallel all-to-all kernels (k3sim.comm.ep): DeepEP's normal (hierarchical, prefill/training) and
# low-latency (direct RDMA, decode) kernels, or NCCL's all_to_all; "auto" = low_latency for a decode-only
# batch, normal otherwise (SGLang's `--moe-a2a-backend deepep --deepep-mode auto`).
EP_KERNELS = ("auto", "normal", "low_latency", "nccl")
DISPATCH_DTYPES = ("auto", "fp8", "bf16")  # auto: fp8 where the profile has FP8 tensor cores
# Two-batch overlap schedules (k3sim.step.forward): SGLang's prefill overlap, DeepSeek's five-stage decode
# pipeline; auto = five_stage for a decode-only batch, overlap with prefill
TBO_VARIANTS = ("auto", "overlap", "five_stage")
# Absorbed MLA decode: the project's measured split-K Triton kernel, or FlashMLA (what DeepSeek, SGLang and vLLM
# run) from its published throughput, capped by the measured kernel (k3sim.kernels.published)
MLA_DECODE_KERNELS = ("measured", "flashmla")


@dataclass(frozen=True)
class StepLayout:
    """Parallel degrees of one replica and the kernel choices of its step.

    expert_kernel: "auto" takes the fastest routed-expert kernel the profile predicts for the model's
    weight format (token-centric MXFP4 streaming, or a tile-centric grouped GEMM); the others force one.
    convention: "graph" (a serving step is one CUDA graph: no host launch between kernels) or "eager"
    (each kernel also pays its host launch time).
    fuse_router: the latent down-projection and the router share one GEMM (same input x), as K3 does.
    replicated_down_proj: MLA's q_a/kv_a and LatentMoE's down/up projections whole on every TP rank
    (vLLM's ReplicatedLinear: no gather, more weight bytes) instead of sharded with their all-gather /
    reduce-scatter (K3's design, MISSION sec. 4, and the memory planner's placement).
    ep_kernel / dispatch_dtype: the expert-parallel all-to-all (`EP_KERNELS`, `DISPATCH_DTYPES`; combine is
    always bf16, as DeepEP's). redundant_experts: extra expert slots spread over the EP ranks (EPLB), so EP
    need not divide the routed experts. max_nodes_per_token: node-limited routing (DeepSeek-V3: 4), None =
    unlimited. tbo: two-batch overlap (two micro-batches, one's compute against the other's all-to-all);
    tbo_variant: its schedule (`TBO_VARIANTS`). mla_decode_kernel: `MLA_DECODE_KERNELS`.
    routing_zipf / routing_seed: the routing distribution the expert load and all-to-all bytes are drawn
    from (0 = uniform; Zipf exponent over a seeded ranking of the experts).
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    attention_dp: int = 1
    expert_kernel: str = "auto"
    convention: str = "graph"
    gpus_per_node: int = 8
    fuse_router: bool = True
    replicated_down_proj: bool = False
    ep_kernel: str = "auto"
    dispatch_dtype: str = "auto"
    redundant_experts: int = 0
    max_nodes_per_token: int | None = None
    tbo: bool = False
    tbo_variant: str = "auto"
    mla_decode_kernel: str = "measured"
    routing_zipf: float = 0.0
    routing_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "attention_dp", "gpus_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.expert_kernel not in EXPERT_KERNELS:
            raise ValueError(f"expert_kernel must be one of {', '.join(EXPERT_KERNELS)}")
        if self.convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}")
        if self.ep_kernel not in EP_KERNELS:
            raise ValueError(f"ep_kernel must be one of {', '.join(EP_KERNELS)}")
        if self.dispatch_dtype not in DISPATCH_DTYPES:
            raise ValueError(f"dispatch_dtype must be one of {', '.join(DISPATCH_DTYPES)}")
        if self.tbo_variant not in TBO_VARIANTS:
            raise ValueError(f"tbo_variant must be one of {', '.join(TBO_VARIANTS)}")
        if self.mla_decode_kernel not in MLA_DECODE_KERNELS:
            raise ValueError(f"mla_decode_kernel must be one of {', '.join(MLA_DECODE_KERNELS)}")

    @property
    def stage_gpus(self) -> int:
        """GPUs of one pipeline stage: attention TP x attention DP (experts spread over these)."""
        return self.tp * self.attention_dp

    @property
    def gpus(self) -> int:
        return self.stage_gpus * self.pp

    def parallelism(self):
        """The memory planner's view of this layout (attention DP is its `dp`)."""
        from k3sim.configs.parallel import Parallelism

        return Parallelism(tp=self.tp, pp=self.pp, ep=self.ep, dp=self.attention_dp,
                           redundant_experts=self.redundant_experts)

    @classmethod
    def from_parallelism(cls, par, *, gpus_per_node: int = 8, **kw) -> "StepLayout":
        """The serving step layout of a scenario's `Parallelism` (its dp is attention DP; the schema spells
        the low-latency kernel with a hyphen, as the CLI does). `kw`: kernel choices (expert_kernel, ...)."""
        return cls(tp=par.tp, pp=par.pp, ep=par.ep, attention_dp=par.dp, gpus_per_node=gpus_per_node,
                   ep_kernel=par.ep_kernel.replace("-", "_"), dispatch_dtype=par.dispatch_dtype,
                   redundant_experts=par.redundant_experts, max_nodes_per_token=par.max_nodes_per_token,
                   tbo=par.tbo, tbo_variant=par.tbo_variant.replace("-", "_"), routing_zipf=par.routing_zipf,
                   mla_decode_kernel=par.mla_decode_kernel, **kw)

    def for_hardware(self, hw) -> "StepLayout":
        """This layout with the profile's choices made: "auto" dispatch dtype -> fp8 where the profile has
        an FP8 peak (FP8 tensor cores quantise the tokens; DeepSeek-V3 dispatches FP8, arXiv 2412.19437
        sec. 3.3), else bf16; fp8 asked of a profile without FP8 is refused."""
        from dataclasses import replace

        from k3sim.errors import InputError

        fp8 = bool((getattr(hw, "peak_flops_per_s", None) or {}).get("fp8"))
        if self.dispatch_dtype == "auto":
            return replace(self, dispatch_dtype="fp8" if fp8 else "bf16")
        if self.dispatch_dtype == "fp8" and not fp8:
            raise InputError(f"profile '{hw.name}' has no FP8 peak, so it cannot quantise the dispatch: "
                             "use dispatch dtype bf16 (or auto)", field="dispatch_dtype")
        return self

    def stage_layers(self, num_layers: int) -> list[list[int]]:
        """0-based layers of each pipeline stage, split as the memory planner splits them."""
        from k3sim.memory.layout import chunk_layers

        return chunk_layers(num_layers, self.pp)
