"""The one MLA head-dim rule: the head dims of expanded (non-absorbed) MLA attention, as prefill and training
run it, and the single head dim the kernel registry's causal SDPA op (`sdpa_causal_fwd[_bwd]`, one D for
q, k and v) is priced at. Both the step model's MLA prefill attention and the CP model's MLA attention read
it, so the two price the same layer the same way.

DeepSeek-V3-style MLA (K3: qk_nope 128, qk_rope 64, v 128) expands the latent into per-head K = [k_nope |
k_rope] and V: QK^T runs at d_qk = qk_nope + qk_rope = 192 and PV at d_v = 128. A single-head-dim SDPA
kernel (torch's flash and cuDNN paths, which the measured `sdpa_causal_*` rows and the whole-step GPU runs
use: `calibration/wholestep/model.py` pads v) runs both products at max(d_qk, d_v) = 192, V zero-padded:
that is the head dim to price a call at. Its cost at 192 is what those runs measured (the whole-step
training check's MLA attention family: predicted / profiled 1.01 at D = 192, `reports/training/`); the
registry's measured grid holds D = 192 itself. `flop_equivalent_head_dim` = (d_qk + d_v) / 2 = 160 is the
D whose 4 T^2 H D / 2 FLOP (and q, k, v, o bytes) equal the useful work of QK^T at 192 plus PV at 128: the
figure for counting useful FLOP, and for a kernel taking d_v != d_qk natively (FA3 on Hopper, FlashInfer),
which no measurement here covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MLAHeadDims:
    """Per-head dims of expanded MLA attention: QK^T at `qk`, PV at `v`."""

    qk: int
    v: int

    @property
    def kernel_head_dim(self) -> int:
        """The D a single-head-dim SDPA call runs at (V padded to the QK dim): what a call is priced at."""
        return max(self.qk, self.v)

    @property
    def flop_equivalent_head_dim(self) -> float:
        """The D of an SDPA call with the useful FLOP of QK^T at `qk` and PV at `v`: (qk + v) / 2."""
        return (self.qk + self.v) / 2


def mla_attention_head_dims(mla: Any) -> MLAHeadDims:
    """Head dims of an MLA layer: `mla` is a `ModelConfig.mla` (`MLAConfig`) or anything with its field
    names (`qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`; the CP geometry has them)."""
    return MLAHeadDims(qk=int(mla.qk_nope_head_dim) + int(mla.qk_rope_head_dim), v=int(mla.v_head_dim))
