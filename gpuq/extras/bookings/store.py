"""Bookings: "who has the GPUs this afternoon". `gpuq book box-a:0,1 --from 14:00 --to 18:00
--for ana` sets GPUs aside for a person or an event. While a booking is on, plan places
nothing there but the owner's jobs and opportunistic work, and opportunistic jobs that were
already there when it began yield. Overlapping bookings are refused, naming the conflict.

One file per booking in state/bookings/<id>.json, created exclusively; a booking that lost
a race to an overlapping one (both checked before either was written) is removed again.
Bookings over for a week go as the next one is made (status shows only current ones)."""

from __future__ import annotations

import json
import pwd
import re
import time
from pathlib import Path
from typing import Sequence

from gpuq.extras.bookings.model import BOOKING_ID_RE, MAX_GPU_INDEX, Booking, BookingError
from gpuq.host.files import atomic_write, read_json
from gpuq.host.owners import Actor
from gpuq.model.jobs import SetAside
from gpuq.model.units import parse_duration_s
from gpuq.spool.layout import Layout

MEMBER_MAX_S = 31 * 86400  # longer bookings, or ones further ahead, are for admins
MEMBER_AHEAD_S = 365 * 86400
KEEP_S = 7 * 86400  # how long a booking's file stays after it ended


def directory(layout: Layout) -> Path:
    """state/bookings: made with the spool (spool/layout.py, hooks.py STATE_OF_EXTRAS)."""
    return layout.state / "bookings"


def _gpu_hours(layout: Layout, host: str, gpus: Sequence[int], start: float, end: float, now: float) -> float:
    """GPUs x hours of a booking still to come; all of a host's GPUs, where it names none, as
    many as its heartbeat shows (8 where none is known)."""
    count = len(gpus)
    if not count:
        beat = read_json(layout.heartbeat(host)) if layout.heartbeat(host).exists() else None
        count = len(beat.get("gpus", [])) if isinstance(beat, dict) and isinstance(beat.get("gpus"), list) else 8
    return count * max(0.0, end - max(start, now)) / 3600


def parse_when(text: str, now: float, after: float | None = None) -> float:
    """'14:00' (today; with `after`, the first such time after it), 'now',
    '2026-12-01 14:00', or for --to a duration ('4h') counted from `after`."""
    text = text.strip()
    if text == "now":
        return now
    if after is not None and re.fullmatch(r"\d+(\.\d+)?[smhd]", text):
        try:  # 99999999999999999999d: refused here, not as an OverflowError in every later status
            return after + parse_duration_s(text)
        except ValueError as e:
            raise BookingError(f"--to {e}") from None
    for fmt in ("%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M"):
        try:
            return time.mktime(time.strptime(text, fmt))
        except ValueError:
            pass
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", text)
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise BookingError(
            f"{text!r}: write a time like 14:00, 'now', '2026-12-01 14:00'"
            + (", or a length like 4h" if after is not None else "")
        )
    day = time.localtime(after if after is not None else now)
    t = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, int(m.group(1)), int(m.group(2)), 0, 0, 0, -1))
    if after is not None and t <= after:
        t += 86400  # --from 22:00 --to 02:00: the next morning
    return t


def parse_target(text: str) -> tuple[str, tuple[int, ...] | None]:
    """'box-a:0,1' / 'box-a:0-3' -> (host, GPUs); 'box-a' or 'box-a:all' -> (host, None: all)."""
    host, _, gpus = text.partition(":")
    if not host:
        raise BookingError(f"{text!r}: write HOST:GPUS, like box-a:0,1 or box-a:all")
    if gpus in ("", "all"):
        return host, None
    out: set[int] = set()
    for part in gpus.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise BookingError(f"{text!r}: GPUs are indices like 0,1 or 0-3")
        # Bounded before the range is built (0-999999999 filled memory) and before int() (which
        # refuses thousands of digits with its own error).
        first, last = (int(d) if len(d) < 5 else MAX_GPU_INDEX for d in (m.group(1), m.group(2) or m.group(1)))
        if last >= MAX_GPU_INDEX:
            raise BookingError(
                f"{part[:20]!r}: no box has that many GPUs (indices are below {MAX_GPU_INDEX}); "
                "write the box's GPUs, like box-a:0-7, or box-a for all of them"
            )
        if first > last:
            raise BookingError(f"{text!r}: the range {part} runs backwards; write it low-high, like 0-3")
        out.update(range(first, last + 1))
    return host, tuple(sorted(out))


def load(layout: Layout, now: float | None = None) -> list[Booking]:
    """Bookings not yet over (all of them with now=None), soonest first. A file that is not
    a booking gpuq wrote is skipped, so one bad file never stops planning or status."""
    found = []
    d = directory(layout)
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            b = Booking.from_json(read_json(path))
        except (ValueError, TypeError, KeyError, OSError):
            continue
        if b is not None and (now is None or b.end > now):
            found.append(b)
    return sorted(found, key=lambda b: (b.start, b.id))


def book(
    layout: Layout,
    host: str,
    gpus: tuple[int, ...],
    start: float,
    end: float,
    owner: str | None,
    note: str,
    now: float,
    actor: Actor,
    max_gpu_hours: float | None = None,
) -> Booking:
    """Applied by a worker for `actor`: a booking for someone else is an admin's. A member
    books at most `max_gpu_hours` (config max_booked_gpu_hours) of GPU time not over yet, all
    their bookings together: GPUs x hours, from now on."""
    owner = owner or actor.name
    if owner != actor.name and not actor.admin:
        raise BookingError(
            f"only root or an admin (config `admins`) may book GPUs for someone else "
            f"(--for {owner}); leave out --for to book for yourself"
        )
    try:
        pwd.getpwnam(owner)
    except KeyError:
        raise BookingError(f"--for {owner!r}: no such user here") from None
    Booking("bk-0", host, gpus, start, end, owner, note, actor.name).check()
    if end <= start:
        raise BookingError("--to must come after --from")
    if end <= now:
        raise BookingError("that slot is already over")
    if not actor.admin and (end - start > MEMBER_MAX_S or start - now > MEMBER_AHEAD_S):
        raise BookingError(
            f"a member books at most {MEMBER_MAX_S // 86400:.0f} days, starting within "
            f"{MEMBER_AHEAD_S // 86400:.0f} days; longer or later slots are an admin's"
        )
    d = directory(layout)
    prune(layout, now)
    existing = load(layout, now)  # read once: a booking costs O(bookings), not O(bookings²)
    _refuse_overlap(Booking("bk-0", host, gpus, start, end, owner, note, actor.name), existing)
    if not actor.admin and max_gpu_hours is not None:
        mine = [b for b in existing if b.owner == owner]
        booked = sum(_gpu_hours(layout, b.host, b.gpus, b.start, b.end, now) for b in mine)
        asked = _gpu_hours(layout, host, gpus, start, end, now)
        if booked + asked > max_gpu_hours:
            raise BookingError(
                f"{owner} would have {booked + asked:.0f} GPU-hours booked ahead, over config "
                f"max_booked_gpu_hours {max_gpu_hours:g} ({booked:.0f} booked already). Fix: book fewer GPUs "
                "or a shorter slot, `gpuq unbook` one, or ask an admin"
            )
    n = max((int(b.id[3:]) for b in load(layout)), default=0)
    while True:
        n += 1
        candidate = Booking(f"bk-{n}", host, gpus, start, end, owner, note, actor.name)
        try:  # written whole, then linked into place: no reader sees half of one, a crash leaves none
            atomic_write(d / f"{candidate.id}.json", json.dumps(candidate.to_json()).encode(), 0o644, exclusive=True)
        except FileExistsError:
            continue  # another worker's booking took the id a moment ago
        earlier = [b for b in load(layout, now) if b.id != candidate.id and b.overlaps(candidate) and int(b.id[3:]) < n]
        if earlier:  # written at the same moment as an overlapping one: the first stays
            (d / f"{candidate.id}.json").unlink()
            _refuse_overlap(candidate, earlier)
        return candidate


def prune(layout: Layout, now: float, keep_s: float = KEEP_S) -> None:
    """Bookings over for a week go: each `book` prunes, so the directory holds at most those
    made within a week of now, and those still to end."""
    for b in load(layout):
        if b.end < now - keep_s:
            (directory(layout) / f"{b.id}.json").unlink(missing_ok=True)


def set_aside(layout: Layout, now: float) -> list[SetAside]:
    """The placement rule (hooks.py PlacementRule): the bookings not over yet, as the values
    the plan honours."""
    return [SetAside(b.host, b.gpus, b.start, b.end, b.owner) for b in load(layout, now)]


def _refuse_overlap(candidate: Booking, existing: Sequence[Booking]) -> None:
    clash = next((b for b in existing if b.overlaps(candidate)), None)
    if clash:
        raise BookingError(
            f"overlaps booking {clash.describe()}; pick other GPUs or another time, or `gpuq unbook {clash.id}`"
        )


def unbook(layout: Layout, booking_id: str, actor: Actor) -> Booking:
    path = directory(layout) / f"{booking_id}.json"
    try:
        b = (
            Booking.from_json(read_json(path))
            if isinstance(booking_id, str) and BOOKING_ID_RE.match(booking_id)
            else None
        )
    except (ValueError, TypeError, KeyError):
        b = None
    if b is None:
        raise BookingError(f"no booking {str(booking_id)[:80]!r} (gpuq status lists them)")
    if not (actor.admin or actor.name in (b.owner, b.by)):
        raise BookingError(f"{booking_id} is {b.owner}'s, booked by {b.by}; only they, root or an admin may remove it")
    path.unlink(missing_ok=True)
    return b
