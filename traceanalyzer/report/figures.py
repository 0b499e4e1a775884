"""The report's figures, drawn with matplotlib (Agg: no display needed) from one run's results.

Each ``fig_*`` function returns a :class:`Figure` (PNG bytes, title, caption) or None when it does
not apply to the run (no collectives, no pipeline). Text from the trace (op names) is drawn with
matplotlib's math parsing off, so a ``$`` in a kernel name is printed, not interpreted.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # before pyplot: the report runs on headless CI machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .load import RunData  # noqa: E402

#: Resolution of the embedded PNGs: sharp enough on a laptop screen, small enough to embed (~50 kB).
DPI = 90
#: Longest op name drawn on an axis; longer names are cut with an ellipsis (the tables show them whole).
MAX_LABEL_CHARS = 60
#: Ops shown in the top-ops chart.
TOP_OPS = 10
#: Rank x step grids up to this many cells get their values written in the cells.
ANNOTATE_MAX_CELLS = 160
#: A figure with one row per rank (or stage) grows with the job up to this height (inches); beyond
#: MAX_TICKS rows not every row is labelled (a 1,024-rank job must not make a 100,000-pixel PNG).
MAX_HEIGHT_IN = 12.0
MAX_TICKS = 40

COLORS = {"compute": "#4C72B0", "overlapped": "#55A868", "exposed comm": "#C44E52", "memory": "#8172B2",
          "idle": "#CCCCCC", "warmup": "#BBBBBB", "cooldown": "#999999", "stall": "#E07B39", "other": "#E8C547"}

_RC = {"text.parse_math": False, "font.size": 9, "axes.titlesize": 10, "figure.dpi": DPI}


@dataclass
class Figure:
    name: str
    title: str
    caption: str
    png: bytes


def _height(rows: int, per_row: float, base: float) -> float:
    return min(base + per_row * rows, MAX_HEIGHT_IN)


def _ticks(n: int) -> list[int]:
    """Positions of the labelled rows: all of them, or an even subset of MAX_TICKS."""
    return list(range(n)) if n <= MAX_TICKS else sorted(set(np.linspace(0, n - 1, MAX_TICKS).astype(int)))


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _label(s) -> str:
    s = str(s)
    return s if len(s) <= MAX_LABEL_CHARS else s[:MAX_LABEL_CHARS - 1] + "…"


def _heat(ax, grid: pd.DataFrame, title: str, fig):
    im = ax.imshow(grid.to_numpy(dtype=float) / 1e6, aspect="auto", cmap="magma_r")
    ys, xs = _ticks(len(grid.index)), _ticks(len(grid.columns))
    ax.set_yticks(ys, [str(grid.index[i]) for i in ys])
    ax.set_xticks(xs, [str(grid.columns[i]) for i in xs])
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="ms")
    if grid.size <= ANNOTATE_MAX_CELLS:
        vals = grid.to_numpy(dtype=float) / 1e6
        lo, hi = (np.nanmin(vals), np.nanmax(vals)) if np.isfinite(vals).any() else (0, 0)
        for (i, j), v in np.ndenumerate(vals):
            if np.isfinite(v):  # white text on the dark half of the colour map
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if hi > lo and (v - lo) / (hi - lo) > 0.5 else "black")


def imposed_wait_grid(data: RunData) -> pd.DataFrame:
    """rank x step: the waits a rank imposed on its peers (summed over them) at the collectives of
    the step where it arrived last, ns; 0 where it was never last. Empty without collectives."""
    c = data.r("collectives")
    ph = data.r("phases")
    if c.empty or ph.empty:
        return pd.DataFrame()
    c = c[c["step"].notna() & c["last_arriver"].notna() & (c["n_ranks"] > 1)]
    if c.empty:
        return pd.DataFrame()
    grid = c.pivot_table(index="last_arriver", columns="step", values="total_wait_ns", aggfunc="sum")
    ranks, steps = sorted(ph["rank"].unique()), sorted(ph["step"].unique())
    grid = grid.reindex(index=ranks, columns=steps).fillna(0.0)
    grid.index.name, grid.columns.name = "rank", "step"
    return grid


def fig_step_heatmap(data: RunData) -> Figure | None:
    """Synchronous data parallelism (collectives, no pipeline) makes every rank's step time equal:
    a slow rank is not a hot row of step time, it is a hot row of the wait it imposes on its peers,
    so that is what the left panel shows there. Without collectives (or on a pipeline, where the
    stages' step times also line up) it shows step time, and the caption says what that can tell."""
    ph = data.r("phases")
    if ph.empty:
        return None
    tb = data.r("temporal_breakdown")
    tb = tb[tb["step"].notna()] if not tb.empty else tb
    waits = imposed_wait_grid(data) if data.r("pipeline_shape").empty else pd.DataFrame()
    with plt.rc_context(_RC):
        fig, axes = plt.subplots(1, 2 if not tb.empty else 1, figsize=(10, _height(ph["rank"].nunique(), 0.35, 2.2)),
                                 squeeze=False)
        if not waits.empty:
            _heat(axes[0][0], waits, "wait imposed on peers (ms)", fig)
        else:
            _heat(axes[0][0], ph.pivot_table(index="rank", columns="step", values="step_ns"), "step time (ms)", fig)
        if not tb.empty:
            _heat(axes[0][1], tb.pivot_table(index="rank", columns="step", values="compute_ns"), "compute time (ms)", fig)
        fig.tight_layout()
        png = _png(fig)
    right = (" Right: compute per rank and step; a rank hot in both did more work (imbalance), a rank hot only on the "
             "left was delayed outside compute (its host, a sleep, contention).") if not tb.empty else ""
    if not waits.empty:
        return Figure("step_heatmap", "Wait each rank imposed on its peers, and compute, per rank and step",
                      "Left: per step, the time the other ranks sat in collectives waiting for this rank (summed over "
                      "them, at the collectives it reached last). Synchronous data parallelism gives every rank the "
                      "same step time, so a slow rank shows up here, not as a longer step." + right, png)
    return Figure("step_heatmap", "Step time and compute time per rank and step",
                  "Left: step time per rank and step (ranks that synchronise every step have about equal step times, "
                  "so a slow rank need not stand out here; see the findings)." + right, png)


def fig_arrival_skew(data: RunData) -> Figure | None:
    c = data.r("collectives")
    c = c[c["n_ranks"] > 1] if not c.empty else c
    if c.empty:
        return None
    c = c.sort_values("first_arrival_ns")
    with plt.rc_context(_RC):
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.2), gridspec_kw={"width_ratios": [2.2, 1]})
        ranks = sorted(int(r) for r in c["last_arriver"].dropna().unique())
        cmap = plt.get_cmap("tab10")
        for i, r in enumerate(ranks):
            sel = c["last_arriver"] == r
            a.scatter(np.flatnonzero(sel.to_numpy()), c.loc[sel, "arrival_skew_ns"] / 1e6, s=14, color=cmap(i % 10),
                      label=f"rank {r}")
        a.set_xlabel("collective (in time order)")
        a.set_ylabel("arrival skew (ms)")
        a.set_title("arrival skew per collective, coloured by the last arriver")
        a.legend(fontsize=7, ncol=min(len(ranks), 4))
        wait = c.groupby("last_arriver")["total_wait_ns"].sum() / 1e6
        b.bar([str(int(r)) for r in wait.index], wait.to_numpy(), color=[cmap(ranks.index(int(r)) % 10) for r in wait.index])
        b.set_xlabel("last arriver (rank)")
        b.set_ylabel("peer wait it caused (ms, window)")
        b.set_title("who the others waited for")
        fig.tight_layout()
        png = _png(fig)
    return Figure("arrival_skew", "Collective arrival skew: who arrives last, by how much",
                  "Arrival skew = latest - earliest arrival of the ranks at one collective; the right panel adds up "
                  "the waits of all peers charged to each last arriver.", png)


def fig_pipeline_timeline(data: RunData) -> Figure | None:
    idle, ph, bub = data.pipeline_idle, data.r("phases"), data.r("pipeline_bubbles")
    if bub.empty or idle is None or idle.empty or ph.empty:
        return None
    step_ns = bub.groupby("step")["step_ns"].median()
    step = int((step_ns - step_ns.median()).abs().idxmin())  # the most typical step
    st = ph[ph["step"] == step].set_index("rank")
    stages = bub[bub["step"] == step][["rank", "stage"]].drop_duplicates().sort_values("stage")
    t0 = float(st["step_start_ns"].min())
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(10, _height(len(stages), 0.5, 1.6)))
        seen = set()
        for y, (rank, stage) in enumerate(zip(stages["rank"], stages["stage"])):
            if rank not in st.index:
                continue
            lo, hi = (float(st.loc[rank, "step_start_ns"]) - t0) / 1e6, (float(st.loc[rank, "step_end_ns"]) - t0) / 1e6
            ax.barh(y, hi - lo, left=lo, color=COLORS["compute"], height=0.6,
                    label="busy" if "busy" not in seen else None)
            seen.add("busy")
            mine = idle[(idle["rank"] == rank) & (idle["step"] == step)]
            for kind, g in mine.groupby("kind"):
                ax.barh([y] * len(g), g["dur_ns"] / 1e6, left=(g["lo_ns"] - t0) / 1e6, height=0.6,
                        color=COLORS.get(kind, "#DDDDDD"), label=f"idle: {kind}" if kind not in seen else None,
                        hatch="//" if kind == "stall" else None, edgecolor="white", linewidth=0)
                seen.add(kind)
        ax.set_yticks(range(len(stages)), [f"stage {s} (rank {r})" for r, s in zip(stages["rank"], stages["stage"])])
        ax.invert_yaxis()
        ax.set_xlabel(f"time in step {step} (ms)")
        ax.set_title(f"pipeline timeline of step {step}: busy vs bubbles (idle by cause)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=5)
        fig.tight_layout()
        png = _png(fig)
    return Figure("pipeline_timeline", "Pipeline: per-stage timeline with bubbles shaded",
                  "Blue: the stage's own time; shaded: idle, split into warm-up, cool-down, stalls waiting on a "
                  "peer (hatched) and other (its own host-side delays).", png)


def fig_overlap_bars(data: RunData) -> Figure | None:
    tb, ov = data.r("temporal_breakdown"), data.r("overlap")
    tb = tb[tb["step"].notna()] if not tb.empty else tb
    if tb.empty:
        return None
    per = tb.groupby("rank")[["compute_ns", "comm_ns", "memory_ns", "idle_ns"]].mean()
    steps = tb.groupby("rank")["step"].nunique()
    over = (ov.set_index("rank")["overlapped_ns"] / steps).reindex(per.index).fillna(0) if not ov.empty else 0 * per["comm_ns"]
    parts = {"compute": (per["compute_ns"] - over).clip(lower=0), "overlapped": over, "exposed comm": per["comm_ns"],
             "memory": per["memory_ns"], "idle": per["idle_ns"]}
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(9, _height(len(per), 0.4, 1.6)))
        left = np.zeros(len(per))
        ys = [f"rank {int(r)}" for r in per.index]
        for name, v in parts.items():
            v = v.to_numpy(dtype=float) / 1e6
            ax.barh(ys, v, left=left, color=COLORS[name], label=name)
            left += v
        ax.invert_yaxis()
        ax.set_xlabel("ms per step (mean)")
        ax.set_title("where each rank's step went")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=5)
        fig.tight_layout()
        png = _png(fig)
    return Figure("overlap_bars", "Overlap per rank: compute, overlapped and exposed communication, idle",
                  "Compute: compute with no communication; overlapped: communication hidden under compute; exposed "
                  "comm: communication with nothing else running (includes waiting for peers).", png)


def fig_imbalance(data: RunData) -> Figure | None:
    """Compute per rank; only ranks the imbalance analysis flags get their ratio written above the
    box, so the figure never labels a rank beside "No imbalance found"."""
    tb = data.r("temporal_breakdown")
    tb = tb[tb["step"].notna()] if not tb.empty else tb
    if tb.empty or tb["rank"].nunique() < 2:
        return None
    ranks = sorted(int(r) for r in tb["rank"].unique())
    vals = [tb.loc[tb["rank"] == r, "compute_ns"].to_numpy(dtype=float) / 1e6 for r in ranks]
    mean = tb.groupby("step")["compute_ns"].mean().median() / 1e6
    im = data.r("imbalance")
    flagged = im[im["is_finding"].fillna(False).astype(bool)].set_index("rank") if not im.empty else pd.DataFrame()
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(9, 3))
        ax.boxplot(vals, showmeans=True)
        ax.set_xticks(range(1, len(ranks) + 1), [str(r) for r in ranks])
        ax.axhline(mean, color=COLORS["exposed comm"], linestyle="--", linewidth=1, label="mean of the ranks (median step)")
        for i, r in enumerate(ranks, start=1):
            if r in flagged.index and pd.notna(flagged.loc[r, "ratio_to_mean"]):
                ax.annotate(f"{flagged.loc[r, 'ratio_to_mean']:.2f}x: imbalanced", (i, np.nanmax(vals[i - 1])), ha="center",
                            xytext=(0, 4), textcoords="offset points", fontsize=7, color=COLORS["exposed comm"])
        ax.set_xlabel("rank")
        ax.set_ylabel("compute per step (ms)")
        ax.set_title("compute per step and rank" + (" (flagged ranks labelled with their ratio to the mean)"
                                                    if not flagged.empty else ""))
        ax.legend(fontsize=7)
        fig.tight_layout()
        png = _png(fig)
    p = data.params
    rule = (f"at least {p.get('imbalance_min_ratio', 1.1):g}x the mean with an excess of at least "
            f"{p.get('imbalance_min_excess_pct', 5.0):g}% of the step")
    if flagged.empty:
        cap = (f"Each box is one rank's compute over the steps. No rank is imbalanced ({rule}): the spread shown "
               f"is below the thresholds.")
    else:
        cap = (f"Each box is one rank's compute over the steps; the labelled rank(s) compute {rule} "
               f"(ratio to the mean above the box).")
    return Figure("imbalance", "Imbalance: distribution of compute per rank", cap, png)


def fig_top_ops(data: RunData) -> Figure | None:
    kb, tb = data.r("kernel_breakdown"), data.r("temporal_breakdown")
    kb = kb[kb["category"] == "compute"] if not kb.empty else kb
    if kb.empty:
        return None
    rank_steps = max(int(tb[tb["step"].notna()].groupby("rank")["step"].nunique().sum()), 1) if not tb.empty else 1
    top = (kb.groupby("name")["total_ns"].sum() / rank_steps).sort_values(ascending=False).head(TOP_OPS)
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(9, 0.3 * len(top) + 1.2))
        ax.barh([_label(n) for n in top.index], top.to_numpy() / 1e6, color=COLORS["compute"])
        ax.invert_yaxis()
        ax.set_xlabel("ms per step and rank (whole window, all ranks)")
        ax.set_title("top compute kernels / operators")
        fig.tight_layout()
        png = _png(fig)
    return Figure("top_ops", "Top kernels / operators by time",
                  "Compute kernels (GPU) or CPU operators, summed over ranks; nested CPU operators each count their "
                  "own duration.", png)


FIGURES = (fig_step_heatmap, fig_arrival_skew, fig_pipeline_timeline, fig_overlap_bars, fig_imbalance, fig_top_ops)


def all_figures(data: RunData) -> tuple[list[Figure], list[str]]:
    """The figures that apply to the run, and one line per figure that could not be drawn (a
    trace the figure did not foresee must not cost the whole report)."""
    figs, errors = [], []
    for make in FIGURES:
        try:
            fig = make(data)
        except Exception as exc:  # noqa: BLE001 - reported in the page, the rest still renders
            plt.close("all")
            errors.append(f"{make.__name__[4:]}: {type(exc).__name__}: {exc}")
            continue
        if fig is not None:
            figs.append(fig)
    return figs, errors

