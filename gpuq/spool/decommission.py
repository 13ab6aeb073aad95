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
back to jobs/ then, once it has been silent lost_after_s (a box frozen that long starts
nothing when it wakes: its supervisors' lease has run out). One that cannot go back (a member's
file holds its name in jobs/) keeps the box listed and is named, so that forget can be run
again: nothing is left where no command reaches it."""

from __future__ import annotations

import os
from pathlib import Path

from gpuq.host.faults import wall_time
from gpuq.host.owners import Actor
from gpuq.spool.drain import DrainError, check_admin, drain_file
from gpuq.spool.intake import user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import (
    all_claims,
    has_record,
    pending_spec_path,
    read_record,
    running_records,
    torn_running_record,
    unclaim,
)
from gpuq.spool.teamstate import heartbeat_alive, load_heartbeats, poke_path


def forget(layout: Layout, host: str, actor: Actor, lost_after_s: float) -> str:
    check_admin(host, actor, "forget")
    beat = next((hb for hb in load_heartbeats(layout) if hb.get("host") == host), None)
    if beat is None:
        raise DrainError(f"no host named {host!r} has a heartbeat here (nothing to forget)")
    now = wall_time()
    if heartbeat_alive(beat, now):
        raise DrainError(f"{host}'s worker is alive; stop it (and take {host}'s cron line out) first")
    still = sorted(r.id for r in running_records(layout) if r.host == host)
    if still:
        raise DrainError(
            f"{host} still has {len(still)} job(s) recorded running ({', '.join(still[:5])}); "
            "another box settles them once its heartbeat is lost_after_s old"
        )
    claims = [(job_id, name) for job_id, claimer, name in all_claims(layout) if claimer == host]
    silent = now - beat["_mtime"]
    if claims and not beat.get("stopped") and silent < lost_after_s:
        # A box that is only frozen may be between reading a claim and writing its record:
        # by lost_after_s its supervisors refuse to start anything (run/supervise.py, fence).
        raise DrainError(
            f"{host} had claimed {len(claims)} job(s) when it went silent {silent:.0f} s ago "
            f"({', '.join(sorted(j for j, _ in claims)[:5])}); they go back to the queue once it has been silent "
            f"lost_after_s ({lost_after_s:g} s): run `gpuq forget {host}` again then"
        )
    back, kept = _put_back_claims(layout, claims)
    if kept:  # listed still, so that a second forget can finish
        raise DrainError(
            f"{host} is not forgotten yet: {'; '.join(kept[:5])}; then `gpuq forget {host}` again"
            + (f" ({len(back)} other job(s) are back in the queue: {', '.join(back[:5])})" if back else "")
        )
    for path in (
        layout.heartbeat(host),
        layout.spec_cache(host),
        layout.usage_cache(host),
        poke_path(layout, host),
        drain_file(layout, host),
    ):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    _remove_stop_orders(layout, host)
    said = f"{host}: forgotten (its past stays in the events and reports)"
    if back:
        said += f"; {len(back)} job(s) it had claimed but never started are back in the queue ({', '.join(back[:5])})"
    return said


def _remove_stop_orders(layout: Layout, host: str) -> None:
    """state/control/HOST/: stop orders nobody will read (no job of the host runs any more).
    Workers alone write there (not a member's directory): its entries are removed by name."""
    directory = layout.host_control(host)
    try:
        with os.scandir(directory) as it:
            names = [entry.name for entry in it]
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        try:
            os.unlink(directory / name)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            pass  # gone meanwhile, or not a file: the directory stays, as before
    try:
        os.rmdir(directory)
    except OSError:
        pass


def _put_back_claims(layout: Layout, claims: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Each claim of the forgotten host that no record names (or only a torn running record)
    back to jobs/; a claim it took to take over another dead box's job, and died holding, is
    let go (the running record holds the spec: the next box to take the job over makes its
    own claim from it). Returns the ids put back, and what could not be done and why: a
    user's file in jobs/ under the job's name is never replaced."""
    back: list[str] = []
    kept: list[str] = []
    for job_id, name in claims:
        path = layout.claims / name
        try:
            if read_record(layout.record(layout.finished, job_id)) is not None:
                # The job ended: its own attempt's claim (its supervisor recorded the end, then
                # the box died), or one this box took to take the job over, is nobody's now.
                os.unlink(path)
                continue
            if torn_running_record(layout, job_id):
                layout.record(layout.running, job_id).unlink(missing_ok=True)
            record = read_record(layout.record(layout.running, job_id))
            if record is not None and record.claim != name:
                os.unlink(path)  # a takeover it never finished: the record names the claim it took over
            elif not has_record(layout, job_id):
                taken = pending_spec_path(layout, job_id)
                if taken is None and unclaim(path, layout.jobs / f"{job_id}.yaml"):
                    back.append(job_id)
                else:
                    kept.append(f"{job_id} cannot go back: {_whose(taken or layout.jobs / f'{job_id}.yaml')}")
        except FileNotFoundError:
            continue  # settled meanwhile (its own worker is back)
        except (OSError, ValueError) as e:
            kept.append(f"{job_id}: state/claims/{name}: {getattr(e, 'strerror', None) or e}")
    return back, kept


def _whose(spec: Path) -> str:
    try:
        owner = user_name(os.lstat(spec).st_uid)
    except OSError:
        return f"jobs/{spec.name} was taken for a moment"
    return f"jobs/{spec.name} is taken by a file of {owner}'s: ask them to remove it"
