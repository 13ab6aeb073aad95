"""Serve, an extra: `gpuq serve`, a live read-only status page over HTTP (standard library
only): the hosts and their GPUs, the running and pending jobs with their reasons and the recent
ends, as `gpuq status` shows them to every member, refreshed in the browser without a reload.
server.py: the HTTP server and the view's cache; page.py: what of the status view is served;
assets.py: the page, its script and its Content-Security-Policy. README.md here is its page."""

from __future__ import annotations

import argparse

from gpuq.hooks import Registry, Verb

DEFAULT_PORT = 8080


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port; give one from 1 to 65535 (0: any free one)")
    return int(text)


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; 0: any free one)"
    )
    parser.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address to listen on (default 127.0.0.1, this box only: view it through ssh -L; "
        "0.0.0.0 lets anyone who can reach the port read it)",
    )


def register(registry: Registry) -> None:
    registry.verbs.append(
        Verb(
            "serve",
            "a live, read-only status page in a browser: hosts, GPUs, running, pending (with reasons), recent ends",
            _serve_arguments,
            "extras.serve.server:cmd_serve",
        )
    )
