"""The BOOKINGS section of `gpuq status` (hooks.py StatusSection): the bookings not over yet,
under "bookings" in `status --json`, and their table on the screen."""

from __future__ import annotations

from typing import Any

from gpuq.extras.bookings.store import load
from gpuq.spool.layout import Layout
from gpuq.views.render import stamp, table


def read(layout: Layout, now: float, live_hosts: frozenset[str]) -> list[dict[str, Any]]:
    return [{**b.to_json(), "active": b.active(now)} for b in load(layout, now)]


def render(bookings: Any) -> list[str]:
    """The section's lines from the view's part (safe text already: views/render.py)."""
    if not bookings or not isinstance(bookings, list):
        return []
    return ["", "BOOKINGS (gpuq unbook ID removes one)"] + table(
        [["ID", "FOR", "GPUS", "WHEN", "NOTE"]]
        + [
            [
                b["id"],
                b["owner"],
                f"{b['host']}:{','.join(map(str, b['gpus']))}",
                ("NOW, until " if b["active"] else stamp(b["start"], "%a %H:%M") + "–")
                + stamp(b["end"], "%a %H:%M" if not b["active"] else "%H:%M"),
                b["note"] or "",
            ]
            for b in bookings
        ]
    )
