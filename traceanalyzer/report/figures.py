"""The report's figures, from one run's results: which apply (cheap), then drawn (matplotlib, Agg).

Two steps, so a report that shows no figure pays for none: ``plan_figures`` decides from the data
which figures apply to the run (no collectives: no arrival skew; no pipeline: no timeline) and
prepares what each one plots, its title and its caption, without importing matplotlib (the JSON
report lists the figures by name and title only); ``render_figures`` draws them as PNGs (the HTML,
Markdown and PDF reports, which embed them). A :class:`Figure` left undrawn draws itself the first
time its ``png`` is read. Each figure is drawn on its own ``matplotlib.figure.Figure`` with an Agg
canvas, never through pyplot: no backend is chosen for the process and no global figure list is
kept. Text from the trace (op names) is drawn with matplotlib's math parsing off, so a ``$`` in a
kernel name is printed, not interpreted.
"""
from __future__ import annotations

import io
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from ..errors import TraceAnalyzerError
from .load import RunData

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
#: Width of one character of a 9-pt label and the height of one line of text with its padding, in
#: inches (DejaVu Sans: digits 0.078 in, text 0.063-0.07 in). Margins are set from them, not measured.
CHAR_IN = 0.078
LINE_IN = 0.2

COLORS = {"compute": "#4C72B0", "overlapped": "#55A868", "exposed comm": "#C44E52", "memory": "#8172B2",
          "idle": "#CCCCCC", "warmup": "#BBBBBB", "cooldown": "#999999", "stall": "#E07B39", "other": "#E8C547"}

_RC = {"text.parse_math": False, "font.size": 9, "axes.titlesize": 10, "figure.dpi": DPI}


@dataclass
class Figure:
    """One figure of a run: its name, title and caption (known without drawing it) and, once drawn,
    its PNG. ``draw`` is a module-level function (so a Figure pickles, for a Dask report) called as
    ``draw(mpl_figure, **args)``."""
    name: str
    title: str
    caption: str
    size_in: tuple[float, float] = (9.0, 3.0)
    draw: Callable | None = field(default=None, repr=False)
    args: dict = field(default_factory=dict, repr=False)
    drawn: bytes | None = field(default=None, repr=False)

    @property
    def png(self) -> bytes:
        """The PNG bytes (drawn now if they were not yet)."""
        if self.drawn is None:
            self.drawn = _render(self)
        return self.drawn


def _render(f: Figure) -> bytes:
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure
    with rc_context(_RC), _backend_named():
        fig = MplFigure(figsize=f.size_in, dpi=DPI)
        FigureCanvasAgg(fig)
        f.draw(fig, **f.args)   # it sets its own margins (_place): no layout pass measures the texts
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


@contextmanager
def _backend_named():
    """rcParams["backend"] reads "agg" while a figure is drawn, as it was before.

    Why: matplotlib resolves a backend not chosen yet the first time anything reads
    ``rcParams["backend"]`` -- ``boxplot`` reads every rcParam -- by importing pyplot and switching
    the process to a backend (trying Qt, GTK, Tk first where there is a display). The figures are
    drawn on their own Agg canvas and need none; the value is put back as it was (``rc_context``
    itself leaves "backend" alone)."""
    import matplotlib
    rc = matplotlib.rcParams
    saved = dict.__getitem__(rc, "backend")
    dict.__setitem__(rc, "backend", "agg")
    try:
        yield
    finally:
        dict.__setitem__(rc, "backend", saved)


def _place(fig, left: float, bottom: float, right: float = 0.25, top: float = 0.35, wspace: float = 0.0,
           cols: int = 1) -> None:
    """Margins and the space between ``cols`` panels, in inches, computed by each figure from the
    labels it draws (``_axis_in``). Not ``tight_layout``: it lays out every text of the figure once
    more to measure it (a fifth of drawing the 5 figures of a small run)."""
    w, h = fig.get_size_inches()
    cell = (w - left - right - (cols - 1) * wspace) / cols
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=min(bottom / h, 0.45),
                        top=max(1 - top / h, 0.55), wspace=wspace / cell if cols > 1 else None)


def _axis_in(chars: int, label: bool = True) -> float:
    """Inches beside an axis for tick labels of ``chars`` characters and, with ``label``, its label."""
    return 0.15 + chars * CHAR_IN + (LINE_IN if label else 0.0)


def _num_chars(values) -> int:
    """Characters of the longest tick label of an axis showing ``values`` (at most 3 digits after
    the point below 10; a minus sign where any is negative)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    hi = float(np.abs(v).max()) if v.size else 1.0
    digits = len(f"{hi:.0f}") + (2 if hi < 10 else 0)
    return digits + (1 if v.size and v.min() < 0 else 0)


def _legend_below(fig, ax, ncol: int = 5) -> float:
    """The axes' legend centred under the figure; the inches it takes (what the bottom margin adds)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return 0.0
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(ncol, len(handles)), frameon=False)
    return 0.1 + 0.2 * -(-len(handles) // ncol)


def _height(rows: int, per_row: float, base: float) -> float:
    return min(base + per_row * rows, MAX_HEIGHT_IN)


def _ticks(n: int) -> list[int]:
    """Positions of the labelled rows: all of them, or an even subset of MAX_TICKS."""
    return list(range(n)) if n <= MAX_TICKS else sorted(set(np.linspace(0, n - 1, MAX_TICKS).astype(int)))


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
    if not waits.empty:
        left = (waits, "wait imposed on peers (ms)")
    else:
        left = (ph.pivot_table(index="rank", columns="step", values="step_ns"), "step time (ms)")
    right = (tb.pivot_table(index="rank", columns="step", values="compute_ns"), "compute time (ms)") if not tb.empty else None
    size = (10, _height(ph["rank"].nunique(), 0.35, 2.2))
    args = {"left": left, "right": right}
    right_text = (" Right: compute per rank and step; a rank hot in both did more work (imbalance), a rank hot only "
                  "on the left was delayed outside compute (its host, a sleep, contention).") if not tb.empty else ""
    if not waits.empty:
        return Figure("step_heatmap", "Wait each rank imposed on its peers, and compute, per rank and step",
                      "Left: per step, the time the other ranks sat in collectives waiting for this rank (summed over "
                      "them, at the collectives it reached last). Synchronous data parallelism gives every rank the "
                      "same step time, so a slow rank shows up here, not as a longer step." + right_text,
                      size, _draw_step_heatmap, args)
    return Figure("step_heatmap", "Step time and compute time per rank and step",
                  "Left: step time per rank and step (ranks that synchronise every step have about equal step times, "
                  "so a slow rank need not stand out here; see the findings)." + right_text,
                  size, _draw_step_heatmap, args)


def _draw_step_heatmap(fig, left, right) -> None:
    panels = [p for p in (left, right) if p is not None]
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (grid, title) in zip(axes, panels):
        _heat(ax, grid, title, fig)
    y_in = _axis_in(max(len(str(r)) for grid, _ in panels for r in grid.index))
    bar_in = _axis_in(max(_num_chars(grid.to_numpy(dtype=float) / 1e6) for grid, _ in panels))
    _place(fig, left=y_in, bottom=0.55, right=bar_in, wspace=bar_in + y_in, cols=len(panels))


def fig_arrival_skew(data: RunData) -> Figure | None:
    c = data.r("collectives")
    c = c[c["n_ranks"] > 1] if not c.empty else c
    if c.empty:
        return None
    c = c.sort_values("first_arrival_ns")[["last_arriver", "arrival_skew_ns", "total_wait_ns"]]
    return Figure("arrival_skew", "Collective arrival skew: who arrives last, by how much",
                  "Arrival skew = latest - earliest arrival of the ranks at one collective; the right panel adds up "
                  "the waits of all peers charged to each last arriver.", (10, 3.2), _draw_arrival_skew, {"c": c})


def _draw_arrival_skew(fig, c: pd.DataFrame) -> None:
    import matplotlib
    a, b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
    ranks = sorted(int(r) for r in c["last_arriver"].dropna().unique())
    cmap = matplotlib.colormaps["tab10"]
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
    b_in = _axis_in(_num_chars(wait.to_numpy()))
    _place(fig, left=_axis_in(_num_chars(c["arrival_skew_ns"].to_numpy(dtype=float) / 1e6)), bottom=0.55,
           wspace=b_in + 0.1, cols=2)


def fig_pipeline_timeline(data: RunData) -> Figure | None:
    """Applies where the pipeline's stages sat idle. Its idle intervals not loaded (a report that
    only lists its figures), pipeline_bubbles says so: its idle_ns sums them per stage and step."""
    idle, ph, bub = data.pipeline_idle, data.r("phases"), data.r("pipeline_bubbles")
    if bub.empty or ph.empty:
        return None
    if (idle is None and not bub["idle_ns"].fillna(0).gt(0).any()) or (idle is not None and idle.empty):
        return None
    step_ns = bub.groupby("step")["step_ns"].median()
    step = int((step_ns - step_ns.median()).abs().idxmin())  # the most typical step
    st = ph[ph["step"] == step].set_index("rank")
    rows = bub[bub["step"] == step]
    n_pipes = rows["pipeline_id"].nunique() if "pipeline_id" in rows else 1
    if n_pipes > 1:   # one pipeline (of thousands, at scale): the one with the first slow stage, else the first
        slow = data.r("pipeline_slow_stages")
        slow = slow[slow["is_finding"].fillna(False).astype(bool)] if not slow.empty and "is_finding" in slow else slow
        pick = int(slow.sort_values("rank_order")["pipeline_id"].iloc[0]) if not slow.empty else int(rows["pipeline_id"].min())
        rows = rows[rows["pipeline_id"] == pick]
    stages = rows[["rank", "stage"]].drop_duplicates().sort_values("stage")
    st = st.loc[st.index.intersection(stages["rank"])]
    args = {"step": step, "st": st[["step_start_ns", "step_end_ns"]], "stages": stages, "n_pipes": n_pipes,
            "idle": None if idle is None else idle[(idle["step"] == step) & idle["rank"].isin(stages["rank"])]}
    return Figure("pipeline_timeline", "Pipeline: per-stage timeline with bubbles shaded",
                  "Blue: the stage's own time; shaded: idle, split into warm-up, cool-down, stalls waiting on a "
                  "peer (hatched) and other (its own host-side delays).", (10, _height(len(stages), 0.5, 1.6)),
                  _draw_pipeline_timeline, args)


def _draw_pipeline_timeline(fig, step: int, st: pd.DataFrame, stages: pd.DataFrame, idle: pd.DataFrame | None,
                            n_pipes: int = 1) -> None:
    if idle is None:
        raise TraceAnalyzerError("the pipeline's idle intervals were not loaded (the report was built to list its "
                                 "figures only: figures='listed')")
    t0 = float(st["step_start_ns"].min())
    ax = fig.subplots()
    seen = set()
    for y, (rank, stage) in enumerate(zip(stages["rank"], stages["stage"])):
        if rank not in st.index:
            continue
        lo, hi = (float(st.loc[rank, "step_start_ns"]) - t0) / 1e6, (float(st.loc[rank, "step_end_ns"]) - t0) / 1e6
        # one collection per stage and kind (broken_barh), not one patch per interval: a stage idles
        # hundreds of times a step
        ax.broken_barh([(lo, hi - lo)], (y - 0.3, 0.6), color=COLORS["compute"],
                       label="busy" if "busy" not in seen else None)
        seen.add("busy")
        mine = idle[(idle["rank"] == rank) & (idle["step"] == step)]
        for kind, g in mine.groupby("kind"):
            spans = list(zip(((g["lo_ns"] - t0) / 1e6).tolist(), (g["dur_ns"] / 1e6).tolist()))
            ax.broken_barh(spans, (y - 0.3, 0.6), facecolor=COLORS.get(kind, "#DDDDDD"),
                           label=f"idle: {kind}" if kind not in seen else None,
                           hatch="//" if kind == "stall" else None, edgecolor="white", linewidth=0)
            seen.add(kind)
    labels = [f"stage {s} (rank {r})" for r, s in zip(stages["rank"], stages["stage"])]
    ax.set_yticks(range(len(stages)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"time in step {step} (ms)")
    which = f" (pipeline of rank {int(stages['rank'].iloc[0])}, 1 of {n_pipes})" if n_pipes > 1 else ""
    ax.margins(x=0.01)
    ax.set_title(f"pipeline timeline of step {step}{which}: busy vs bubbles (idle by cause)")
    _place(fig, left=_axis_in(max(map(len, labels)), label=False), bottom=0.55 + _legend_below(fig, ax))


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
    return Figure("overlap_bars", "Overlap per rank: compute, overlapped and exposed communication, idle",
                  "Compute: compute with no communication; overlapped: communication hidden under compute; exposed "
                  "comm: communication with nothing else running (includes waiting for peers).",
                  (9, _height(len(per), 0.4, 1.6)), _draw_overlap_bars,
                  {"ranks": [int(r) for r in per.index], "parts": parts})


def _draw_overlap_bars(fig, ranks: list[int], parts: dict) -> None:
    ax = fig.subplots()
    left = np.zeros(len(ranks))
    ys = [f"rank {r}" for r in ranks]
    for name, v in parts.items():
        v = v.to_numpy(dtype=float) / 1e6
        ax.barh(ys, v, left=left, color=COLORS[name], label=name)
        left += v
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (mean)")
    ax.set_title("where each rank's step went")
    _place(fig, left=_axis_in(max(map(len, ys)), label=False), bottom=0.55 + _legend_below(fig, ax))


def fig_imbalance(data: RunData) -> Figure | None:
    """Compute per rank; only ranks the imbalance analysis flags get their ratio written above the
    box, so the figure never labels a rank beside "No imbalance found"."""
    tb = data.r("temporal_breakdown")
    tb = tb[tb["step"].notna()] if not tb.empty else tb
    if tb.empty or tb["rank"].nunique() < 2:
        return None
    by_rank = {int(r): g.to_numpy(dtype=float) / 1e6 for r, g in tb.groupby("rank")["compute_ns"]}  # O(rows), not per rank
    ranks = sorted(by_rank)
    vals = [by_rank[r] for r in ranks]
    mean = tb.groupby("step")["compute_ns"].mean().median() / 1e6
    im = data.r("imbalance")
    flagged = im[im["is_finding"].fillna(False).astype(bool)].set_index("rank") if not im.empty else pd.DataFrame()
    labels = {r: float(flagged.loc[r, "ratio_to_mean"]) for r in ranks
              if r in flagged.index and pd.notna(flagged.loc[r, "ratio_to_mean"])}
    p = data.params
    rule = (f"at least {p.get('imbalance_min_ratio', 1.1):g}x the mean with an excess of at least "
            f"{p.get('imbalance_min_excess_pct', 5.0):g}% of the step")
    if flagged.empty:
        cap = (f"Each box is one rank's compute over the steps. No rank is imbalanced ({rule}): the spread shown "
               f"is below the thresholds.")
    else:
        cap = (f"Each box is one rank's compute over the steps; the labelled rank(s) compute {rule} "
               f"(ratio to the mean above the box).")
    return Figure("imbalance", "Imbalance: distribution of compute per rank", cap, (9, 3), _draw_imbalance,
                  {"ranks": ranks, "vals": vals, "mean": mean, "labels": labels, "any_flagged": not flagged.empty})


def _draw_imbalance(fig, ranks: list[int], vals: list, mean: float, labels: dict, any_flagged: bool) -> None:
    ax = fig.subplots()
    ax.boxplot(vals, showmeans=True)
    ax.set_xticks([i + 1 for i in _ticks(len(ranks))], [str(ranks[i]) for i in _ticks(len(ranks))])
    ax.axhline(mean, color=COLORS["exposed comm"], linestyle="--", linewidth=1, label="mean of the ranks (median step)")
    for i, r in enumerate(ranks, start=1):
        if r in labels:
            ax.annotate(f"{labels[r]:.2f}x: imbalanced", (i, np.nanmax(vals[i - 1])), ha="center",
                        xytext=(0, 4), textcoords="offset points", fontsize=7, color=COLORS["exposed comm"])
    ax.set_xlabel("rank")
    ax.set_ylabel("compute per step (ms)")
    ax.set_title("compute per step and rank" + (" (flagged ranks labelled with their ratio to the mean)"
                                                if any_flagged else ""))
    ax.legend(fontsize=7)
    _place(fig, left=_axis_in(_num_chars(np.concatenate([np.ravel(v) for v in vals] + [[mean]]))), bottom=0.55)


def fig_top_ops(data: RunData) -> Figure | None:
    kb, tb = data.r("kernel_breakdown"), data.r("temporal_breakdown")
    kb = kb[kb["category"] == "compute"] if not kb.empty else kb
    if kb.empty:
        return None
    rank_steps = max(int(tb[tb["step"].notna()].groupby("rank")["step"].nunique().sum()), 1) if not tb.empty else 1
    top = (kb.groupby("name")["total_ns"].sum() / rank_steps).sort_values(ascending=False).head(TOP_OPS)
    return Figure("top_ops", "Top kernels / operators by time",
                  "Compute kernels (GPU) or CPU operators, summed over ranks; nested CPU operators each count their "
                  "own duration.", (9, 0.3 * len(top) + 1.2), _draw_top_ops,
                  {"names": [_label(n) for n in top.index], "ms": top.to_numpy() / 1e6})


def _draw_top_ops(fig, names: list[str], ms) -> None:
    ax = fig.subplots()
    ax.barh(names, ms, color=COLORS["compute"])
    ax.invert_yaxis()
    ax.set_xlabel("ms per step and rank (whole window, all ranks)")
    ax.set_title("top compute kernels / operators")
    _place(fig, left=_axis_in(max(map(len, names), default=1), label=False), bottom=0.55)


FIGURES = (fig_step_heatmap, fig_arrival_skew, fig_pipeline_timeline, fig_overlap_bars, fig_imbalance, fig_top_ops)


def plan_figures(data: RunData) -> tuple[list[Figure], list[str]]:
    """The figures that apply to the run, undrawn, and one line per figure whose data could not be
    prepared (a trace the figure did not foresee must not cost the whole report). No matplotlib."""
    figs, errors = [], []
    for make in FIGURES:
        try:
            fig = make(data)
        except Exception as exc:  # noqa: BLE001 - reported in the page, the rest still renders
            errors.append(f"{make.__name__[4:]}: {type(exc).__name__}: {exc}")
            continue
        if fig is not None:
            figs.append(fig)
    return figs, errors


def render_figures(figs: list[Figure], errors: list[str] | None = None) -> tuple[list[Figure], list[str]]:
    """``figs`` drawn (those not drawn yet), without the ones that could not be, and ``errors`` with
    one line for each of those."""
    out, errors = [], list(errors or [])
    for f in figs:
        try:
            f.png  # noqa: B018 - draws it
        except Exception as exc:  # noqa: BLE001 - reported in the page, the rest still renders
            errors.append(f"{f.name}: {type(exc).__name__}: {exc}")
            continue
        out.append(f)
    return out, errors


def all_figures(data: RunData) -> tuple[list[Figure], list[str]]:
    """The figures that apply to the run, drawn, and one line per figure that could not be drawn."""
    return render_figures(*plan_figures(data))
