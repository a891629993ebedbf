"""`k3sim model-info`: parameter counts by component, layer mix and per-token KV/state sizes."""

from __future__ import annotations

from pathlib import Path

import typer


def model_info_result(model_path: str) -> dict:
    """Everything model-info reports, as a JSON-ready dict (SI units: bytes, parameter counts)."""
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
        },
        "kda_state_bytes_per_request": sizes.kda_state_bytes_per_request(model),
        "mla_kv_bytes_per_token": sizes.mla_kv_bytes_per_token(model),
        "conv_state_bytes_per_request": sizes.conv_state_bytes_per_request(model),
        "attn_res_block_bytes_per_token": sizes.attn_res_block_bytes_per_token(model),
        "routed_weight_format": model.moe.routed_weight_format if model.moe else None,
    }


def _pattern(kinds: list[str]) -> str:
    """Run-length layer pattern, e.g. '3 kda, 1 mla, ...'."""
    runs: list[list] = []
    for k in kinds:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    return " ".join(f"{n}{k[0].upper()}" for k, n in runs)


def register(app: typer.Typer) -> None:
    @app.command("model-info")
    def model_info(
        model: Path = typer.Option(..., "--model", help="our model YAML or a Hugging Face config.json"),
        json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
    ) -> None:
        """Parameter counts (total, active per token, by component), layer mix, KV/state sizes."""
        from k3sim.output import human_bytes, print_json, print_kv, print_table

        info = model_info_result(str(model))
        if json_out:
            print_json(info)
            return
        lay = info["layers"]
        print_kv(f"{info['model']}", [
            ("total params", f"{info['total_params'] / 1e9:,.2f} B"),
            ("active params per token", f"{info['active_params'] / 1e9:,.2f} B"),
            ("weights in stored formats", human_bytes(info["weight_bytes"])),
            ("layers (KDA / MLA)", f"{lay['num_layers']} ({lay['num_kda_layers']} / {lay['num_mla_layers']})"),
            ("FFN (dense / MoE)", f"{lay['num_dense_ffn_layers']} / {lay['num_moe_layers']}"),
            ("layer pattern (K=KDA, M=MLA)", _pattern(lay["layer_kinds"])),
            ("AttnRes blocks", lay["num_attn_res_blocks"]),
            ("KDA state per request", human_bytes(info["kda_state_bytes_per_request"])),
            ("MLA KV per token", human_bytes(info["mla_kv_bytes_per_token"])),
            ("conv state per request", human_bytes(info["conv_state_bytes_per_request"])),
            ("AttnRes blocks per token in flight", human_bytes(info["attn_res_block_bytes_per_token"])),
        ])
        print_table("parameters by component", ["component", "total", "active per token"], [
            (c, f"{v['total']:,}", f"{v['active']:,}") for c, v in info["params_by_component"].items()])
