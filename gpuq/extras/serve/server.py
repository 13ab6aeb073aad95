"""`gpuq serve`: the status page over HTTP, read-only, standard library only.

Two paths answer: `/` (the page: assets.py) and `/status.json` (page.py's part of the status
view, which the page polls); everything else is 404, so no file under the root is ever served.
The view is the one `gpuq status --json` builds, computed at most once per CACHE_S however many
tabs poll (status of a large queue takes a noticeable part of a second). A view that cannot be
built (the shared disk gone, a config mid-edit) keeps the last one served, with the error, so
the page says so and still shows what it had.

Run by root it has already become the queue's account (cli/__init__.py drops every verb but
init and doctor), as every other reader of the spool does.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import os
import pwd
import signal
import socket
import struct
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from gpuq.cli.common import open_layout, read_config
from gpuq.extras.serve.assets import CSP, HTML
from gpuq.extras.serve.page import PENDING_ROWS, page_data
from gpuq.host import rootorders
from gpuq.model.text import safe_text
from gpuq.spool.layout import Layout
from gpuq.views.status import status

CACHE_S = 1.5
REQUEST_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
ERROR_SHOWN_CHARS = 200
# A loopback server answers only requests addressed to a loopback name: a web page elsewhere
# that points its own name at 127.0.0.1 (DNS rebinding) must not read the queue through a
# member's browser. Any port: an ssh tunnel may forward another local port.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
FOR_THE_TEAM = b"this page is for those who may read the queue (gpuq status): ask its owner to add you to its group\n"


class Snapshot:
    """The served document, rebuilt from the spool at most once per `max_age_s`: one thread
    rebuilds while the others wait for it (a lock), so ten tabs cost one status view."""

    def __init__(self, build: Callable[[], dict[str, Any]], max_age_s: float = CACHE_S) -> None:
        self._build = build
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._built_at = -float("inf")  # monotonic
        self._data: dict[str, Any] | None = None
        self._error: str | None = None
        self._body = b""

    def body(self) -> bytes:
        with self._lock:
            if time.monotonic() - self._built_at >= self._max_age_s:
                self._refresh()
            return self._body

    def _refresh(self) -> None:
        try:
            self._data, self._error = self._build(), None
        except Exception as e:  # noqa: BLE001 - any failure to read the queue is told on the page, not fatal
            # Its kind and the OS's words, never the path (the page may be read off this box).
            said = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self._error = safe_text(f"{type(e).__name__}: {said}")[:ERROR_SHOWN_CHARS]
        self._built_at = time.monotonic()
        self._body = json.dumps({"error": self._error, "data": self._data}, separators=(",", ":")).encode()


def view_builder(layout: Layout) -> Callable[[], dict[str, Any]]:
    """What `gpuq status --json` computes, as the page shows it (the config read anew each
    time: an admin's change shows without a restart)."""
    return lambda: page_data(status(layout, read_config(layout), pending_rows=PENDING_ROWS))


def loopback_peer_uid(client: tuple, server: tuple) -> int | None:
    """The account whose socket connects from `client` to `server`, both on this box's loopback
    (Linux's /proc/net/tcp and tcp6, where each socket's owner is listed): the row whose local
    end is `client` and whose remote end is `server`, addresses and ports, in any state but
    TIME_WAIT (a closed socket's row, owned by nobody: listed as root). None when no one owner
    matches: who asks cannot be told. (A review matched ports alone: another account's closed
    connection on the same ports from another loopback address made a member's request 403.)"""
    want = (_proc_end(client[0], client[1]), _proc_end(server[0], server[1]))
    if None in want:
        return None
    owners = set()
    for table in PROC_TABLES:
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()  # sl, local address:port, remote address:port, st, queues, timers, retransmits, uid
            if len(cols) > 7 and (cols[1], cols[2]) == want and cols[3] != TIME_WAIT:
                owners.add(int(cols[7]))
    return owners.pop() if len(owners) == 1 else None


PROC_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")  # each TCP socket of this network namespace, and its owner
TIME_WAIT = "06"  # /proc/net/tcp's state of a closed connection's row


def _proc_end(address: str, port: int) -> str | None:
    """An address and port as /proc/net/tcp{,6} print them: the address's 32-bit words each in
    this machine's byte order, in hex; then the port. None for what is no IP address."""
    try:
        if ":" in address:
            words = struct.unpack("=4I", socket.inet_pton(socket.AF_INET6, address.split("%", 1)[0]))
        else:
            words = struct.unpack("=I", socket.inet_pton(socket.AF_INET, address))
    except (OSError, ValueError):
        return None
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def may_read_queue(uid: int, layout: Layout) -> bool:
    """Whether `uid` could read the queue itself (`gpuq status`): root, this process's account,
    the root's owner, or anyone in the root's group where the group may read it (`gpuq init
    --group`), or anyone where all may."""
    st = os.stat(layout.root)
    if uid in (0, os.geteuid(), st.st_uid) or st.st_mode & 0o005 == 0o005:
        return True
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False
    return st.st_mode & 0o050 == 0o050 and st.st_gid in os.getgrouplist(pw.pw_name, pw.pw_gid)


def make_handler(snapshot: Snapshot, loopback_only: bool, layout: Layout) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuq-serve"
        sys_version = ""
        timeout = REQUEST_TIMEOUT_S  # a client that sends nothing (or too slowly) is dropped

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if loopback_only and not _addressed_to_loopback(self.headers.get("Host", "")):
                self._send(HTTPStatus.FORBIDDEN, b"not a loopback address\n", "text/plain; charset=utf-8")
                return
            # Loopback reaches every account on this box, not only the team (an attack read the
            # queue as a user outside its group): the page answers those who may read the queue.
            if loopback_only and not self._team_asks():
                self._send(HTTPStatus.FORBIDDEN, FOR_THE_TEAM, "text/plain; charset=utf-8")
                return
            path = self.path.split("?", 1)[0]
            if path == "/":
                self._send(HTTPStatus.OK, HTML, "text/html; charset=utf-8")
            elif path == "/status.json":
                self._send(HTTPStatus.OK, snapshot.body(), "application/json; charset=utf-8")
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")

        def _team_asks(self) -> bool:
            bound = self.server.server_address  # (host, port): this server is TCP
            uid = loopback_peer_uid(self.client_address, bound) if isinstance(bound, tuple) else None
            return uid is not None and may_read_queue(uid, layout)

        def _send(self, code: HTTPStatus, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Frame-Options", "DENY")
            self.send_header("Referrer-Policy", "no-referrer")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a tab polls every few seconds: a line each would bury anything worth reading

    return Handler


def _addressed_to_loopback(host_header: str) -> bool:
    name = host_header.strip().lower()
    name = name.rsplit(":", 1)[0] if not name.endswith("]") else name  # less its port ([::1]:8080 too)
    return name in LOOPBACK_NAMES


def _is_loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:  # a host name: its address could be any
        return False


class _Server(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS at once, each for at most REQUEST_TIMEOUT_S between bytes: idle
    connections opened on purpose cannot use up the process's threads and descriptors, and one
    over the cap is closed at once. A client that goes away mid-answer is no error worth a
    traceback on stderr."""

    daemon_threads = True  # a tab left open must not keep Ctrl-C from ending the process

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a reset, a timeout, a broken pipe: the client's to mind


class _Server6(_Server):
    address_family = socket.AF_INET6


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        return _serve(args)
    except KeyboardInterrupt:  # Ctrl-C before the server was up (the first view): a clean stop too
        return 0


def _serve(args: argparse.Namespace) -> int:
    # Root's gpuq on a team root acts as the queue's account with a root part beside it for
    # give and place: a read-only page needs neither, so its root part ends now.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # it exits now: reaped by the kernel, no zombie
    rootorders.disconnect()
    layout = open_layout(args)  # a wrong root is said now, before anything listens
    loopback = _is_loopback(args.bind)
    snapshot = Snapshot(view_builder(layout))
    snapshot.body()  # the first view now: its cost is paid before the first tab waits for it
    server_class = _Server6 if ":" in args.bind else _Server
    try:
        server = server_class((args.bind, args.port), make_handler(snapshot, loopback, layout))
    except OSError as e:
        if e.errno == errno.EADDRNOTAVAIL:
            print(
                f"gpuq serve: {args.bind} is no address of this box. Fix: give one of its own with --bind "
                "(0.0.0.0: all of them), or leave --bind out (127.0.0.1)",
                file=sys.stderr,
            )
            return 2
        why = "is in use (another gpuq serve?)" if e.errno == errno.EADDRINUSE else f"cannot be bound: {e.strerror}"
        print(f"gpuq serve: port {args.port} on {args.bind} {why}. Fix: pick another with --port", file=sys.stderr)
        return 2
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    if not loopback:
        print(
            f"gpuq serve: note: bound to {args.bind}: the page (hosts, jobs, users) is readable by anyone who can "
            f"reach port {port} on this box",
            file=sys.stderr,
        )
        if host in ("0.0.0.0", "::"):  # the URL below works here only: teammates use the box's name
            print(f"gpuq serve: from other boxes: http://{socket.gethostname()}:{port}/", file=sys.stderr)
    print(f"gpuq serve: http://{shown}:{port}/ (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
