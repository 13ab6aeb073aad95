"""A real HTTP receiver on the loopback address for the notify extra's tests: a thread with
http.server that records each POST's JSON body, or hangs (never answers) when told to."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, hang: bool = False) -> None:
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.hang = hang
        self.release = threading.Event()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if received.hang:
                    received.release.wait(120)
                    return
                received.paths.append(self.path)
                received.bodies.append(json.loads(data))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/SECRET-KEY"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of(self, job_id: str) -> list[dict]:
        return [b for b in self.bodies if b.get("job", {}).get("id") == job_id]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def refused_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/hooks/SECRET-KEY"
