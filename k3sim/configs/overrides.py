"""Model what-ifs: `KEY=VALUE` overrides of a model file (`--set` on every command that takes a model, `k3sim
diff --base-set / --variant-set`), applied to the file's mapping before the one `ModelConfig` validation, so an
overridden model is checked exactly as a file that said the same would be (`loaders.load_model(path,
overrides=...)`).

- KEY is a dotted path of the model schema (the keys of `models/*.yaml`, also for a Hugging Face config.json,
  whose fields are converted first): `hidden_size`, `kda.num_heads`, `moe.num_active_experts`, `vision`. A key
  outside the schema is refused with the nearest valid keys. A key inside a section the file leaves out
  (`kda.num_heads` on DeepSeek-V3) starts that section; the schema then asks for its other fields.
- VALUE is one YAML scalar or flow value (`48`, `0.5`, `true`, `null`, `[4, 8]`, `{...}`), parsed as the file's
  values are (through `loaders.parse_yaml_value`, cached like a file: a warm query imports no PyYAML).
- `full_attn_layers=every:N` (the layer-pattern shorthand): layers N, 2N, 3N, ... (1-based, as config.json's
  `linear_attn_config.full_attn_layers` counts) are the model's full-attention kind and every other layer its
  linear kind, each layer's FFN unchanged. Under the Kimi rule (`full_attn_layers` lists the MLA layers, the
  rest are KDA) it writes that list; a `layer_pattern` model gets its pattern rewritten, the full-attention kind
  being the one mixer kind that is neither recurrent nor windowed (`configs.kinds`: `recurrent`,
  `window_tokens`) and the linear kind the other one. It is resolved after every other key, against the final
  `num_layers`. K3's file (every 4th layer and both of the last two) is not `every:4`, which gives 23 MLA layers
  (4 ... 92) where the file has 24.
- A key given twice, or a key and a key inside it (`kda` and `kda.num_heads`), is refused: one would undo the
  other. The overridden model's `source` says which overrides made it (model-info prints it).

The overrides a running command got from `--set` are the `current()` ones: `k3sim.commands.options.MODEL_SET`
installs them when the option is parsed and removes them when the command ends, so every model the command
loads (its `--model`, the model a scenario names) gets them, in this process and in the local worker
processes it forks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any, Iterable, Sequence

from k3sim.errors import InputError

OPTION = "--set"
EVERY = "every:"
LAYER_KEY = "full_attn_layers"
# Valid keys shown when a key is unknown (difflib's ratio; a modelling choice: 0.6 is difflib's default cutoff)
NEAREST = 3

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Override:
    """One `KEY=VALUE`: the dotted key, the parsed value, the text as written and the option that gave it."""

    key: str
    value: Any
    text: str
    option: str = OPTION

    @property
    def written(self) -> str:
        """How an error line names it: `--set kda.num_heads=48`."""
        return f"{self.option} {self.text}"


# The overrides of the running command (`current()`), set by `--set`'s callback and cleared when it ends.
_ACTIVE: list[tuple[Override, ...]] = [()]


def current() -> tuple[Override, ...]:
    """The overrides every model loaded now gets when its loader is not given any."""
    return _ACTIVE[0]


def install(overrides: tuple[Override, ...]) -> None:
    """Make `overrides` the current ones (the `--set` callback; `clear()` undoes it)."""
    _ACTIVE[0] = tuple(overrides)


def clear() -> None:
    _ACTIVE[0] = ()


# ------------------------------------------------------------------------------------------ keys
def _model_class(annotation: Any) -> type | None:
    """The pydantic model inside a field's annotation (`KDAConfig | None` -> KDAConfig), or None."""
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_class(arg)
        if found is not None:
            return found
    return None


def _keys_of(cls: type, prefix: str = "") -> dict[str, type | None]:
    out: dict[str, type | None] = {}
    for name, info in cls.model_fields.items():
        sub = _model_class(info.annotation)
        out[prefix + name] = sub
        if sub is not None:
            out.update(_keys_of(sub, f"{prefix}{name}."))
    return out


def valid_keys() -> dict[str, type | None]:
    """Every dotted key of the model schema -> its section's schema (None for a plain field)."""
    from k3sim.configs.model import ModelConfig

    return _keys_of(ModelConfig)


def check_key(key: str, written: str) -> None:
    """Refuse a key outside the model schema, naming the nearest valid ones."""
    keys = valid_keys()
    if key in keys:
        return
    head = key.split(".")[0]
    if "." in key and keys.get(head) is not None:  # inside a section: the nearest of its keys, else its first
        inside = [k for k in keys if k.startswith(head + ".")]
        near = get_close_matches(key, inside, n=NEAREST) or inside[:NEAREST + 3]
    else:
        near = get_close_matches(key, list(keys), n=NEAREST)
    hint = f"nearest valid keys: {', '.join(near)}" if near else \
        f"valid keys are the model file's (e.g. {', '.join(list(keys)[:4])}, kda.num_heads)"
    raise InputError(f"unknown key '{key}' ({hint})", source=written)


# ------------------------------------------------------------------------------------------ parsing
def parse(items: Iterable[str | Override] | None, option: str = OPTION) -> tuple[Override, ...]:
    """`KEY=VALUE` texts as Overrides: the key checked against the schema, the value parsed as YAML, and no
    key given twice or inside another given key. Overrides pass through as they are."""
    from k3sim.configs.loaders import parse_yaml_value

    out: list[Override] = []
    for item in items or ():
        if isinstance(item, Override):
            out.append(item)
            continue
        text = str(item)
        key, eq, raw = text.partition("=")
        key = key.strip()
        written = f"{option} {text}"
        if not eq or not _KEY.match(key):
            raise InputError("expected KEY=VALUE with a dotted key of the model file (e.g. kda.num_heads=48, "
                             "full_attn_layers=every:8)", source=written)
        check_key(key, written)
        out.append(Override(key, parse_yaml_value(raw, source=written), text, option))
        every_n(out[-1])  # `every:0` refused while parsing, before any model is read
    _refuse_overlaps(out)
    return tuple(out)


def _refuse_overlaps(items: Sequence[Override]) -> None:
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if a.key == b.key or b.key.startswith(a.key + ".") or a.key.startswith(b.key + "."):
                what = "given twice" if a.key == b.key else f"and '{a.key if len(a.key) > len(b.key) else b.key}'" \
                                                             " inside it are both given"
                raise InputError(f"'{min(a.key, b.key, key=len)}' {what}: one would undo the other; keep one",
                                 source=b.written)


def every_n(ov: Override) -> int | None:
    """N of `full_attn_layers=every:N`, None for any other override; `every:0` or `every:x` is refused."""
    if ov.key != LAYER_KEY or not isinstance(ov.value, str) or not ov.value.startswith(EVERY):
        return None
    n = ov.value[len(EVERY):].strip()
    if not n.isdigit() or int(n) < 1:
        raise InputError(f"every:N takes a whole number of layers N >= 1 (every Nth layer full attention), got "
                         f"'{n[:20]}'", source=ov.written)
    return int(n)


# ------------------------------------------------------------------------------------------ applying
def _set(data: dict, key: str, value: Any, ov: Override) -> None:
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:  # a section the file leaves out (or sets to null): the override starts it
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise InputError(f"'{'.'.join(parts[:i + 1])}' is not a section in this model file (it holds "
                             f"{type(child).__name__}); set it whole", source=ov.written)
        node = child
    node[parts[-1]] = value


def _described(source: Any, items: Sequence[Override]) -> str:
    said = ", ".join(o.written for o in items)
    return f"{source}; with {said}" if source else f"with {said}"


def apply(data: dict, items: Sequence[Override], source: str) -> dict:
    """A copy of the model mapping `data` with `items` applied (`every:N` last, against the final num_layers);
    `every:N` on a layer_pattern model validates the other overrides first (it reads the layers)."""
    import copy

    out = copy.deepcopy(data)
    plain = [o for o in items if every_n(o) is None]
    for ov in plain:
        _set(out, ov.key, copy.deepcopy(ov.value), ov)
    for ov in items:
        n = every_n(ov)
        if n is not None:
            _apply_every(out, n, ov, lambda d: _checked(d, data, plain, source))
    if not any(o.key == "source" for o in items):
        out["source"] = _described(out.get("source"), items)
    return out


def _apply_every(data: dict, n: int, ov: Override, model_of: Any) -> None:
    """`full_attn_layers=every:N` on `data` (other overrides already applied; `model_of(data)` validates it):
    see the module docstring."""
    layers = data.get("num_layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and n > layers:
        raise InputError(f"every:{n} gives no full-attention layer in a model of {layers} layers; use N <= "
                         f"{layers}", source=ov.written)
    if data.get("layer_pattern") is None:
        if data.get("kda") is None:
            raise InputError(f"every:N puts the linear kind (KDA under the full_attn_layers rule) between the MLA "
                             f"layers and {data.get('name', 'this model')} has no kda section (every layer is MLA); "
                             "add the section or give layer_pattern", source=ov.written)
        if isinstance(layers, int):  # otherwise the schema refuses num_layers itself
            data[LAYER_KEY] = list(range(n, layers + 1, n))
        return
    data["layer_pattern"] = _every_pattern(model_of(data), n, ov)


def _every_pattern(model: Any, n: int, ov: Override) -> list[str]:
    """The layer_pattern of `model` with layers n, 2n, ... its full-attention kind and the rest its linear kind."""
    from k3sim.configs.kinds import MIXERS, NONE, canonical_entries

    odd = next((layer for layer in model.layers if len(layer.mixers) != 1), None)
    if odd is not None:
        raise InputError(f"every:N needs one mixer per layer and layer {odd.index} (0-based) has "
                         f"'{odd.mixer}'; write layer_pattern instead", source=ov.written)
    kinds = model.mixer_kinds
    full = [k for k in kinds if not MIXERS[k].recurrent and MIXERS[k].window_tokens(model.section(k)) is None]
    linear = [k for k in kinds if k not in full]
    if len(full) != 1 or len(linear) != 1:
        has = f"full-attention kinds: {', '.join(full) or 'none'}; linear kinds: {', '.join(linear) or 'none'}"
        raise InputError(f"every:N needs exactly one full-attention and one linear (recurrent or windowed) mixer "
                         f"kind and {model.name} has {has}; write layer_pattern instead", source=ov.written)
    return canonical_entries([f"{full[0] if (layer.index + 1) % n == 0 else linear[0]}/{layer.ffn or NONE}"
                              for layer in model.layers])


def validated(data: dict, items: Sequence[Override], source: str):
    """The ModelConfig of the model mapping `data` with `items` applied, through the one validation."""
    from k3sim.configs.loaders import validate
    from k3sim.configs.model import ModelConfig

    if not items:
        return validate(ModelConfig, data, source)
    return _checked(apply(data, items, source), data, items, source)


def _checked(new: dict, base: dict, items: Sequence[Override], source: str):
    """`new` (= `base` with `items`) validated. A refusal names the override it is about (its key, or the
    section holding the field the schema refused), else every override given; when `base` itself is refused the
    line names the file, as it would without overrides."""
    from k3sim.configs.loaders import validate
    from k3sim.configs.model import ModelConfig

    try:
        return validate(ModelConfig, new, source)
    except InputError as err:
        try:
            validate(ModelConfig, base, source)
        except InputError:
            raise err from None  # the file itself is refused: its own line
        field = err.field or ""
        hit = [o for o in items if field == o.key or field.startswith(o.key + ".") or o.key.startswith(field + ".")
               or (field and o.key.split(".")[0] == field.split(".")[0])]
        named = hit[:1] or list(items)
        raise InputError(err.reason, source=" ".join(o.written for o in named), field=err.field) from None
