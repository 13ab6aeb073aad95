"""`gpuq serve` end to end: the real CLI serving a queue that a real worker runs on fake GPUs,
read through urllib (the page, its JSON, the headers, 404 elsewhere, a hostile job name as
data) and through a real browser (Chromium, driven by Playwright): the page shows the jobs,
runs nothing a name says, and follows the queue without a reload."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import pytest

from conftest import PY, REPO, wait_until

pytestmark = pytest.mark.slow  # every test here starts processes

HOLD = "while [ ! -e {go} ]; do sleep 0.1; done"  # a job that runs until the test lets it end


class Served:
    """One `gpuq serve --port 0` of a queue: its URL (the line it prints), its process."""

    def __init__(self, queue, out: Path, *extra: str) -> None:
        self.out = out
        with open(out, "wb") as sink, open(out.with_suffix(".err"), "wb") as err:
            self.proc = subprocess.Popen(
                [*queue.cli_command(), "--root", str(queue.root), "serve", "--port", "0", *extra],
                stdout=sink,
                stderr=err,
                env=queue.env(),
            )
        found = wait_until(self._url, timeout=60, what="gpuq serve to print its URL")
        self.url = str(found)

    def _url(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"gpuq serve exited {self.proc.returncode}: {self.stderr()}")
        m = re.search(r"(http://\S+/) ", self.out.read_text())
        return m.group(1) if m else None

    def stderr(self) -> str:
        return self.out.with_suffix(".err").read_text(errors="replace")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path.lstrip("/"), headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def data(self) -> dict:
        code, _, body = self.get("/status.json")
        assert code == 200, body
        doc = json.loads(body)
        assert doc["error"] is None, doc["error"]
        return doc["data"]

    def stop(self) -> int:
        """Ctrl-C, as a member at the terminal would; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def serve(queue, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Starts `gpuq serve` on the test's queue (as often as asked); each one killed at the end
    if the test left it running (a failed assertion included)."""
    started: list[Served] = []

    def start(*extra: str) -> Served:
        started.append(Served(queue, tmp_path / f"serve-{len(started)}.out", *extra))
        return started[-1]

    try:
        yield start
    finally:
        for served in started:
            if served.proc.poll() is None:
                served.proc.kill()
                served.proc.wait()


def rows(data: dict, section: str) -> dict[str, dict]:
    return {r["id"]: r for r in data[section]}


FAKE_USE = f"{PY} {REPO / 'gpuq.py'} fake-use"
HOSTILE = "<img src=x onerror=alert(1)></script><script>alert(2)</script>"
CHROMIUM = "/usr/bin/chromium"  # Debian's package (tests/debian.py): Playwright downloads no browser
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _holding(go: Path, gpus: int, name: str = "", util: int = 40) -> str:
    """A spec whose job holds its whole GPUs (4GiB used on each, `util`% busy) until `go` exists."""
    named = f"name: '{name}'\n" if name else ""
    return f"command: {FAKE_USE} --mem 4GiB --util {util} -- sh -c '{HOLD.format(go=go)}'\ngpus: {gpus}\n{named}"


def _running_and_pending(queue, running: str, pending: str) -> dict:
    def seen() -> dict | None:
        view = queue.status()
        ok = running in {r["id"] for r in view["running"]} and pending in {p["id"] for p in view["pending"]}
        return view if ok else None

    return wait_until(seen, timeout=60, what=f"{running} running and {pending} pending")  # type: ignore[return-value]


def test_the_page_and_its_json_show_the_queue_as_status_does_and_nothing_else(queue, serve, tmp_path):
    queue.start_worker("a", "2x24GiB")
    go = tmp_path / "go"
    secret = "env:\n  SERVE_SECRET: hush-4711\n"
    queue.drop("big.yaml", _holding(go, 2, "big model") + secret)
    queue.drop("wait.yaml", "command: 'true'\ngpus: 1\n")
    view = _running_and_pending(queue, "big", "wait")
    served = serve()

    def gpus_busy() -> dict | None:
        data = served.data()
        return data if [g["util"] for h in data["hosts"] for g in h["gpus"]] == ["40%", "40%"] else None

    data = wait_until(gpus_busy, timeout=30, what="the GPUs' utilization on the page")
    assert isinstance(data, dict)
    [host] = data["hosts"]
    assert (host["host"], host["alive"], host["state"]) == ("a", True, "up")
    assert [(g["index"], g["mem"], g["jobs"]) for g in host["gpus"]] == [
        (0, "4GiB/24GiB", "big"),
        (1, "4GiB/24GiB", "big"),
    ]
    big = rows(data, "running")["big"]
    assert (big["name"], big["where"], big["user"]) == ("big model", "a:0,1", view["running"][0]["user"])
    wait = rows(data, "pending")["wait"]
    assert wait["reason"] == rows(view, "pending")["wait"]["reason"] and wait["reason"] != ""
    assert (wait["ask"], wait["name"], wait["position"]) == ("1 GPU", "wait", 1)
    _only_what_status_prints(served)
    _answers_two_paths_with_the_headers(served)

    go.touch()  # the job ends: its line moves to RECENT ENDS, and the waiting one starts
    ended = wait_until(lambda: rows(served.data(), "finished").get("big"), timeout=60, what="big in RECENT ENDS")
    assert isinstance(ended, dict) and (ended["state"], ended["exit"], ended["where"]) == ("done", "0", "a:0,1")

    port = served.url.rstrip("/").rsplit(":", 1)[1]
    taken = queue.gpuq("serve", "--port", port, check=False, timeout=60)
    assert taken.returncode == 2 and taken.stdout == "", taken.stdout + taken.stderr
    assert (
        taken.stderr
        == f"gpuq serve: port {port} on 127.0.0.1 is in use (another gpuq serve?). Fix: pick another with --port\n"
    )
    assert served.stop() == 0  # Ctrl-C: a clean exit
    assert "Traceback" not in served.stderr(), served.stderr()


def _only_what_status_prints(served: Served) -> None:
    """The JSON holds the page's fields only: no command, no environment, no root path."""
    _, _, body = served.get("/status.json")
    for never in ("hush-4711", "SERVE_SECRET", "fake-use", "command", str(served.out.parent)):
        assert never not in body.decode(), never
    data = served.data()
    assert set(data) == {"version", "now", "hosts", "running", "pending", "pending_total", "finished"}
    assert set(data["running"][0]) == {"id", "user", "name", "where", "elapsed"}


def _answers_two_paths_with_the_headers(served: Served) -> None:
    code, headers, page = served.get("/")
    assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    for part in ('id="hosts"', 'id="running"', 'id="pending"', 'id="finished"', 'id="updated"', 'id="problem"'):
        assert part.encode() in page
    for path in (
        "/",
        "/status.json",
        "/nothing",
        "/config.yaml",
        "/jobs/",
        "/state/",
        "/../config.yaml",
        "/favicon.ico",
    ):
        code, headers, body = served.get(path)
        assert code == (200 if path in ("/", "/status.json") else 404), (path, code)
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'", headers["Content-Security-Policy"])
        assert "unsafe-inline" not in headers["Content-Security-Policy"]
        assert (headers["X-Content-Type-Options"], headers["Cache-Control"]) == ("nosniff", "no-store")
    assert served.get("/status.json?x=1")[0] == 200
    assert served.get("/status.json", {"Host": "evil.example:8080"})[0] == 403  # DNS rebinding: refused
    assert served.get("/status.json", {"Host": "localhost:9000"})[0] == 200  # an ssh tunnel's other port
    posted = urllib.request.Request(served.url + "status.json", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(posted, timeout=30)
    assert refused.value.code == 501


def test_a_hostile_name_is_data_and_a_lan_bind_says_who_can_read(queue, serve, tmp_path):
    """The core takes a spec's `name` as free text (one line, 200 characters): markup in it
    travels as a JSON string, never into the page's HTML, which is the same for every queue."""
    queue.start_worker("a", "2x24GiB")
    go = tmp_path / "go"
    queue.drop("evil.yaml", _holding(go, 1, HOSTILE))
    queue.drop("evil-wait.yaml", f"command: 'true'\ngpus: 2\nname: '{HOSTILE}'\n")
    _running_and_pending(queue, "evil", "evil-wait")
    queue.gpuq("drain", "a", "--reason", HOSTILE)
    served = serve("--bind", "0.0.0.0")
    assert served.url.startswith("http://0.0.0.0:")
    assert "readable by anyone who can reach port" in served.stderr()
    served.url = served.url.replace("0.0.0.0", "127.0.0.1")
    data = served.data()
    assert rows(data, "running")["evil"]["name"] == HOSTILE == rows(data, "pending")["evil-wait"]["name"]
    assert data["hosts"][0]["state"] == f"up, DRAINING (1 running) by {data['running'][0]['user']}: {HOSTILE}"
    code, headers, body = served.get("/status.json", {"Host": "gpubox.lan:8080"})  # any name, bound on a LAN
    assert code == 200 and headers["Content-Type"] == "application/json; charset=utf-8"
    assert json.loads(body)["data"]["running"][0]["name"] == HOSTILE
    _, _, page = served.get("/")
    assert b"onerror" not in page and b"alert(" not in page and page.count(b"<script>") == 1
    go.touch()
    assert served.stop() == 0


def test_root_serves_a_team_root_as_the_queues_account_never_as_root(team, tmp_path):
    """Root's `gpuq serve` drops to the queue's account, as every verb but init and doctor
    does (cli/__init__.py), before it reads the spool or listens."""
    import psutil

    account = os.stat(team.root / "state").st_uid
    served = Served(team, tmp_path / "serve-team.out")
    try:
        assert account != 0 and set(psutil.Process(served.proc.pid).uids()) == {account}
        # No root helper beside it (root's other verbs keep one for give and place).
        wait_until(lambda: not psutil.Process(served.proc.pid).children(), what="the root helper to go")
        assert served.data()["hosts"] == [] and served.stop() == 0
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait()


def test_on_loopback_the_page_answers_the_team_and_no_other_account_of_the_box(team, tmp_path):
    """The spool is the team's alone (2750), yet any account on the box reached the loopback
    page: an attack read who runs what as a user outside the team's group. The page now
    answers those who may read the queue: a member, not eve."""
    from team import ALICE, EVE

    served = Served(team, tmp_path / "serve-team.out")
    fetch = (
        "import urllib.request, urllib.error\n"
        "try:\n"
        f"    r = urllib.request.urlopen({served.url + 'status.json'!r}, timeout=30); print(r.status, r.read()[:40])\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, e.read().decode())\n"
    )
    try:
        member, outsider = team.py_as(ALICE, fetch), team.py_as(EVE, fetch)
        assert member.returncode == 0 and member.stdout.startswith("200 "), (member.stdout, member.stderr)
        assert outsider.returncode == 0 and outsider.stdout.startswith("403 "), (outsider.stdout, outsider.stderr)
        assert "ask its owner to add you to its group" in outsider.stdout and "gqt-" not in outsider.stdout
        assert served.get("/status.json")[0] == 200  # root
    finally:
        assert served.stop() == 0


def test_the_asker_is_the_owner_of_the_socket_with_both_ends_and_no_closed_row_counts(tmp_path, monkeypatch):
    """A review: matched by ports alone, another account's closed connection (TIME_WAIT, listed
    as root) from 127.0.0.3 to 127.0.0.2 on the same ports made a member's request a 403. Both
    ends, addresses too, and no TIME_WAIT row."""
    from gpuq.extras.serve import server

    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    rows = [
        "0: 0300007F:A331 0200007F:49F3 06 00000000:00000000 03:00000000 00000000     0        0 0",  # eve's, closed
        "1: 0200007F:A331 0300007F:49F3 01 00000000:00000000 00:00000000 00000000  1003        0 7",  # eve's other end
        "2: 0100007F:A331 0100007F:49F3 01 00000000:00000000 00:00000000 00000000  1002        0 8",  # ben's
        "3: 0100007F:49F3 0100007F:A331 01 00000000:00000000 00:00000000 00000000   999        0 9",  # the server's
    ]
    table = tmp_path / "tcp"
    table.write_text(head + "".join(f"   {row}\n" for row in rows))
    monkeypatch.setattr(server, "PROC_TABLES", (str(table),))
    if server._proc_end("127.0.0.1", 1) != "0100007F:0001":
        pytest.skip("the rows above are written in a little-endian machine's order")
    assert server.loopback_peer_uid(("127.0.0.1", 0xA331), ("127.0.0.1", 0x49F3)) == 1002
    assert server.loopback_peer_uid(("127.0.0.3", 0xA331), ("127.0.0.2", 0x49F3)) is None  # closed: nobody's


@pytest.mark.long
def test_idle_connections_opened_on_purpose_do_not_starve_the_page(queue, serve):
    """Hundreds of connections that send half a request and wait: the server holds at most its
    cap of them, each only until its timeout, and answers a tab again soon after."""
    import psutil

    served = serve()
    host, port = served.url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    idle = []
    try:
        for _ in range(300):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n")  # and never the blank line
            idle.append(s)
        assert psutil.Process(served.proc.pid).num_threads() <= 64 + 8  # its cap, not one per connection
        wait_until(lambda: _answers(served), timeout=60, what="the page to answer again")
    finally:
        for s in idle:
            s.close()
    assert "Traceback" not in served.stderr()


def _answers(served: Served) -> bool:
    try:
        return served.get("/status.json")[0] == 200
    except OSError:  # refused, reset or timed out while the idle ones hold the slots
        return False


@pytest.mark.installs
def test_a_browser_shows_the_queue_live_and_a_hostile_name_as_text(queue, serve, tmp_path):
    import debian

    if (why := debian.install(("chromium",), ("chromium",))) is not None:  # as the cron and Slurm tests do
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    queue.start_worker("a", "2x24GiB")
    go, later = tmp_path / "go", tmp_path / "later-go"
    queue.drop("evil.yaml", _holding(go, 2, HOSTILE))
    wait_until(lambda: queue.record("evil"), timeout=60, what="evil to start")
    served = serve()
    dialogs: list[str] = []
    refused: list[str] = []  # the page's own script or style refused by its CSP would show here
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
            page.goto(served.url)
            page.wait_for_selector('#running tr[data-id="evil"]', timeout=60_000)
            page.evaluate("window.sameDocument = true")  # gone if the page reloads
            assert page.locator('#running tr[data-id="evil"] td').nth(2).text_content() == HOSTILE
            assert page.locator("img").count() == 0 and page.locator("script").count() == 1
            assert page.locator("#hosts .host").all_text_contents()[0].startswith("a  up (seen ")
            assert page.locator("#hosts tr.gpu").count() == 2
            assert [h.split(" ")[0] for h in page.locator("h2").all_text_contents()] == [
                "HOSTS",
                "RUNNING",
                "PENDING",
                "RECENT",
            ]
            assert page.locator("#updated").text_content() != "-"
            _screenshot_shows_the_page(page, tmp_path / "serve.png")  # the hostile name on it, as text
            # A job submitted after the page loaded waits, then starts once the first ends.
            queue.drop("later.yaml", _holding(later, 1, "later"))
            page.wait_for_selector('#pending tr[data-id="later"]', timeout=60_000)
            go.touch()
            page.wait_for_selector('#finished tr[data-id="evil"]', timeout=60_000)
            page.wait_for_selector('#running tr[data-id="later"]', timeout=60_000)
            assert page.evaluate("window.sameDocument === true")
            # The server gone: the page says so, and keeps what it showed.
            assert served.stop() == 0
            page.wait_for_selector("#problem.shown", timeout=30_000)
            assert "cannot reach gpuq serve" in (page.locator("#problem").text_content() or "")
            assert page.locator('#running tr[data-id="later"]').count() == 1
        finally:
            browser.close()
            later.touch()
    assert dialogs == [] and refused == [], (dialogs, refused)


def _screenshot_shows_the_page(page, shot: Path) -> None:
    from PIL import Image

    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5_000
    with Image.open(shot) as image:
        low, high = image.convert("L").getextrema()
        assert image.width >= 1000 and high - low > 100, (image.size, low, high)  # text on a background
