"""Terminals are safe (security review M9): what a team member writes into a spec (command,
name, env values; a booking's note: the bookings extra's tests) reaches the terminals of
everyone who runs `gpuq status`, `show`, `top` or `logs`, root included. It must arrive as
visible escapes (`\\x1b`), never as the control characters themselves, which would clear the
screen or retitle the window."""

from __future__ import annotations

import json
import re

from team import ALICE, BOB, needs_root

from conftest import wait_until

# What a terminal acts on: C0 but the newline that ends each line of output, DEL, C1, bidi
# controls, line and paragraph separators.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

# YAML double quotes turn \e, \a and \u202E into the characters themselves.
EVIL_SPEC = r"""command: "sleep 30 # \e[2J\e]0;OWNED\a"
name: "n\e[31mx\u202Eexe"
gpus: 0
env: {LOOK: "v\e]0;TITLE\a\u202Efdp.exe\nFAKE=1"}
"""


def test_safe_text_escapes_what_a_terminal_acts_on_and_keeps_printable_text():
    from gpuq.model.text import safe_text

    assert safe_text("a\x1b[2J\x1b]0;T\x07b") == "a\\x1b[2J\\x1b]0;T\\x07b"
    assert safe_text("one\ntwo\rthree\tfour") == "one\\ntwo\\rthree\\tfour"
    assert safe_text("\x7f\x9b\x85") == "\\x7f\\x9b\\x85"  # DEL, 8-bit CSI, NEL
    assert (
        safe_text("cod\u202eexe.doc \u2066x\u2069 \u200f \u2028") == "cod\\u202eexe.doc \\u2066x\\u2069 \\u200f \\u2028"
    )
    assert safe_text("bad name \udcff") == "bad name \\udcff"  # a lone surrogate cannot even be printed
    assert safe_text("héllo 日本 – ok \\x1b") == "héllo 日本 – ok \\x1b"
    assert safe_text("a\nb\x1b", keep="\n") == "a\nb\\x1b"


def _clean(text: str, what: str) -> str:
    raw = RAW_CONTROL.search(text)
    assert raw is None, f"{what} printed {raw.group()!r} raw: {text!r}"
    return text


@needs_root
def test_status_show_top_and_logs_show_a_members_control_characters_escaped(team):
    team.start_worker("box", "1x80GiB")
    team.drop_as(BOB, "evil.yaml", EVIL_SPEC)
    wait_until(lambda: any(r["id"] == "evil" for r in team.status()["running"]), timeout=60, what="bob's job running")

    status = team.as_user(ALICE, "status", "-w")  # whole lines: the command's end is the escapes
    assert status.returncode == 0, status.stderr
    _clean(status.stdout, "status")
    assert "sleep 30 # \\x1b[2J\\x1b]0;OWNED\\x07" in status.stdout  # the command is there, escaped

    show = team.as_user(ALICE, "show", "evil", "--env")  # every variable, LOOK among them
    assert show.returncode == 0, show.stderr
    _clean(show.stdout, "show")
    assert "sleep 30 # \\x1b[2J\\x1b]0;OWNED\\x07" in show.stdout
    assert "LOOK=v\\x1b]0;TITLE\\x07\\u202efdp.exe\\nFAKE=1" in show.stdout

    top = team.as_user(ALICE, "top", "--iterations", "1")
    assert top.returncode == 0, top.stderr
    _clean(top.stdout, "top")
    assert "\\x1b[2J" in top.stdout

    as_json = json.loads(team.as_user(ALICE, "status", "--json").stdout)  # JSON escapes by itself
    assert [r["command"] for r in as_json["running"]] == ["sleep 30 # \x1b[2J\x1b]0;OWNED\x07"]

    # Root reads bob's log: bob's bytes (gpuq's "==> command:" header holds his command).
    wait_until(lambda: "OWNED" in team.log("evil"), what="the log's header")
    logs = team.gpuq("logs", "evil")
    _clean(logs.stdout, "logs")
    assert "\\x1b[2J\\x1b]0;OWNED\\x07" in logs.stdout
    # ... while bob gets his own job's output as it is, like `cat` (colours, progress bars).
    own = team.as_user(BOB, "logs", "evil")
    assert own.returncode == 0 and "\x1b[2J" in own.stdout
