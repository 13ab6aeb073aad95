"""`gpuq forget HOST`: a box taken out of the team for good stops being listed. Its
heartbeat, spec cache, poke file and drain order go; its events stay (reports count its past).
Admins' only (as drain), applied by a worker from a request, and refused while the box's
worker is alive or a job is still recorded running there (another box settles those as lost
once the heartbeat has stood still `lost_after_s`: forgetting first would hide that)."""

from __future__ import annotations

import os

from gpuq.host.faults import wall_time
from gpuq.host.owners import Actor
from gpuq.spool.drain import DrainError, check_admin, drain_file
from gpuq.spool.layout import Layout
from gpuq.spool.store import running_records
from gpuq.spool.teamstate import heartbeat_alive, load_heartbeats, poke_path


def forget(layout: Layout, host: str, actor: Actor) -> str:
    check_admin(host, actor, "forget")
    beat = next((hb for hb in load_heartbeats(layout) if hb.get("host") == host), None)
    if beat is None:
        raise DrainError(f"no host named {host!r} has a heartbeat here (nothing to forget)")
    if heartbeat_alive(beat, wall_time()):
        raise DrainError(f"{host}'s worker is alive; stop it (and take {host}'s cron line out) first")
    still = sorted(r.id for r in running_records(layout) if r.host == host)
    if still:
        raise DrainError(
            f"{host} still has {len(still)} job(s) recorded running ({', '.join(still[:5])}); "
            "another box settles them once its heartbeat is lost_after_s old"
        )
    for path in (layout.heartbeat(host), layout.spec_cache(host), poke_path(layout, host), drain_file(layout, host)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return f"{host}: forgotten (its past stays in the events and reports)"
