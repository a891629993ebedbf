"""The one registry of layer kinds: sequence mixers and FFNs, one module each.

A model is a list of layers (`ModelConfig.layers`), each with its mixer kinds and its FFN kind; a kind's
shapes are the model's section of the same name (`model.gdn`, `model.mamba2`, ...). Consumers look a kind up
here (`MIXERS[name].state_bytes(section, tp)`) instead of testing names. A new mixer kind is one module
(a `MixerKind` subclass with its schema) listed in `_MIXER_CLASSES` and a section field of that name in
`ModelConfig` (tests/configs/test_kinds.py checks that every registered kind has one).

Layer pattern (`ModelConfig.layer_pattern`): one entry per run of layers, `"<mixers>/<ffn>"` or
`"<mixers>/<ffn> xN"` for N consecutive layers, where `<mixers>` is a kind, several kinds joined by `+`
(run in parallel on the layer's input: Falcon-H1's `gqa+mamba2`) or `none`, and `<ffn>` is `dense`, `moe` or
`none` (Nemotron-H's blocks hold a mixer or an FFN, not both).
"""

from __future__ import annotations

import re

from k3sim.configs.kinds.base import NONE, Layer, MixerKind, TPRule  # noqa: F401 - re-exported
from k3sim.configs.kinds.ffn import ROUTED, Dense, FFNKind, MoE, MoEConfig  # noqa: F401
from k3sim.configs.kinds.gdn import GDN, GDNConfig  # noqa: F401
from k3sim.configs.kinds.gqa import GQA, SWA, GQAConfig, SWAConfig  # noqa: F401
from k3sim.configs.kinds.kda import KDA, KDAConfig  # noqa: F401
from k3sim.configs.kinds.lightning import Lightning, LightningConfig  # noqa: F401
from k3sim.configs.kinds.mamba import Mamba, MambaConfig  # noqa: F401
from k3sim.configs.kinds.mamba2 import Mamba2, Mamba2Config  # noqa: F401
from k3sim.configs.kinds.mla import MLA, MLAConfig  # noqa: F401

# Order is the order of components in parameter tables (KDA and MLA first, as before the registry).
_MIXER_CLASSES = (KDA, MLA, GDN, Mamba2, Mamba, Lightning, GQA, SWA)
MIXERS: dict[str, MixerKind] = {cls.name: cls() for cls in _MIXER_CLASSES}
FFNS: dict[str, FFNKind] = {cls.name: cls() for cls in (Dense, MoE)}
RECURRENT = tuple(name for name, kind in MIXERS.items() if kind.recurrent)

_ENTRY = re.compile(r"^\s*([A-Za-z0-9_+]+)\s*/\s*([A-Za-z0-9_]+)\s*(?:x\s*(\d{1,9}))?\s*$")


def _entry(i: int, text: object) -> tuple[tuple[str, ...], str | None, int]:
    """(mixer kinds, ffn kind or None, repeat) of layer_pattern entry `i`; ValueError names the entry."""
    where = f"layer_pattern entry {i + 1}"
    m = _ENTRY.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{where} {str(text)[:40]!r}: expected '<mixer>/<ffn>' or '<mixer>/<ffn> xN' "
                         "(e.g. 'gdn/moe x3', 'mamba2/none', 'none/dense')")
    mixer, ffn, count = m.group(1), m.group(2), int(m.group(3) or 1)
    kinds = () if mixer == NONE else tuple(mixer.split("+"))
    for k in kinds:
        if k not in MIXERS:
            raise ValueError(f"{where}: unknown mixer kind '{k[:30]}' (known: {', '.join(MIXERS)}, none)")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"{where}: mixer kind repeated in '{mixer[:40]}'")
    if ffn != NONE and ffn not in FFNS:
        raise ValueError(f"{where}: unknown FFN kind '{ffn[:30]}' (known: {', '.join(FFNS)}, none)")
    if count < 1:
        raise ValueError(f"{where}: a repeat count must be at least 1")
    if not kinds and ffn == NONE:
        raise ValueError(f"{where}: a layer needs a mixer or an FFN ('none/none')")
    return kinds, (None if ffn == NONE else ffn), count


def canonical_entries(entries: list) -> list[str]:
    """The run-length spelling of a layer pattern (`"gdn/moe x3"`, adjacent runs of one layer merged), without
    expanding it: one spelling per model, so a YAML file and the same model read from its config.json compare
    equal field by field."""
    runs: list[list] = []
    for i, e in enumerate(entries):
        kinds, ffn, n = _entry(i, e)
        key = f"{'+'.join(kinds) or NONE}/{ffn or NONE}"
        if runs and runs[-1][0] == key:
            runs[-1][1] += n
        else:
            runs.append([key, n])
    return [key if n == 1 else f"{key} x{n}" for key, n in runs]


def parse_pattern(entries: list, num_layers: int) -> list[Layer]:
    """The layers of a layer pattern, checked to hold exactly `num_layers` layers. The repeat counts are
    summed before any list is built, so a huge count is refused without allocating it."""
    parsed = [_entry(i, e) for i, e in enumerate(entries)]
    total = sum(n for _, _, n in parsed)
    if total != num_layers:
        raise ValueError(f"layer_pattern describes {total:,} layers but num_layers is {num_layers:,}")
    layers: list[Layer] = []
    for kinds, ffn, n in parsed:
        start = len(layers)
        layers.extend([Layer(start + j, kinds, ffn) for j in range(n)])
    return layers
