"""Attention geometry the CP model needs, as plain numbers (per CP rank after head-parallel TP)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from k3sim.configs.mla import mla_attention_head_dims
from k3sim.errors import InputError


@dataclass(frozen=True)
class CPGeometry:
    """Heads and dims of one KDA and one MLA layer; `tp` shards heads (each CP rank holds heads/tp).

    Defaults are Kimi K3's (`models/kimi-k3.yaml`: KDA d_k = d_v = 128, conv kernel 4; MLA kv_lora_rank 512,
    qk_nope 128, qk_rope 64, v 128); d_k = d_v = 128 is also the head dim of fla's kernels and of PR #691."""

    hidden_size: int
    kda_heads: int
    kda_head_dim_k: int = 128
    kda_head_dim_v: int = 128
    conv_kernel: int = 4
    num_kda_layers: int = 0
    mla_heads: int = 0
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    num_mla_layers: int = 0
    act_bytes: float = 2.0          # bf16 activations (K, V, q, o, gates)
    tp: int = 1
    name: str = "custom"

    def __post_init__(self):
        if self.tp < 1:
            raise InputError(f"TP degree must be at least 1, got {self.tp}", source="--tp")
        for heads, kind in ((self.kda_heads, "KDA"), (self.mla_heads, "MLA")):
            if heads and heads % self.tp:
                raise InputError(f"TP={self.tp} does not divide the {heads} {kind} heads", source="--tp")

    # ---- KDA ----
    @property
    def kda_heads_per_rank(self) -> int:
        return self.kda_heads // self.tp

    @property
    def kda_conv_channels_per_rank(self) -> int:
        """q, k and v go through the short conv (K3's fused qkv conv): H (2 d_k + d_v)."""
        return self.kda_heads_per_rank * (2 * self.kda_head_dim_k + self.kda_head_dim_v)

    def kda_state_elems_per_rank(self, with_transition: bool = True) -> int:
        """[S~ | M] per rank: H d_k (d_v + d_k) elements (PR #691); S~ alone for LASP-2."""
        dk, dv = self.kda_head_dim_k, self.kda_head_dim_v
        return self.kda_heads_per_rank * dk * (dv + (dk if with_transition else 0))

    @property
    def kda_ulysses_in_elems_per_token(self) -> int:
        """What all-to-all must move into a KDA layer: q, k, v, the per-dim gate g [H, d_k] and beta [H]."""
        dk, dv = self.kda_head_dim_k, self.kda_head_dim_v
        return self.kda_heads_per_rank * (3 * dk + dv + 1)

    @property
    def kda_ulysses_out_elems_per_token(self) -> int:
        return self.kda_heads_per_rank * self.kda_head_dim_v

    # ---- MLA ----
    @property
    def mla_heads_per_rank(self) -> int:
        return self.mla_heads // self.tp

    @property
    def mla_qk_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def mla_latent_elems_per_token(self) -> int:
        """Compressed KV c_kv plus the shared rope key: 512 + 64 = 576 for K3 (the MLA KV cache)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def mla_expanded_kv_elems_per_token(self) -> int:
        """Per-head K (nope + rope) and V after up-projection: 96 (192 + 128) = 30 720 for K3."""
        return self.mla_heads_per_rank * (self.mla_qk_dim + self.v_head_dim)

    @property
    def mla_sdpa_head_dim(self) -> int:
        """The head dim an MLA attention call is priced at (the one rule, `configs.mla`: the step model's MLA
        prefill attention reads it too): max(d_qk, d_v) = 192 for K3, V padded to the QK dim."""
        return mla_attention_head_dims(self).kernel_head_dim

    def mla_kv_elems_per_token(self, kv_form: str) -> int:
        if kv_form == "latent":
            return self.mla_latent_elems_per_token
        if kv_form == "expanded":
            return self.mla_expanded_kv_elems_per_token
        raise InputError(f"unknown MLA KV form '{kv_form}' (latent | expanded)", field="mla_kv")

    @property
    def mla_ulysses_in_elems_per_token(self) -> int:
        """q, k (d_qk per head) and v (d_v per head): the latent is shared by all heads, so a head
        scatter cannot move it; Ulysses moves the expanded tensors."""
        return self.mla_heads_per_rank * (2 * self.mla_qk_dim + self.v_head_dim)

    @property
    def mla_ulysses_out_elems_per_token(self) -> int:
        return self.mla_heads_per_rank * self.v_head_dim

    @property
    def mla_up_proj_width(self) -> int:
        """Latent -> per-head K_nope and V: H (d_nope + d_v) outputs from kv_lora_rank inputs."""
        return self.mla_heads_per_rank * (self.qk_nope_head_dim + self.v_head_dim)


def kda_layer_geometry(heads: int, name: str) -> CPGeometry:
    """One KDA layer of `heads` heads of dim 128, nothing else: the setting fla's KCP benchmarks and the
    calibration harness time (hidden size H x 128; only the 4bSd ring reference reads it)."""
    return CPGeometry(hidden_size=heads * 128, kda_heads=heads, num_kda_layers=1, name=name)


def geometry_from_model(model: Any, tp: int = 1) -> CPGeometry:
    """Read a `ModelConfig` (DEVELOPING.md attribute names) into a CPGeometry, which holds KDA and MLA layers
    only: a model with another mixer kind is refused in one line, so that no consumer of the geometry (the
    training step's CP overhead, the planner's CP sweep) prices its other layers as free. Every kind:
    `cp.model_cp_step` (what `k3sim cp` runs)."""
    from k3sim.cp.kinds import GEOMETRY_KINDS

    if hasattr(model, "require_kinds"):
        model.require_kinds(GEOMETRY_KINDS, "the KDA/MLA context-parallel geometry (k3sim.cp.geometry_from_model; "
                            "`k3sim cp` prices every kind)", field="model")
    return kda_mla_geometry(model, tp)


def kda_mla_geometry(model: Any, tp: int = 1) -> CPGeometry:
    """The KDA and MLA layers of `model` as a CPGeometry (no KDA or MLA: zero layers of each); its other kinds
    are `cp.kinds`' (`model_cp_step` prices both)."""
    kda, mla = getattr(model, "kda", None), getattr(model, "mla", None)
    kw: dict[str, Any] = dict(hidden_size=model.hidden_size, tp=tp, name=getattr(model, "name", "model"),
                              num_kda_layers=model.num_kda_layers, num_mla_layers=model.num_mla_layers,
                              kda_heads=0)
    if kda is not None:
        kw.update(kda_heads=kda.num_heads, kda_head_dim_k=kda.head_dim_k, kda_head_dim_v=kda.head_dim_v,
                  conv_kernel=kda.conv_kernel_size)
    if mla is not None:
        kw.update(mla_heads=mla.num_heads, kv_lora_rank=mla.kv_lora_rank, qk_nope_head_dim=mla.qk_nope_head_dim,
                  qk_rope_head_dim=mla.qk_rope_head_dim, v_head_dim=mla.v_head_dim)
    return CPGeometry(**kw)


def default_state_dtype(model: Any) -> str:
    """The KDA recurrent-state dtype that KCP moves when the user names none: the model's own
    (`kda.state_dtype`), else fp32 as fla keeps it."""
    kda = getattr(model, "kda", None)
    return getattr(kda, "state_dtype", None) or "fp32"
