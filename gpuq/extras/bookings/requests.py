"""The worker's side of `gpuq book` and `gpuq unbook`: the inbox's request kinds "book" and
"unbook" (hooks.py `request_kinds`), applied for the request file's owner as the core's verbs
are (spool/applying.py)."""

from __future__ import annotations

from typing import Any

from gpuq.extras.bookings import store
from gpuq.extras.bookings.model import BookingError
from gpuq.host.faults import wall_time
from gpuq.host.owners import Actor
from gpuq.model.config import Config
from gpuq.spool.applying import Outcome, text_arg
from gpuq.spool.inbox import Request, RequestError
from gpuq.spool.layout import Layout


def apply_book(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    a = r.args
    gpus = a.get("gpus")
    if not isinstance(gpus, list) or not isinstance(a.get("host"), str):
        raise RequestError("gpuq book: HOST:GPUS, --from and --to")
    try:
        b = store.book(
            layout,
            a["host"],
            tuple(gpus),
            _number(a.get("start")),
            _number(a.get("end")),
            text_arg(a.get("owner"), 64) or None,
            text_arg(a.get("note"), 200),
            wall_time(),
            actor,
            config.max_booked_gpu_hours,
        )
    except BookingError as e:
        raise RequestError(str(e)) from None
    return [(True, f"{b.id}: booked ({b.what()})" + (f" · {b.note}" if b.note else ""))]


def apply_unbook(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    booking_id = r.args.get("id")
    if not isinstance(booking_id, str):
        raise RequestError("gpuq unbook: a booking id")
    try:
        b = store.unbook(layout, booking_id, actor)
    except BookingError as e:
        raise RequestError(str(e)) from None
    return [(True, f"{b.id}: removed ({b.what()})")]


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError("a time must be a number")
    return float(value)
