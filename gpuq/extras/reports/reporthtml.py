"""`gpuq report --html FILE`: one self-contained page (charts as inline PNG, no scripts, no
links out) with the report's tables and three charts: utilization per GPU over time, queue
length over time, and the wait distribution. matplotlib is an optional extra
(the `[report]` extra of gpuq's checkout), imported only here."""

from __future__ import annotations

import base64
import html
import io
import os
import sys
import time
from pathlib import Path

from gpuq.extras.reports.report import Report, wait_summary
from gpuq.extras.reports.reportview import hours, summary_table
from gpuq.model.units import format_duration


def install_hint() -> str:
    """How to get matplotlib where this gpuq runs: the `[report]` extra of the checkout gpuq
    was installed from, with this very interpreter (a member usually cannot write the team's
    environment, so the admin who installed it runs the line)."""
    checkout = Path(__file__).resolve().parents[3]
    where = f"'{checkout}[report]'" if (checkout / "pyproject.toml").exists() else "matplotlib"
    return f"{sys.executable} -m pip install {where} (whoever installed gpuq runs it: it writes that environment)"


class ReportHtmlError(Exception):
    pass


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ReportHtmlError(
            f"--html draws its charts with matplotlib, which is not installed here. Fix: {install_hint()}"
        ) from None
    matplotlib.use("Agg")  # no display: render to memory
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return f'<img alt="" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _time_axis(ax, r: Report, n: int) -> None:
    """x in slices; ticks labelled with local clock times (dates when the window is long)."""
    fmt = "%H:%M:%S" if r.until - r.since <= 3600 else ("%H:%M" if r.until - r.since <= 86400 else "%m-%d %H:%M")
    ticks = sorted({round(i * (n - 1) / 5) for i in range(6)}) if n > 1 else [0]
    ax.set_xticks(ticks)
    ax.set_xticklabels([time.strftime(fmt, time.localtime(r.since + t * r.bucket_s)) for t in ticks])
    ax.set_xlabel(f"local time (one slice = {format_duration(r.bucket_s)})")


def utilization_chart(plt, r: Report) -> str:
    import numpy as np

    names = list(r.gpus)
    grid = np.array([[np.nan if v is None else v for v in r.gpus[k]["util_pct"]] for k in names], dtype=float)
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(names) + 1.6))
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis", vmin=0, vmax=100, interpolation="nearest")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    _time_axis(ax, r, grid.shape[1])
    ax.set_title("GPU utilization over time (white: no samples)")
    fig.colorbar(im, ax=ax, label="utilization %", pad=0.01)
    out = _png(fig)
    plt.close(fig)
    return out


def queue_chart(plt, r: Report) -> str:
    fig, ax = plt.subplots(figsize=(11, 3))
    x = range(len(r.queue_max) + 1)  # each slice drawn across its width, the last one too
    ax.step(x, r.queue_max + r.queue_max[-1:], where="post", label="max", color="tab:red")
    ax.step(x, r.queue_mean + r.queue_mean[-1:], where="post", label="mean", color="tab:blue")
    ax.set_ylabel("jobs waiting")
    ax.set_ylim(bottom=0)
    _time_axis(ax, r, len(r.queue_max) + 1)
    ax.set_title("Queue length over time")
    ax.legend(loc="upper right")
    out = _png(fig)
    plt.close(fig)
    return out


def wait_chart(plt, r: Report) -> str:
    waits = sorted(r.total.waits)
    fig, ax = plt.subplots(figsize=(11, 3))
    if waits:
        ax.hist(waits, bins=min(50, max(5, len(waits) // 10)), color="tab:green")
        summary = wait_summary(waits)
        for key, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
            ax.axvline(summary[key], color="black", linestyle=style, label=f"{key} {format_duration(summary[key])}")
        ax.legend(loc="upper right")
    ax.set_xlabel("seconds from queued to first start")
    ax.set_ylabel("jobs")
    ax.set_title(f"Wait distribution ({len(waits)} jobs started in the window)")
    out = _png(fig)
    plt.close(fig)
    return out


def _table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def write_html(r: Report, path: Path) -> None:
    plt = _pyplot()
    when = (
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(r.since))} → "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(r.until))}"
    )
    summary = _table(*summary_table(r))
    gpus = _table(
        ["GPU", "mean util", "held h", "held idle h"],
        [
            [
                k,
                "-" if g["mean_util_pct"] is None else f"{g['mean_util_pct']:.0f}%",
                hours(g["held_hours"]),
                hours(g["idle_held_hours"]),
            ]
            for k, g in r.gpus.items()
        ],
    )
    charts = [
        utilization_chart(plt, r) if r.gpus else "<p>No GPU samples in this window.</p>",
        queue_chart(plt, r),
        wait_chart(plt, r),
    ]
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>gpuq report {html.escape(when)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
img {{ display: block; margin: 1em 0; max-width: 100%; }}
</style></head><body>
<h1>gpuq report</h1>
<p>{html.escape(when)}{" · by " + html.escape(r.by) if r.by else ""} · pending now: {r.pending_now}
{"· longest waiting " + format_duration(r.longest_pending_s) if r.pending_now else ""}</p>
<h2>Use, waits and outcomes</h2>
{summary}
<h2>GPUs</h2>
{gpus}
{"".join(charts)}
</body></html>
"""
    # Where the person running it says, as them; never through a link planted there (a
    # root's report into a directory the team writes).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(page)
