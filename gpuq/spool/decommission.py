"""`gpuq forget HOST`: a box taken out of the team for good stops being listed. Its
heartbeat, spec cache, poke file and drain order go; its events stay (reports count its past).
Admins' only (as drain), applied by a worker from a request, and refused while the box's
worker is alive or a job is still recorded running there (another box settles those as lost
once the heartbeat has stood still `lost_after_s`: forgetting first would hide that).

A box that died between a claim and its record left a spec in claims/ that no record names,
and a power cut may have left a start's record torn (a job that never started: spool/store.py,
torn_running_record). Its own worker puts such claims back when it starts again
(worker/recovery.py), and nobody else may while it might (a box that was only paused would
go on to start them). Forgetting the box is the admin's word that it will not: its claims go
back to jobs/ then."""

from __future__ import annotations

import os

from gpuq.host.faults import wall_time
from gpuq.host.owners import Actor
from gpuq.model.record import parse_claim_name
from gpuq.spool.drain import DrainError, check_admin, drain_file
from gpuq.spool.layout import Layout
from gpuq.spool.store import has_record, running_records, torn_running_record, unclaim
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
    back, kept = _put_back_claims(layout, host)
    for path in (layout.heartbeat(host), layout.spec_cache(host), poke_path(layout, host), drain_file(layout, host)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    said = f"{host}: forgotten (its past stays in the events and reports)"
    if back:
        said += f"; {len(back)} job(s) it had claimed but never started are back in the queue ({', '.join(back[:5])})"
    if kept:
        said += (
            f"; {len(kept)} claimed spec(s) left in state/claims/ ({', '.join(kept[:5])}): "
            "a new spec of the same name is in jobs/"
        )
    return said


def _put_back_claims(layout: Layout, host: str) -> tuple[list[str], list[str]]:
    """The host's claims that no record names, or only a torn running record, back to jobs/
    (never over a user's new spec of the same name: those stay, and are named). A claim
    beside a record is its attempt's and is settled with it."""
    back: list[str] = []
    kept: list[str] = []
    for entry in sorted(os.scandir(layout.claims), key=lambda e: e.name):
        parsed = parse_claim_name(entry.name)
        if parsed is None or parsed[1] != host:
            continue
        job_id = parsed[0]
        if torn_running_record(layout, job_id) and not layout.record(layout.finished, job_id).exists():
            layout.record(layout.running, job_id).unlink(missing_ok=True)
        if not has_record(layout, job_id):
            (back if unclaim(layout.claims / entry.name, layout.jobs / f"{job_id}.yaml") else kept).append(job_id)
    return back, kept
