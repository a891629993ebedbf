"""Vision encoder (ViT) cost per micro-batch, with encoder context parallelism (gather-KV).

Cost of one image of T patches on one GPU, per ViT layer, from the kernel predictor:
- projections and MLP: `gemm_bf16` (QKV T x 3h x h, output T x h x h, MLP up T x (2 if gated) i x h,
  down T x h x i), plus the patch embedding once (T x h x 3 * patch^2);
- attention is bidirectional within the image: we take 2 x `sdpa_causal_fwd(T, heads, h/heads)`
  (a bidirectional pass does twice the FLOPs of a causal one; a FLOP-scaled modelling choice, since
  the profile measures only causal attention);
- backward: GEMMs 2 x forward (input and weight gradient have the forward's FLOPs), attention from the
  measured `sdpa_causal_fwd_bwd` minus the forward, times 2 as above.
Encoder CP (gather-KV): an image split over c GPUs holds T/c patches per GPU; its GEMMs run on T/c
rows, its attention on T/c queries against all T keys (1/c of the FLOPs), after an `all_gather` of
K and V (T/c x 2h bf16 per rank) per layer; the backward reduce-scatters dK/dV (same bytes).

The encoder of one micro-batch runs on the G GPUs of one pipeline stage. Three ways to spread its
images over them:
- none: whole images, greedy longest-first onto the least-loaded GPU;
- fixed: every image split over all G GPUs;
- dynamic: K3's subgroups (MISSION sec. 6): for a patches-per-GPU threshold, an image of T patches
  gets the smallest power-of-two CP degree c with T / c <= threshold (at most G), and images are placed
  longest-first on the aligned subgroup of c GPUs whose busiest member is least loaded; thresholds
  from (all patches) / G^2 to all patches, and infinity, are tried and the smallest busiest-GPU time
  kept. The two extremes are `fixed` and `none`, so dynamic is never slower than either.
Reported: the time (the busiest GPU), load imbalance (max / mean GPU load) and communication share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from k3sim.errors import InputError

CP_MODES = ("none", "fixed", "dynamic")
MAX_IMAGES = 10_000       # per micro-batch: a resource limit (images are held in lists), not a physical one
BF16 = 2


@dataclass(frozen=True)
class ImageCost:
    forward_s: float
    backward_s: float
    comm_forward_s: float
    comm_backward_s: float


@dataclass(frozen=True)
class EncoderStep:
    """One micro-batch's images on G GPUs."""

    forward_s: float           # busiest GPU, forward (compute + gather-KV)
    backward_s: float          # busiest GPU, backward
    imbalance: float           # max / mean GPU load (forward + backward)
    comm_share: float          # communication seconds / all seconds, over the G GPUs
    image_tokens: int
    busiest_s: float = 0.0     # forward + backward of the busiest GPU (what the dynamic mode minimises)


class ViTCost:
    """Memoised per-(tokens, cp) image cost for one model and hardware."""

    def __init__(self, vision: Any, hw: Any, kernel_time: Callable | None = None):
        if kernel_time is None:
            from k3sim.predict import predict_kernel_time as kernel_time
        self.v, self.hw, self.kt = vision, hw, kernel_time
        self._image = lru_cache(maxsize=None)(self._image_uncached)

    def _t(self, op: str, params: dict) -> float:
        return self.kt(op, params, hardware=self.hw).seconds

    def _image_uncached(self, tokens: int, cp: int) -> ImageCost:
        v = self.v
        h, i, heads = v.hidden_size, v.intermediate_size, v.num_heads
        rows = max(1, math.ceil(tokens / cp))
        up = i * (2 if v.mlp_gated else 1)
        gemm = (self._t("gemm_bf16", {"M": rows, "N": 3 * h, "K": h})
                + self._t("gemm_bf16", {"M": rows, "N": h, "K": h})
                + self._t("gemm_bf16", {"M": rows, "N": up, "K": h})
                + self._t("gemm_bf16", {"M": rows, "N": h, "K": i}))
        att_params = {"T": tokens, "H": heads, "D": h // heads}
        att_f = 2 * self._t("sdpa_causal_fwd", att_params) / cp
        att_fb = 2 * self._t("sdpa_causal_fwd_bwd", att_params) / cp
        att_b = max(0.0, att_fb - att_f)
        comm = 0.0
        if cp > 1:
            shard = rows * 2 * h * BF16
            comm = self._t("all_gather", {"bytes": shard, "gpus": cp})
            comm_b = self._t("reduce_scatter", {"bytes": shard, "gpus": cp})
        else:
            comm_b = 0.0
        embed = self._t("gemm_bf16", {"M": rows, "N": h, "K": v.num_channels * v.patch_size ** 2})
        L = v.num_layers
        fwd = embed + L * (gemm + att_f)
        bwd = 2 * embed + L * (2 * gemm + att_b)
        return ImageCost(fwd + L * comm, bwd + L * comm_b, L * comm, L * comm_b)

    def image(self, tokens: int, cp: int = 1) -> ImageCost:
        return self._image(int(tokens), int(cp))


def patches(width_px: int, height_px: int, patch: int) -> int:
    return math.ceil(width_px / patch) * math.ceil(height_px / patch)


def sample_images(m: int, seed: int, *, mean_images: float = 4.0, min_side_px: int = 224,
                  max_side_px: int = 2048) -> list[list[tuple[int, int]]]:
    """Seeded image sizes (width, height in pixels) per micro-batch. Modelling choice, not measured:
    images per micro-batch 1 + Poisson(mean_images - 1); each side log-uniform in [min, max] pixels
    (documents and screenshots make the tail long; no public size distribution of K3's data)."""
    import numpy as np

    if not (m >= 1 and 1 <= mean_images <= MAX_IMAGES and 1 <= min_side_px <= max_side_px):
        raise InputError(f"image sampler needs 1 <= images per micro-batch <= {MAX_IMAGES:,}, got {mean_images}",
                         source="--images-per-microbatch")
    rng = np.random.default_rng(seed)
    out = []
    lo, hi = math.log(min_side_px), math.log(max_side_px)
    for _ in range(m):
        n = 1 + int(rng.poisson(mean_images - 1))
        sides = np.exp(rng.uniform(lo, hi, size=(n, 2))).astype(int)
        out.append([(int(w), int(h)) for w, h in sides])
    return out


def _powers_of_two_upto(g: int) -> list[int]:
    out, c = [], 1
    while c <= g:
        out.append(c)
        c *= 2
    return out


def _degree(tokens: int, threshold: float, gpus: int) -> int:
    """Smallest power-of-two CP degree that brings an image's patches per GPU to `threshold`, <= gpus."""
    c = 1
    while tokens / c > threshold and c * 2 <= gpus:
        c *= 2
    return c


def _thresholds(total_tokens: int, gpus: int) -> list[float]:
    """Patches-per-GPU thresholds tried by the dynamic mode: 0 (every image over all G: `fixed`), the
    balanced share total / G times powers of two from 1/G to G, and infinity (every image whole: `none`)."""
    share = total_tokens / gpus
    out, k = [0.0], 1.0 / gpus
    while k <= gpus:
        out.append(share * k)
        k *= 2
    return out + [float("inf")]


def _spread(vit: "ViTCost", image_tokens: list[int], gpus: int, degrees: list[int]):
    """Longest image first onto the aligned subgroup of its degree whose busiest GPU is least loaded."""
    load_f = [0.0] * gpus
    load_b = [0.0] * gpus
    comm = 0.0
    jobs = []
    for t, c in zip(image_tokens, degrees):
        ic = vit.image(t, c)
        jobs.append((ic.forward_s + ic.backward_s, c, ic))
    jobs.sort(key=lambda j: -j[0])
    for _, c, ic in jobs:
        blocks = [range(b, b + c) for b in range(0, gpus - c + 1, c)]
        best = min(blocks, key=lambda blk: max(load_f[g] + load_b[g] for g in blk))
        for g in best:
            load_f[g] += ic.forward_s
            load_b[g] += ic.backward_s
        comm += c * (ic.comm_forward_s + ic.comm_backward_s)
    return load_f, load_b, comm


def encoder_step(vit: ViTCost, image_tokens: list[int], gpus: int, mode: str) -> EncoderStep:
    """Spread one micro-batch's images (patch counts) over `gpus` GPUs by `mode` (module docstring)."""
    if mode not in CP_MODES:
        raise InputError(f"unknown encoder CP mode {mode!r}; one of {', '.join(CP_MODES)}", source="--encoder-cp")
    if gpus < 1:
        raise InputError(f"encoder GPUs must be >= 1, got {gpus}", source="--encoder-gpus")
    total_tokens = sum(image_tokens)
    if not image_tokens:
        return EncoderStep(0.0, 0.0, 1.0, 0.0, 0)
    if mode == "fixed":
        load_f, load_b, comm = _spread(vit, image_tokens, gpus, [gpus] * len(image_tokens))
    elif mode == "none":
        load_f, load_b, comm = _spread(vit, image_tokens, gpus, [1] * len(image_tokens))
    else:
        best = None
        for thr in _thresholds(total_tokens, gpus):
            degrees = [_degree(t, thr, gpus) for t in image_tokens]
            cand = _spread(vit, image_tokens, gpus, degrees)
            key = max(a + b for a, b in zip(cand[0], cand[1]))
            if best is None or key < best[0]:
                best = (key, cand)
        load_f, load_b, comm = best[1]
    tot = [a + b for a, b in zip(load_f, load_b)]
    mean = sum(tot) / gpus
    return EncoderStep(max(load_f), max(load_b), max(tot) / mean if mean > 0 else 1.0,
                       comm / sum(tot) if sum(tot) > 0 else 0.0, total_tokens, max(tot))


def encoder_steps(model: Any, hw: Any, m: int, *, gpus: int, mode: str = "dynamic", seed: int = 0,
                  mean_images: float = 4.0, kernel_time: Callable | None = None,
                  images: list[list[tuple[int, int]]] | None = None) -> list[EncoderStep]:
    """Encoder time of each of m micro-batches (seeded image sizes unless `images` is given)."""
    if model.vision is None:
        raise InputError(f"model {model.name} has no vision tower", source="--model", field="vision")
    vit = ViTCost(model.vision, hw, kernel_time)
    imgs = images if images is not None else sample_images(m, seed, mean_images=mean_images)
    patch = model.vision.patch_size
    return [encoder_step(vit, [patches(w, h, patch) for w, h in mb], gpus, mode) for mb in imgs]
