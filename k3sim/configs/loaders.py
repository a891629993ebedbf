"""Read YAML/JSON config files into validated schemas; every failure becomes one InputError line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from k3sim import reader
from k3sim.errors import InputError, shorten

# Each schema is imported by the loader that needs it: a kernel-time query loads a hardware profile only,
# model-info a model only, and building the parallel/serving/planning schemas costs ~60 ms of pydantic.
if TYPE_CHECKING:
    from k3sim.configs.hardware import HardwareProfile
    from k3sim.configs.model import ModelConfig
    from k3sim.configs.parallel import Scenario

REPO_ROOT = Path(__file__).resolve().parents[2]
HARDWARE_DIR = REPO_ROOT / "hardware_profiles"

T = TypeVar("T", bound=BaseModel)


# Largest config file read (bytes): `k3sim.reader.MAX_CONFIG_BYTES` (the reason is written there).
MAX_CONFIG_BYTES = reader.MAX_CONFIG_BYTES


def _yaml_loader():
    """A SafeLoader that refuses aliases (`*name`) while composing, before any object is built: an alias bomb
    (a billion-laughs document) would otherwise expand to gigabytes. Our configs use no aliases."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise _AliasRefused(event.start_mark.line + 1)
            return super().compose_node(parent, index)

    return NoAliasLoader


class _AliasRefused(Exception):
    def __init__(self, line: int):
        self.line = line


def read_mapping(path: str | Path, *, what: str = "config file", max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """Parse a YAML or JSON file that must hold a mapping. Read once through `k3sim.reader` (a directory,
    a device or a missing file is one line; a pipe such as `<(...)` is read exactly once; over `max_bytes` is
    refused before parsing). `what` names the kind of file in those lines."""
    p = Path(path)
    text = reader.read_text(path, source=str(path), what=what, max_bytes=max_bytes)
    data = _parse_text(text, str(path), as_json=p.suffix == ".json")
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping at top level, got {type(data).__name__}", source=str(path))
    return data


def _parse_text(text: str, source: str, *, as_json: bool = False) -> Any:
    """A YAML (or JSON) text parsed; a YAML mapping parsed before comes from the disk cache (keyed by its
    bytes, this loader and PyYAML; only mappings that parsed cleanly are kept), without importing PyYAML
    (~30 ms of a warm query). Every failure is one InputError line naming `source`."""
    from k3sim.configs import diskcache

    cached = None if as_json else diskcache.cached_yaml(text)
    if cached is not None:
        return cached
    import yaml

    kind = "JSON" if as_json else "YAML"
    try:
        data = json.loads(text) if as_json else yaml.load(text, Loader=_yaml_loader())  # noqa: S506
    except _AliasRefused as err:
        raise InputError(f"line {err.line}: YAML aliases (*name) are not accepted; write the value out",
                         source=source) from None
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        first = " ".join(str(err).split())
        raise InputError(f"malformed {kind}: {shorten(first, 160)}", source=source) from None
    except (RecursionError, ValueError) as err:  # nested too deeply; an integer past Python's digit limit
        raise InputError(f"malformed {kind}: "
                         f"{'nested too deeply' if isinstance(err, RecursionError) else shorten(str(err), 120)}",
                         source=source) from None
    return data if as_json or not isinstance(data, dict) else diskcache.remember_yaml(text, data)


# The one key of the document a command-line value is parsed in (`parse_yaml_value`).
_VALUE_KEY = "value"


def parse_yaml_value(raw: str, *, source: str) -> Any:
    """One command-line value (`--set KEY=VALUE`'s VALUE) parsed as a YAML value of a config file is: `48`
    int, `0.5` float, `true` bool, `null` (or nothing) None, `[4, 8]` a list, anything else a string. Parsed
    as the document `value: VALUE`, so it comes from the disk cache as a file does; one line only (a newline
    would add keys to that document)."""
    if "\n" in raw or "\r" in raw:
        raise InputError("a value is one line of YAML", source=source)
    data = _parse_text(f"{_VALUE_KEY}: {raw}", source)
    if not isinstance(data, dict) or list(data) != [_VALUE_KEY]:
        raise InputError("expected one YAML value (quote a string that holds ': ' or '#')", source=source)
    return data[_VALUE_KEY]


def _schema_fields() -> set[str]:
    from k3sim.configs import hardware, kinds, model, parallel

    classes = [hardware.HardwareProfile, model.ModelConfig, model.MoEConfig, model.VisionConfig,
               *(k.schema for k in kinds.MIXERS.values()), parallel.Parallelism, parallel.Cluster,
               parallel.Workload, parallel.Scenario]
    return {name for c in classes for name in c.model_fields}


def validation_error_line(err: ValidationError) -> tuple[str | None, str]:
    """(field path, reason) of the first pydantic error, phrased for a user.

    Cross-field checks (model validators) have no location; their messages start with the field they
    are about, which becomes the field here.
    """
    first = err.errors()[0]
    loc = [str(x) for x in first["loc"]]
    if first["type"] == "value_error":
        lead = re.match(r"[A-Za-z_][\w.]*", first["msg"].removeprefix("Value error, "))
        if lead and lead.group(0).split(".")[0] in _schema_fields():
            name = lead.group(0)
            if not loc or loc[-1] != name:
                loc.append(name)
    field = ".".join(loc) or None
    if first["type"] == "extra_forbidden":
        reason = "unknown field"
    else:
        reason = first["msg"].removeprefix("Value error, ")
        if first["type"] not in ("missing", "value_error") and "input" in first:
            reason += f" (got {shorten(repr(first['input']), 60)})"
    more = len(err.errors()) - 1
    if more:
        reason += f" (+{more} more error{'s' if more > 1 else ''})"
    return field, reason


def validate(cls: type[T], data: dict[str, Any], source: str) -> T:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        field, reason = validation_error_line(err)
        raise InputError(reason, source=source, field=field) from None


def load_model(path: str | Path, overrides: Any = None) -> ModelConfig:
    """Our model YAML, or a Hugging Face config.json (K3 nested `text_config`, Kimi-Linear/K2 flat),
    or a Hugging Face model folder holding one. A relative path missing from the working directory is looked
    up in the project (`models/kimi-k3.yaml` works from any directory).

    `overrides`: model what-ifs, `KEY=VALUE` texts or `configs.overrides.Override`s (`["kda.num_heads=48",
    "full_attn_layers=every:8"]`), applied to the file's fields before the one validation (`configs.overrides`);
    None = the running command's `--set` (`overrides.current()`), () = none."""
    from k3sim.configs import overrides as what_if
    from k3sim.configs.hf import hf_to_model_fields, is_hf_config
    from k3sim.files import project_path

    items = what_if.current() if overrides is None else what_if.parse(overrides)
    path = project_path(path)
    if _is_dir(Path(path)) and reader.is_file(Path(path) / "config.json"):
        path = Path(path) / "config.json"
    data = read_mapping(path, what="model YAML or Hugging Face config.json")
    if is_hf_config(data):
        p = Path(path)
        default_name = p.parent.name if p.name == "config.json" else p.stem
        data = hf_to_model_fields(data, str(path), default_name)
    return what_if.validated(data, items, str(path))


def hardware_names() -> list[str]:
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except (OSError, ValueError):  # e.g. a name longer than the file system allows: not a directory
        return False


def hardware_path(name_or_path: str | Path) -> Path:
    """`hardware_profiles/<name>.yaml` for a profile name; otherwise the path as given when it looks like one
    (a suffix, a slash) or something is there (a file, a pipe, a device, a broken link, a directory: the
    reader says what is wrong with it), so "unknown profile" is said only of a name."""
    from k3sim.files import project_path

    p = project_path(name_or_path)
    looks_like_path = p.suffix in (".yaml", ".yml", ".json") or "/" in str(name_or_path)
    if looks_like_path or (reader.exists(p) and not _is_dir(p)):
        return p
    candidate = HARDWARE_DIR / f"{name_or_path}.yaml"
    if reader.is_file(candidate):
        return candidate
    if reader.exists(p):
        return p
    raise InputError(f"unknown hardware profile (known: {', '.join(hardware_names())})", source=str(name_or_path))


def load_hardware(name_or_path: str | Path) -> HardwareProfile:
    """A profile name in hardware_profiles/ (e.g. "h200") or a path to a profile YAML.

    A `calibration_dir` that names a missing directory is an error here, wherever the profile is used: a
    typo would otherwise silently turn measured kernel times into datasheet ones."""
    path = hardware_path(name_or_path)
    from k3sim.configs.hardware import HardwareProfile

    hw = validate(HardwareProfile, read_mapping(path, what="hardware profile"), str(path))
    if hw.calibration_dir:
        from k3sim.configs.profiles import measured_dir, uncalibrated_reason

        try:
            found = measured_dir(hw)  # raises for a named directory that is missing (configs.profiles)
        except InputError as err:
            raise InputError(err.reason, source=str(path), field="calibration_dir") from None
        if found is None:
            raise InputError(f"{uncalibrated_reason(hw)}; fix the path or remove the field (datasheet times)",
                             source=str(path), field="calibration_dir")
    return hw


def load_scenario(path: str | Path) -> Scenario:
    """The scenario schema only; `resolve_scenario` also loads its model and hardware."""
    from k3sim.configs.parallel import Scenario

    return validate(Scenario, read_mapping(path, what="scenario"), str(path))


def resolve_relative(ref: str, base: Path) -> Path:
    """A file named in a scenario: relative to the scenario's folder, else cwd, else the repo root. Anything
    at a path counts (a broken link too), so the reader, not this search, says what is wrong with it."""
    p = Path(ref)
    if p.is_absolute():
        return p
    for root in (base, Path.cwd(), REPO_ROOT):
        if reader.exists(root / p):
            return root / p
    return base / p


def resolve_scenario(path: str | Path):
    """(scenario, model, hardware) with the layout checked against the model."""
    from k3sim.configs.parallel import check_layout

    scenario = load_scenario(path)
    base = Path(path).resolve().parent
    model_path = resolve_relative(scenario.model, base)
    if not reader.exists(model_path):
        raise InputError(f"file not found: {scenario.model} (looked in {base}, the working directory "
                         "and the repository root)", source=str(path), field="model")
    model = load_model(model_path)
    hw_ref = scenario.hardware
    hw_path = resolve_relative(hw_ref, base) if Path(hw_ref).suffix else hw_ref
    try:
        hw_file = hardware_path(hw_path)
    except InputError as err:  # an unknown profile name: say which scenario field named it
        raise InputError(f"'{hw_ref}': {err.reason}", source=str(path), field="hardware") from None
    if not reader.exists(hw_file):
        raise InputError(f"file not found: {hw_ref}", source=str(path), field="hardware")
    hardware = load_hardware(hw_file)
    check_layout(model, scenario.parallelism, cluster=scenario.cluster, mode=scenario.workload.mode,
                 source=str(path), hardware=hardware)
    return scenario, model, hardware
