"""The reports extra's verbs: `gpuq report` (what happened, over the events and samples:
report.py has the figures, reportview.py the text, reporthtml.py the page) and `gpuq eff` (how
well jobs used what they held, with hints why one may be slow: efficiency.py has the figures
and the rules)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import pwd
import sys
import time
from pathlib import Path

from gpuq.cli.common import open_layout, refuse_bad_id
from gpuq.extras.reports.efficiency import detail_text, efficiency, job_samples, table_text
from gpuq.extras.reports.reporthtml import ReportHtmlError, write_html
from gpuq.extras.reports.reportview import DEFAULT_SINCE, gather, parse_since, report_text
from gpuq.extras.reports.samples import read_samples
from gpuq.model.names import JOB_ID_RE
from gpuq.model.record import Record
from gpuq.model.states import State
from gpuq.spool.layout import Layout
from gpuq.spool.store import read_record
from gpuq.spool.sweeps import read_group


def cmd_report(args: argparse.Namespace) -> int:
    layout = open_layout(args)
    now = time.time()
    try:
        since = parse_since(args.since or DEFAULT_SINCE, now)
    except ValueError as e:
        print(f"gpuq report: {e}", file=sys.stderr)
        return 2
    # Asked for nothing, a young queue's report covers its life, not a week of empty slices.
    report = gather(layout, since, now, args.by, from_history_start=args.since is None)
    if args.html:
        try:
            write_html(report, Path(args.html))
        except ReportHtmlError as e:
            print(f"gpuq report: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            link = " (a symbolic link, never written through: name the file itself)" if e.errno == errno.ELOOP else ""
            print(f"gpuq report: cannot write {args.html}: {e.strerror}{link}", file=sys.stderr)
            return 2
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    elif not args.html:
        print(report_text(report))
    return 0


def cmd_eff(args: argparse.Namespace) -> int:
    layout = open_layout(args)
    now = time.time()
    if any(refuse_bad_id("eff", job_id) for job_id in args.ids):
        return 1
    if args.ids:
        records, missing = _named(layout, args.ids)
        if missing is not None:
            print(f"gpuq eff: {missing}", file=sys.stderr)
            return 1
    else:
        try:
            since = parse_since(args.since, now)
        except ValueError as bad:
            print(f"gpuq eff: {bad}", file=sys.stderr)
            return 2
        user = args.user or pwd.getpwuid(os.getuid()).pw_name
        records = _users(layout, user, since)
    started = [r.started_at for r in records if r.started_at is not None]
    by_job = job_samples(read_samples(layout, min(started)) if started else iter(()), records, now)
    effs = [efficiency(r, by_job.get(r.id, []), now, _spans(layout, by_job, now)) for r in records]
    if args.json:
        print(json.dumps([e.to_json() for e in effs], indent=1))
    elif not effs:
        print("no jobs" if args.ids else f"no job of {user} ran in the last {args.since}")
    elif len(effs) == 1 and args.ids:
        print(detail_text(effs[0]))
    else:
        print(table_text(effs))
        for e in effs:
            for h in e.hints:
                print(f"  {e.id}: {h.kind}: {h.text}")
        print("`gpuq eff ID` for one job's figures; the rules: README, 'Why is my job slow?'")
    return 0


def _spans(layout: Layout, by_job: dict[str, list[dict]], now: float) -> dict[str, tuple[float, float]]:
    """When each job seen beside the ones asked about ran, from its record (start, end)."""
    seen = {j for samples in by_job.values() for g in samples for j in g.get("jobs", ()) if isinstance(j, str)}
    spans = {}
    for job_id in seen:
        record = _record(layout, job_id) if JOB_ID_RE.fullmatch(job_id) else None
        if record is not None and record.started_at is not None:
            spans[job_id] = (record.started_at, record.ended_at if record.ended_at is not None else now)
    return spans


def _record(layout: Layout, job_id: str) -> Record | None:
    for d in (layout.finished, layout.running):
        try:
            record = read_record(layout.record(d, job_id))
        except (OSError, ValueError):
            continue
        if record is not None:
            return _begun(record)
    return None


def _begun(record: Record) -> Record:
    """A running attempt's record has no started_at (its supervisor writes it at the end):
    it runs since it was claimed, as `gpuq status` counts it."""
    if record.state is State.RUNNING and record.started_at is None:
        return dataclasses.replace(record, started_at=record.claimed_at)
    return record


def _named(layout: Layout, ids: list[str]) -> tuple[list[Record], str | None]:
    """The records of the jobs named, a group (sweep, array) standing for its members; or
    what is wrong with a name."""
    records: list[Record] = []
    for job_id in ids:
        record = _record(layout, job_id)
        if record is not None:
            records.append(record)
            continue
        group = read_group(layout, job_id)
        if group is None:
            return [], f"no job or group {job_id!r} has run (pending jobs have no figures yet: `gpuq show {job_id}`)"
        records.extend(r for m in group["members"] if (r := _record(layout, m)) is not None)
    return records, None


def _users(layout: Layout, user: str, since: float) -> list[Record]:
    """`user`'s attempts that ran in the window: running now, or ended since `since` (a
    record's file is written when it ends: older files are not opened)."""
    found = []
    for d in (layout.finished, layout.running):
        with os.scandir(d) as it:
            for entry in it:
                if not entry.name.endswith(".json"):
                    continue
                try:
                    if d == layout.finished and entry.stat(follow_symlinks=False).st_mtime < since:
                        continue
                    record = read_record(Path(entry.path))
                    record = _begun(record) if record is not None else None
                except (OSError, ValueError):
                    continue  # a torn or foreign file: not a job of anyone's
                if record is not None and record.user == user and record.started_at is not None:
                    found.append(record)
    return sorted(found, key=lambda r: r.started_at or 0.0)
