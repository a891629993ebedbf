"""What every layer kind answers, and one layer of a model as data.

A sequence-mixer kind (`MixerKind`) owns the schema of its section of the model config (`ModelConfig.gdn`,
`.mamba2`, ...) and the per-layer figures the memory model reads: parameters, the recurrent state and the
short-conv state a request keeps, the KV cache a token adds, and what tensor parallelism must divide. All
figures are per layer; `tp` gives the share of one rank of a TP group (the whole layer at tp = 1). The
registry (`k3sim.configs.kinds`) holds one instance of each kind; consumers dispatch on the kind's name
through it and never test names themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict
from typing_extensions import Annotated

from k3sim.configs.bounds import bounded_int
from k3sim.configs.dtypes import bytes_per_element, check_dtype

# Field types of the kinds' sections: every count and width has a documented range (configs/bounds.py).
Heads = bounded_int("heads")
Width = bounded_int("width")
Taps = bounded_int("kernel")
DType = Annotated[str, AfterValidator(check_dtype)]
STRICT = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def dtype_bytes(elements: float, dtype: str) -> int:
    """Bytes of `elements` values of `dtype`, rounded up to a whole byte."""
    return math.ceil(elements * bytes_per_element(dtype))


@dataclass(frozen=True)
class TPRule:
    """One count of a kind that tensor parallelism splits, e.g. the 32 value heads of a GDN layer.

    `allow`: "divide" (tp must divide `count`); "divide_or_multiple" (or tp is a multiple of it: each rank
    then holds one replicated copy, as vLLM's QKVParallelLinear replicates KV heads when tp > KV heads);
    "divide_or_one" (or count is 1 and every rank holds it whole: vLLM's MambaMixer2 replicates a single
    B/C group)."""

    what: str
    count: int
    allow: Literal["divide", "divide_or_multiple", "divide_or_one"] = "divide"

    def problem(self, tp: int) -> str | None:
        """None if tp splits the count under this rule, else the reason (one clause, with the fix)."""
        if self.count % tp == 0:
            return None
        if self.allow == "divide_or_multiple" and tp % self.count == 0:
            return None
        if self.allow == "divide_or_one" and self.count == 1:
            return None
        extra = {"divide_or_multiple": " (nor is it a multiple of them, which would replicate them)",
                 "divide_or_one": " (only a single group can be replicated over the ranks)"}.get(self.allow, "")
        return f"tp={tp} does not divide the {self.count} {self.what}{extra}"

    def per_rank(self, tp: int) -> int:
        """How many of them one rank holds: count / tp, or 1 where they are replicated."""
        return self.count // tp if self.count % tp == 0 else 1


class MixerKind:
    """A sequence mixer: its section schema and its per-layer sizes. Subclasses set the class attributes
    and override what differs; attention-like kinds keep no recurrent state, recurrent kinds no KV."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""     # how an error line or table names it ("GDN", "Mamba2")
    letter: ClassVar[str] = ""    # one character of model-info's layer pattern
    schema: ClassVar[type] = object
    recurrent: ClassVar[bool] = False  # a fixed-size state per request instead of a cache growing per token

    def params(self, cfg: Any, hidden: int) -> int:
        """Parameters of one layer of this kind at model width `hidden`."""
        raise NotImplementedError

    def tp_rules(self, cfg: Any) -> list[TPRule]:
        """The counts TP splits (heads, groups, channels); the first one TP cannot split is refused."""
        raise NotImplementedError

    def state_bytes(self, cfg: Any, tp: int = 1, state_dtype: str | None = None) -> int:
        """Recurrent state of one request in one layer on one TP rank (0 for attention kinds)."""
        return 0

    def conv_state_bytes(self, cfg: Any, tp: int = 1) -> int:
        """Short-conv state of one request in one layer on one TP rank: the last (kernel - 1) inputs."""
        return 0

    def kv_bytes_per_token(self, cfg: Any, tp: int = 1) -> int:
        """KV cache one token adds in one layer on one TP rank (0 for recurrent kinds)."""
        return 0

    def window_tokens(self, cfg: Any) -> int | None:
        """Most tokens the layer keeps in its KV cache (a sliding window); None = the whole context."""
        return None

    def kv_tokens(self, cfg: Any, context_tokens: int) -> int:
        """Tokens of a `context_tokens` request held in this layer's KV cache: the window caps it."""
        window = self.window_tokens(cfg)
        return context_tokens if window is None else min(context_tokens, window)

    def tp_problem(self, cfg: Any, tp: int) -> str | None:
        """The first of `tp_rules` that `tp` cannot split, as a reason; None if tp fits the layer."""
        for rule in self.tp_rules(cfg):
            reason = rule.problem(tp)
            if reason:
                return reason
        return None


NONE = "none"  # a layer without a mixer (Nemotron-H's MLP-only blocks) or without an FFN (its Mamba2 blocks)


@dataclass(frozen=True)
class Layer:
    """One layer (HF: one decoder block): its sequence mixers (none, one, or several run in parallel on the
    same input, as Falcon-H1's attention + Mamba2) and its FFN kind ("dense", "moe"; None for none)."""

    index: int  # 0-based
    mixers: tuple[str, ...]
    ffn: str | None

    @property
    def mixer(self) -> str:
        """The mixer kinds as one name: "gdn", "gqa+mamba2", or "none"."""
        return "+".join(self.mixers) or NONE
