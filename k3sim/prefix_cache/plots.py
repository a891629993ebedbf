"""Sweep plots: hit rate vs granularity per policy, hit rate vs capacity per policy. Written atomically."""

from __future__ import annotations

from pathlib import Path

POLICY_STYLE = {"coarse": ("tab:red", "o"), "decoupled": ("tab:blue", "s"), "full-attention": ("tab:green", "^")}


def _save(fig, path: Path) -> None:
    from k3sim.files import save_figure

    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120, bbox_inches="tight")


def plot_granularity(df, path: Path, title: str) -> None:
    """Token hit rate vs physical block, one panel per capacity; decoupled/full-attention once per hash block."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = sorted(df["capacity_bytes"].dropna().unique().tolist())
    panels: list[float | None] = ([None] if df["capacity_bytes"].isna().any() else []) + caps
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.8), sharey=True, squeeze=False)
    blocks = sorted(df["physical_block_tokens"].unique().tolist())
    hashes = sorted(df.loc[df["policy"] != "coarse", "hash_block_tokens"].unique().tolist())
    dash = {hb: ls for hb, ls in zip(hashes, ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3))])}
    for ax, cap in zip(axes[0], panels):
        d = df[df["capacity_bytes"].isna()] if cap is None else df[df["capacity_bytes"] == cap]
        for (pol, hb), g in d[d["policy"] != "coarse"].groupby(["policy", "hash_block_tokens"]):
            color, marker = POLICY_STYLE.get(pol, ("k", "x"))
            g = g.sort_values("physical_block_tokens")
            ax.plot(g["physical_block_tokens"], 100 * g["token_hit_rate"], marker=marker, color=color,
                    ls=dash.get(hb, "-"), alpha=1.0 if hb == hashes[0] else 0.6, label=f"{pol} (hash {hb})")
        c = d[d["policy"] == "coarse"].sort_values("physical_block_tokens")
        if len(c):
            color, marker = POLICY_STYLE["coarse"]
            ax.plot(c["physical_block_tokens"], 100 * c["token_hit_rate"], marker=marker, color=color,
                    label="coarse (hash = block)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(blocks)
        ax.set_xticklabels([str(b) for b in blocks], rotation=45)
        ax.minorticks_off()
        ax.set_xlabel("physical block (tokens)")
        ax.set_title("unbounded" if cap is None else f"capacity {cap / 1e9:g} GB", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("token hit rate (%)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    _save(fig, path)
    plt.close(fig)


def plot_capacity(df, path: Path, title: str, physical_block_tokens: int, hash_block_tokens: int) -> None:
    """Token hit rate vs cache capacity at one physical block; dashed lines: the unbounded value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = df[df["physical_block_tokens"] == physical_block_tokens]
    d = d[(d["policy"] == "coarse") | (d["hash_block_tokens"] == hash_block_tokens)]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for pol, g in d.groupby("policy"):
        color, marker = POLICY_STYLE.get(pol, ("k", "x"))
        fin = g[g["capacity_bytes"].notna()].sort_values("capacity_bytes")
        ax.plot(fin["capacity_bytes"], 100 * fin["token_hit_rate"], marker=marker, color=color, label=pol)
        unb = g[g["capacity_bytes"].isna()]
        if len(unb):
            ax.axhline(100 * float(unb["token_hit_rate"].iloc[0]), color=color, ls="--", lw=0.8)
    if d["capacity_bytes"].notna().any():  # an unbounded-only sweep has no capacity axis, only the dashed lines
        ax.set_xscale("log")
    ax.set_xlabel("cache capacity (bytes)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_title(f"{title}\nphysical block {physical_block_tokens}, hash block {hash_block_tokens}; dashed: unbounded")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
