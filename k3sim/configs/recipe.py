"""The training recipe's named choices, without pydantic: precisions, recompute modes and modules (with the layer
parts they act on and `resolve_recompute`), the MoE glue modes, pipeline schedules and stage splits. The schema
of the `training:` section (`configs.planning`) is built from these; the memory planner and the step model read
them from here, so a serving query (decode, memory) does not build the training schemas it never validates."""

from __future__ import annotations

from typing import Any, Literal, get_args

from k3sim.errors import InputError

# The training option `moe_glue` (`k3sim.step.glue` reads it): "auto" = the model's published stack (fused
# permute kernels where the model says its stack runs them, else the measured unfused glue); "calibrated" =
# the measured unfused routing glue; "fused" = the measured fused permute / unpermute kernels; "proxy" =
# bytes only (not measured).
GlueMode = Literal["auto", "calibrated", "fused", "proxy"]
GLUE_MODES: tuple[str, ...] = get_args(GlueMode)

# Training precision of the linear layers' GEMMs: bf16, or fp8 with DeepSeek-V3's block scaling (1x128
# activation tiles, 128x128 weight blocks, fp32 promotion; arXiv 2412.19437 sec. 3.3).
Precision = Literal["bf16", "fp8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)

# Activation recompute: none, full (each layer's forward again before its backward), or selective (only the
# modules named in `recompute_modules`).
RecomputeMode = Literal["none", "full", "selective"]
RECOMPUTE_MODES: tuple[str, ...] = get_args(RecomputeMode)
RecomputeModule = Literal["norms", "mla_up_proj", "attention_core", "moe_act", "kda_core", "linear_attn_core"]
RECOMPUTE_MODULES: tuple[str, ...] = get_args(RecomputeModule)
# DeepSeek-V3's recipe (arXiv 2412.19437 sec. 3.2.3, "Recomputation of RMSNorm and MLA Up-Projection"). Its
# FP8 scheme also recomputes the MoE SwiGLU's output from a cached input (sec. 3.3.4): `moe_act`, named
# explicitly where that recipe is meant (reports/training/deployed.md).
DEEPSEEK_V3_RECOMPUTE: tuple[str, ...] = ("norms", "mla_up_proj")
# The layer part each recompute module acts on (None: every layer), here below the memory planner and the step
# model, which both refuse a module the model lacks (`k3sim.step.modules.MODULE_NEEDS` is this table).
# `attention_core` acts on every softmax-attention kind (MLA, GQA, SWA), `linear_attn_core` on every recurrent
# kind's core (chunk kernel and short conv), KDA's too: it covers `kda_core`, which stays KDA's alone.
RECOMPUTE_MODULE_NEEDS: dict[str, str | None] = {"norms": None, "mla_up_proj": "mla", "attention_core": "attention",
                                                 "moe_act": "moe", "kda_core": "kda", "linear_attn_core": "recurrent"}
RECOMPUTE_MODULE_COVERS: dict[str, tuple[str, ...]] = {"linear_attn_core": ("kda_core",)}
_NEED_LAYERS = {"mla": ("num_mla_layers", "MLA layers"), "kda": ("num_kda_layers", "KDA layers"),
                "moe": ("num_moe_layers", "MoE layers"), "attention": (None, "softmax attention layers"),
                "recurrent": (None, "recurrent (linear-attention or state-space) layers")}


def resolve_recompute(model: Any, recompute: str | None, modules: tuple[str, ...] | list[str],
                      activation_checkpointing: bool, source: str | None = None) -> tuple[str, tuple[str, ...]]:
    """(mode, modules) of a training run: `recompute` None takes the workload's `activation_checkpointing`
    (True: full, False: none), so a scenario's `training.recompute` wins over it when given; selective with no
    modules is DeepSeek-V3's recipe. Refused, naming the field: modules without `recompute: selective`, an
    unknown or repeated module, a module for a layer part the model has none of (mla_up_proj without MLA
    layers, kda_core without KDA, moe_act for a dense model). The default recipe keeps only the modules the model
    has (a model without MLA layers gets `norms` alone), so the plan never names a module it did not apply."""
    mode = recompute if recompute is not None else ("full" if activation_checkpointing else "none")
    if mode not in RECOMPUTE_MODES:
        raise InputError(f"unknown recompute mode '{mode}' (known: {', '.join(RECOMPUTE_MODES)})", source=source,
                         field="training.recompute")
    modules = tuple(modules)
    if modules and mode != "selective":
        raise InputError(f"{', '.join(modules)} given with recompute {mode} (modules act only under selective "
                         f"recompute); set training.recompute: selective, or remove it", source=source,
                         field="training.recompute_modules")
    if mode != "selective":
        return mode, ()
    for i, m in enumerate(modules):
        if m not in RECOMPUTE_MODULE_NEEDS:
            raise InputError(f"unknown recompute module '{m}' (known: {', '.join(RECOMPUTE_MODULES)})",
                             source=source, field="training.recompute_modules")
        if m in modules[:i]:
            raise InputError(f"'{m}' appears twice; give each module once", source=source,
                             field="training.recompute_modules")
        need = RECOMPUTE_MODULE_NEEDS[m]
        if not _has_part(model, need):
            raise InputError(f"'{m}' recomputes part of the {_NEED_LAYERS[need][1]} and model '{model.name}' has "
                             f"none; remove it", source=source, field="training.recompute_modules")
    return mode, modules or tuple(m for m in DEEPSEEK_V3_RECOMPUTE if _has_part(model, RECOMPUTE_MODULE_NEEDS[m]))


def _has_part(model: Any, need: str | None) -> bool:
    """Whether `model` has layers of the part a recompute module needs (None: every model); "recurrent" /
    "attention": a mixer kind whose registry entry is (or is not) recurrent."""
    if need is None:
        return True
    if _NEED_LAYERS[need][0] is not None:
        return bool(getattr(model, _NEED_LAYERS[need][0]))
    from k3sim.configs.kinds import MIXERS

    return any(MIXERS[k].recurrent == (need == "recurrent") for k in model.mixer_kinds)


# Pipeline schedules of the training step ("auto": 1F1B, interleaved 1F1B when virtual_stages > 1).
TrainSchedule = Literal["auto", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipe", "dualpipev"]
TRAIN_SCHEDULES: tuple[str, ...] = get_args(TrainSchedule)

# How layers split over pipeline stages: balanced (contiguous layers minimising the slowest stage's
# forward + backward, embedding and LM head counted) or uniform (by layer count).
StageSplit = Literal["balanced", "uniform"]
STAGE_SPLITS: tuple[str, ...] = get_args(StageSplit)
