"""`k3sim model-info`: parameter counts by component, layer mix and per-token KV/state sizes."""

from __future__ import annotations

from pathlib import Path

import typer


def model_info_result(model_path: str) -> dict:
    """Everything model-info reports, as a JSON-ready dict (SI units: bytes, parameter counts).

    `kda_state_bytes_per_request` / `mla_kv_bytes_per_token` are the KDA and MLA layers' (the Kimi contract);
    `recurrent_state_bytes_per_request` and `kv_bytes_per_token` cover every recurrent and every
    full-context attention kind, `conv_state_bytes_per_request` every kind with a short conv, and `kinds`
    gives each mixer kind's per-layer figures and the counts TP must split (`configs/kinds`)."""
    from k3sim.configs import load_model
    from k3sim.memory import sizes
    from k3sim.memory.params import count_params, stored_weight_bytes

    model = load_model(model_path)
    report = count_params(model)
    return {
        "model": model.name,
        "source": model.source,
        "total_params": int(report.total_params),
        "active_params": int(report.active_params),
        "params_by_component": report.by_component(),
        "weight_bytes": stored_weight_bytes(model, report),
        "layers": {
            "num_layers": model.num_layers,
            "num_kda_layers": model.num_kda_layers,
            "num_mla_layers": model.num_mla_layers,
            "num_dense_ffn_layers": model.num_dense_layers,
            "num_moe_layers": model.num_moe_layers,
            "num_attn_res_blocks": model.num_attn_res_blocks,
            "layer_kinds": model.layer_kinds,
            "ffn_kinds": model.ffn_kinds,
            "layer_pattern": model.layer_pattern,
        },
        "kinds": _kinds(model),
        "kda_state_bytes_per_request": sizes.kda_state_bytes_per_request(model),
        "mla_kv_bytes_per_token": sizes.mla_kv_bytes_per_token(model),
        "recurrent_state_bytes_per_request": sizes.recurrent_state_bytes_per_request(model),
        "kv_bytes_per_token": sizes.kv_bytes_per_token(model),
        "conv_state_bytes_per_request": sizes.all_conv_state_bytes_per_request(model),
        "attn_res_block_bytes_per_token": sizes.attn_res_block_bytes_per_token(model),
        "routed_weight_format": model.moe.routed_weight_format if model.moe else None,
    }


def _kinds(model) -> list[dict]:
    """Per mixer kind: layers, parameters, state and KV per layer, the window, and what TP must divide."""
    from k3sim.configs.kinds import MIXERS
    from k3sim.memory.params import mixer_params
    from k3sim.memory.sizes import kind_sizes

    return [{"kind": s.kind, "layers": s.layers, "params_per_layer": mixer_params(model, s.kind),
             "state_bytes_per_layer": s.state_bytes_per_layer,
             "conv_state_bytes_per_layer": s.conv_state_bytes_per_layer,
             "kv_bytes_per_token_per_layer": s.kv_bytes_per_token_per_layer, "window_tokens": s.window_tokens,
             "tp_must_divide": {r.what: r.count for r in MIXERS[s.kind].tp_rules(model.section(s.kind))}}
            for s in kind_sizes(model)]


def _pattern(kinds: list[str], letters: dict[str, str], compact: bool = False) -> str:
    """Run-length layer pattern, e.g. '3K 1M' (one letter per mixer kind, `+` for parallel ones, '-' none);
    `compact`: one character per layer ('S-S-SA-', as Nemotron-H's own pattern string, in groups of 10) when
    every layer's mixer has one letter and runs are short."""
    code = lambda k: "+".join(letters[m] for m in k.split("+")) if k != "none" else "-"  # noqa: E731
    runs: list[list] = []
    for k in kinds:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    if compact and len(runs) > 2 * len(kinds) // 3 and all(len(code(k)) == 1 for k, _ in runs):
        chars = "".join(code(k) for k in kinds)
        return " ".join(chars[i:i + 10] for i in range(0, len(chars), 10))  # a table cell wraps at spaces
    return " ".join(f"{n}{code(k)}" for k, n in runs)


def _kind_row(k: dict) -> tuple:
    from k3sim.configs.kinds import MIXERS
    from k3sim.output import human_bytes

    title = MIXERS[k["kind"]].title
    kv = human_bytes(k["kv_bytes_per_token_per_layer"])
    if k["window_tokens"] is not None:
        kv += f" (window {k['window_tokens']:,})"
    tp = ", ".join(f"{n} {w.removeprefix(title + ' ')}" for w, n in k["tp_must_divide"].items())
    return (k["kind"], k["layers"], f"{k['params_per_layer'] / 1e6:,.1f} M", human_bytes(k["state_bytes_per_layer"]),
            human_bytes(k["conv_state_bytes_per_layer"]), kv, tp)


def _summary(info: dict) -> list[tuple[str, str]]:
    """The key-value lines of the table view."""
    from k3sim.configs.kinds import MIXERS
    from k3sim.output import human_bytes

    lay, kinds = info["layers"], info["kinds"]
    letters = {k: MIXERS[k].letter for k in MIXERS}
    titles = " / ".join(MIXERS[k["kind"]].title for k in kinds)
    legend = ", ".join(f"{MIXERS[k['kind']].letter}={MIXERS[k['kind']].title}" for k in kinds)
    legacy = lay["layer_pattern"] is None  # the Kimi rule: keep its lines as they were
    pairs = [
        ("total params", f"{info['total_params'] / 1e9:,.2f} billion"),  # not "B": that reads as bytes
        ("active params per token", f"{info['active_params'] / 1e9:,.2f} billion"),
        ("weights in stored formats", human_bytes(info["weight_bytes"])),
        ("layers (KDA / MLA)", f"{lay['num_layers']} ({lay['num_kda_layers']} / {lay['num_mla_layers']})") if legacy
        else (f"layers ({titles})", f"{lay['num_layers']} ({' / '.join(str(k['layers']) for k in kinds)})"),
        ("FFN (dense / MoE)", f"{lay['num_dense_ffn_layers']} / {lay['num_moe_layers']}"),
        ("layer pattern (K=KDA, M=MLA)" if legacy else f"layer pattern ({legend}, -=none)",
         _pattern(lay["layer_kinds"], letters, compact=not legacy)),
        ("AttnRes blocks", lay["num_attn_res_blocks"]),
    ]
    if legacy:
        pairs += [("KDA state per request", human_bytes(info["kda_state_bytes_per_request"])),
                  ("MLA KV per token", human_bytes(info["mla_kv_bytes_per_token"]))]
    else:
        pairs += [("recurrent state per request", human_bytes(info["recurrent_state_bytes_per_request"])),
                  ("KV per token (full-context attention)", human_bytes(info["kv_bytes_per_token"]))]
    return pairs + [("conv state per request", human_bytes(info["conv_state_bytes_per_request"])),
                    ("AttnRes blocks per token in flight", human_bytes(info["attn_res_block_bytes_per_token"]))]


def register(app: typer.Typer) -> None:
    from k3sim.commands.options import MODEL_SET

    @app.command("model-info")
    def model_info(
        model: Path = typer.Option(Path("models/kimi-k3.yaml"), "--model",
                                   help="our model YAML or a Hugging Face config.json"),
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
    ) -> None:
        """Parameter counts (total, active per token, by component), layer mix, KV/state sizes."""
        from k3sim.output import human_bytes, print_json, print_kv, print_table

        info = model_info_result(str(model))
        if json_out:
            print_json(info)
            return
        print_kv(f"{info['model']}", _summary(info))
        print_table("layer kinds (per layer: params, state per request, KV per token)",
                    ["kind", "layers", "params", "state", "conv", "KV/token", "TP must divide"],
                    [_kind_row(k) for k in info["kinds"]])
        print_table("parameters by component", ["component", "total", "active per token"], [
            (c, f"{v['total']:,}", f"{v['active']:,}") for c, v in info["params_by_component"].items()])
