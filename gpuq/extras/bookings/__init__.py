"""Bookings, an extra: `gpuq book` sets GPUs aside for a person or an event over a time span,
`gpuq unbook` removes one (cli.py; the worker applies both as requests: requests.py), the
bookings are files under state/bookings (store.py, model.py), the plan honours them as values
(a placement rule: store.set_aside) and `gpuq status` shows them (view.py). README.md here is
its page. Without it, state/bookings is ignored (`doctor` says so when it holds any)."""

from __future__ import annotations

import argparse

from gpuq.hooks import PlacementRule, Registry, StatusSection, Verb


def _book_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("target", metavar="HOST:GPUS", help="box-a:0,1, box-a:0-3 or box-a (all its GPUs)")
    sp.add_argument("--from", dest="start", required=True, help="14:00, now, or '2026-12-01 14:00'")
    sp.add_argument("--to", dest="end", required=True, help="18:00, '2026-12-01 18:00', or a length: 4h")
    sp.add_argument("--for", dest="owner", metavar="NAME", help="whose jobs may run there (default: you)")
    sp.add_argument("--note", help="shown in status, e.g. 'demo for the board'")


def _unbook_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("id")


def register(registry: Registry) -> None:
    registry.verbs.append(
        Verb(
            "book",
            "set GPUs aside for a person or an event: only their jobs (and opportunistic ones) run there then",
            _book_arguments,
            "extras.bookings.cli:cmd_book",
        )
    )
    registry.verbs.append(Verb("unbook", "remove a booking", _unbook_arguments, "extras.bookings.cli:cmd_unbook"))
    registry.request_kinds["book"] = "extras.bookings.requests:apply_book"
    registry.request_kinds["unbook"] = "extras.bookings.requests:apply_unbook"
    registry.placement_rules.append(PlacementRule("bookings", "extras.bookings.store:set_aside"))
    registry.views.append(
        StatusSection("bookings", "BOOKINGS", "extras.bookings.view:read", "extras.bookings.view:render")
    )
