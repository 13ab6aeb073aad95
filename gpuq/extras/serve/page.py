"""What the status page shows, built from the status view (`gpuq status --json`, views/status.py)
and nothing else: the hosts and their GPUs, the running and pending jobs, the recent ends, each
cell as the status screen words it (views/render.py's helpers). The view holds more than the
page needs (commands, limits, fair share, the extras' sections); only the fields named here
leave the process, so a member reaching the page learns nothing `gpuq status` does not print.
"""

from __future__ import annotations

from typing import Any

from gpuq.model.text import safe_tree
from gpuq.model.units import format_duration, format_mib
from gpuq.views.render import ask, start_by, where

PAGE_VERSION = 1
PENDING_ROWS = 50  # the page lists this many pending jobs, and says how many there are


def page_data(view: dict[str, Any]) -> dict[str, Any]:
    """The page's part of a status view. Every text passes through safe_tree first, as the
    status screen's does: a bidi override or a control character in a name shows as its
    escape instead of reordering what a reader sees."""
    view = safe_tree(view)
    return {
        "version": PAGE_VERSION,
        "now": view["now"],
        "hosts": [_host(h, view["running"]) for h in view["hosts"]],
        "running": [_running(r) for r in view["running"]],
        "pending": [_pending(p, view["now"]) for p in view["pending"][:PENDING_ROWS]],
        "pending_total": view["pending_total"],
        "finished": [_finished(f) for f in view["finished"]],
    }


def _host(h: dict[str, Any], running: list[dict[str, Any]]) -> dict[str, Any]:
    """A host's line as the screen's HOSTS says it (up, stopped, NOT RESPONDING, drained) and its GPUs."""
    state = "up" if h["alive"] else "stopped" if h.get("stopped") else "NOT RESPONDING"
    drain = h.get("drain")
    if isinstance(drain, dict):
        busy = sum(1 for r in running if r["host"] == h["host"])
        state += (f", DRAINING ({busy} running)" if busy else ", DRAINED") + f" by {drain.get('by')}"
        state += f": {drain['reason']}" if drain.get("reason") else ""
    return {
        "host": h["host"],
        "alive": bool(h["alive"]),
        "state": state,
        "seen": format_duration(h["last_seen_s"]),
        "gpus": [
            {
                "index": g["index"],
                "name": g["name"],
                "util_pct": g["util_pct"],
                "util": "-" if g["util_pct"] is None else f"{g['util_pct']}%",
                "mem_used_mib": g["mem_used_mib"],
                "mem_total_mib": g["mem_total_mib"],
                "mem": f"{format_mib(g['mem_used_mib'])}/{format_mib(g['mem_total_mib'])}",
                "jobs": " ".join(g["jobs"]) or "-",
            }
            for g in h["gpus"]
        ],
    }


def _running(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": r["id"],
        "user": r["user"],
        "name": r.get("name") or "",
        "where": f"slurm job {r['slurm_id']}" if r.get("slurm_id") else where(r["host"], r["gpus"]),
        "elapsed": format_duration(r["elapsed_s"]),
    }


def _pending(p: dict[str, Any], now: float) -> dict[str, Any]:
    return {
        "position": p["position"],
        "id": p["id"],
        "user": p["user"],
        "name": p.get("name") or "",
        "ask": ask(p["gpus"], p["gpu_mem_mib"]),
        "waiting": format_duration(p["waiting_s"]),
        "start_by": start_by(p.get("expected_start"), now, p.get("no_estimate")),
        "reason": p["reason"],
    }


def _finished(f: dict[str, Any]) -> dict[str, Any]:
    """A FINISHED row as the screen words it: the exit code or signal, where it ran, when it ended."""
    exit_text = "-" if f.get("exit_code") is None else str(f["exit_code"])
    if f.get("signal"):
        exit_text = f"sig{f['signal']}"
    return {
        "id": f["id"],
        "state": f["state"],
        "exit": exit_text,
        "duration": format_duration(f.get("duration_s")),
        "where": where(f.get("host"), f.get("gpus")) if f.get("gpus") else (f.get("host") or "-"),
        "ended_at": f.get("ended_at"),
        "note": f.get("reason") or "",
    }
