"""Charts for the nightly HTML report, drawn with matplotlib into self-contained SVG data URIs.

Each chart is its own SVG document inside an <img>, so the report is one file with no scripts, and the ids
matplotlib writes into one SVG cannot collide with another's.
"""

import base64
import io
from collections.abc import Sequence

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

BLUE = "#3b6ea8"
GREY = "#9aa5b1"
RED = "#c0392b"
GREEN = "#2e8b57"
_STYLE = {
    # Text stays text (smaller files, crisp at any zoom); the viewer's sans-serif font draws it.
    "svg.fonttype": "none",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titleweight": "bold",
    "axes.titlesize": 10,
}


def _render(fig: Figure) -> str:
    buffer = io.BytesIO()
    with matplotlib.rc_context(_STYLE):
        fig.savefig(buffer, format="svg")
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode()


def _figure(
    width: float = 7.0, height: float = 2.8, *, left: float = 0.1, bottom: float = 0.2
) -> tuple[Figure, object]:
    # Fixed margins instead of constrained layout or a tight bounding box: each of those lays the figure out
    # twice, which made a month's reports (150 charts) take half a minute.
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(width, height))
        fig.subplots_adjust(left=left, right=0.88, bottom=bottom, top=0.88)
        ax = fig.subplots()
    return fig, ax


def trend_chart(trend: Sequence[dict]) -> str:
    """Credits total per day (bars) and orders per day (line) over the trend window; gaps where no run reported."""
    fig, ax = _figure()
    labels = [row["date"][5:] for row in trend]
    credits = [row["credits_total"] or 0 for row in trend]
    colours = [BLUE if row["credits_total"] is not None else GREY for row in trend]
    ax.bar(range(len(trend)), credits, color=colours, label="credits awarded (total)")
    ax.set_ylabel("credits")
    ax.set_title(f"Credits per day, last {len(trend)} days")
    step = max(1, len(labels) // 10)
    ax.set_xticks(range(0, len(labels), step), labels[::step])
    orders_axis = ax.twinx()
    orders_axis.plot(
        range(len(trend)), [row["orders"] for row in trend], color=RED, marker=".", linewidth=1.2, label="orders"
    )
    orders_axis.set_ylabel("orders")
    orders_axis.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + orders_axis.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", fontsize=8, frameon=False)
    return _render(fig)


def distribution_chart(histogram: Sequence[dict], percentiles: dict) -> str:
    """Users per bucket of credits earned that day, with the percentiles in the title."""
    fig, ax = _figure(bottom=0.3)
    labels = [_bucket_label(row["lower"], row["upper"]) for row in histogram]
    ax.bar(labels, [row["users"] for row in histogram], color=BLUE)
    ax.set_xlabel("credits earned by a user that day")
    ax.set_ylabel("users")
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_title(
        "Credits per user: p50 {p50}, p90 {p90}, p99 {p99}, max {max}".format(
            **{k: _num(percentiles.get(k)) for k in ("p50", "p90", "p99", "max")}
        )
    )
    return _render(fig)


def top_users_chart(top_users: Sequence[dict]) -> str:
    """The day's top users by credits earned."""
    height = max(1.6, 0.3 * len(top_users) + 0.8)
    fig, ax = _figure(height=height, left=0.16, bottom=0.5 / height)
    names = [f"user {row['user_id']}" for row in reversed(top_users)]
    ax.barh(names, [row["credits_total"] for row in reversed(top_users)], color=BLUE)
    ax.set_xlabel("credits earned")
    ax.set_title(f"Top {len(top_users)} users by credits")
    return _render(fig)


def latency_chart(histogram: Sequence[dict], summary: dict) -> str:
    """Credits per award-latency bucket, with p50/p95/p99 in the title."""
    fig, ax = _figure(bottom=0.3)
    labels = [_bucket_label(row["lower"], row["upper"], unit="s") for row in histogram]
    ax.bar(labels, [row["credits"] for row in histogram], color=BLUE)
    ax.set_xlabel("order placed to credit awarded")
    ax.set_ylabel("credits")
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_title(
        "Award latency: p50 {p50}s, p95 {p95}s, p99 {p99}s".format(
            **{k: _num(summary.get(k)) for k in ("p50", "p95", "p99")}
        )
    )
    return _render(fig)


def violations_chart(counts: dict[str, int]) -> str:
    """Violations per consistency check (red where a check found any)."""
    fig, ax = _figure(height=2.6, left=0.3, bottom=0.18)
    names = list(reversed(counts))
    values = [counts[name] for name in names]
    ax.barh(names, values, color=[RED if v else GREEN for v in values])
    ax.set_xlabel("violations")
    ax.set_xlim(left=0, right=max(1, *values) * 1.15)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,}", va="center", fontsize=8)
    ax.set_title("Violations per check")
    return _render(fig)


def _bucket_label(lower: int, upper: int | None, unit: str = "") -> str:
    if upper is None:
        return f"{lower:,}{unit}+"
    if unit:
        return f"{lower:,}-{upper:,}{unit}"
    return f"{lower:,}" if upper - lower == 1 else f"{lower:,}-{upper - 1:,}"


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}".rstrip("0").rstrip(".")
