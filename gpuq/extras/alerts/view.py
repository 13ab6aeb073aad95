"""The ALERTS section of `gpuq status` (hooks.py StatusSection): the alerts the live workers
keep (watch.py), each once however many hosts raise it, oldest first, under "alerts" in
`status --json`."""

from __future__ import annotations

from typing import Any

from gpuq.extras.alerts import alerts_file
from gpuq.host.files import read_json
from gpuq.spool.layout import Layout
from gpuq.views.render import stamp


def read(layout: Layout, now: float, live_hosts: frozenset[str]) -> list[dict[str, Any]]:
    """Only a live worker's alerts (the view judged which are): a stopped or dead one's stand for
    nothing any more."""
    found: dict[str, dict[str, Any]] = {}
    for host in sorted(live_hosts):
        try:
            kept = read_json(alerts_file(layout, host))
        except (OSError, ValueError):
            continue
        for a in kept.get("alerts", []) if isinstance(kept, dict) and isinstance(kept.get("alerts"), list) else []:
            if _is_alert(a):
                found.setdefault(f"{a['kind']}:{a['subject']}", a)
    return sorted(found.values(), key=lambda a: a["since"])


def _is_alert(a: Any) -> bool:
    return (
        isinstance(a, dict)
        and all(isinstance(a.get(k), str) for k in ("kind", "subject", "host", "message"))
        and isinstance(a.get("since"), (int, float))
        and not isinstance(a.get("since"), bool)
    )


def render(alerts: Any) -> list[str]:
    """The section's lines from the view's part (safe text already: views/render.py)."""
    if not alerts or not isinstance(alerts, list):
        return []
    return ["", f"ALERTS ({len(alerts)})"] + [
        f"  {a['kind']:<16} {a['message']}  (since {stamp(a['since'], '%H:%M')}, seen by {a['host']})" for a in alerts
    ]
