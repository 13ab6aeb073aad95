"""The SESSIONS section of `gpuq status` (hooks.py StatusSection): each `gpuq run` and `gpuq
shell` running now, where, for how long, and when a shell is released if left idle; under
"sessions" in `status --json`. Its jobs are in RUNNING too, as any job."""

from __future__ import annotations

from typing import Any

from gpuq.model.units import format_duration
from gpuq.spool.layout import Layout
from gpuq.spool.store import read_record


def read(layout: Layout, now: float, live_hosts: frozenset[str]) -> list[dict[str, Any]]:
    found = []
    for path in sorted(layout.running.glob("*.json")):
        try:
            record = read_record(path)
        except ValueError:
            continue
        attach = record.spec.get("attach") if record is not None else None
        if record is None or not isinstance(attach, dict):
            continue
        found.append(
            {
                "id": record.id,
                "user": record.user,
                "host": record.host,
                "gpus": record.gpus,
                "kind": "shell" if attach.get("idle_s") is not None else "run",
                "since": record.started_at or record.claimed_at,
                "for_s": now - (record.started_at or record.claimed_at or now),
                "idle_timeout_s": attach.get("idle_s"),
            }
        )
    return found


def render(sessions: Any) -> list[str]:
    """The section's lines from the view's part (safe text already: views/render.py)."""
    if not sessions or not isinstance(sessions, list):
        return []
    lines = ["", f"SESSIONS ({len(sessions)}: gpuq run and gpuq shell, attached to a terminal)"]
    for s in sessions:
        where = f"{s['host']}:{','.join(map(str, s['gpus'])) or 'cpu'}"
        idle = s.get("idle_timeout_s")
        release = f"  idle limit {format_duration(idle)}" if isinstance(idle, (int, float)) else ""
        running = format_duration(s["for_s"])
        lines.append(f"  {s['id']}  {s['user']}  {s['kind']}  {where}  for {running}{release}")
    return lines
