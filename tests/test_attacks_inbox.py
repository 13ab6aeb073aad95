"""A second round of attacks by a member (bob) on the request inbox and the queue of a root
worker, found by a review of the new trust boundary: one request must never stop the others,
a file bob drops under alice's job id is never her job, a put-back never loses or re-labels a
spec, and floods never stall the worker's heartbeat."""

from __future__ import annotations

import json
import os
import stat

from team import ALICE, BOB, needs_root

from conftest import wait_until

pytestmark = needs_root
SLEEPER = "command: sleep 60\ngpus: 0\nworkdir: /\n"


def _put_request(team, user: str, name: str, data: bytes | None, directory: bool = False, depth: int = 1) -> None:
    """A file (or a directory, `depth` levels deep, built aside and renamed in) in the inbox,
    made by `user` as an attacker would."""
    path = team.root / "requests" / name
    if directory:
        code = (
            f"import os\nstage = {str(path.parent / ('.stage-' + name))!r}\nos.mkdir(stage, 0o777)\n"
            f"d = stage\nfor _ in range({depth - 1}):\n    d = os.path.join(d, 'd')\n    os.mkdir(d)\n"
            f"os.rename(stage, {str(path)!r})\n"
        )
        if depth > 1:  # a path 2000 levels deep is longer than PATH_MAX: made a level at a time
            code = (
                f"import os\nstage = {str(path.parent / ('.stage-' + name))!r}\nos.mkdir(stage, 0o777)\n"
                "fd = os.open(stage, os.O_RDONLY)\n"
                f"for _ in range({depth - 1}):\n    os.mkdir('d', dir_fd=fd)\n"
                "    new = os.open('d', os.O_RDONLY, dir_fd=fd)\n    os.close(fd)\n    fd = new\n"
                f"os.rename(stage, {str(path)!r})\n"
            )
    else:  # the bytes come through a file: they may be too long for a command line
        payload = team.base / f"payload-{name}"
        payload.write_bytes(data or b"")
        os.chmod(payload, 0o644)
        code = (
            f"import os\nt = {str(path.parent / ('.x-' + name))!r}\n"
            f"open(t, 'wb').write(open({str(payload)!r}, 'rb').read())\nos.rename(t, {str(path)!r})\n"
        )
    done = team.py_as(user, code)
    assert done.returncode == 0, done.stderr


def _reply(team, name: str, user: str = BOB) -> dict:
    path = team.root / "state" / "replies" / f"{team.users[user].pw_uid}-{name}"
    wait_until(path.exists, what=f"the reply to {name}")
    return json.loads(path.read_text())


def _state(team, job_id: str) -> str | None:
    for d in ("running", "finished"):
        p = team.root / "state" / d / f"{job_id}.json"
        if p.exists():
            return json.loads(p.read_text())["state"]
    if (team.root / "state" / "held" / f"{job_id}.yaml").exists():
        return "held"
    return "pending" if (team.root / "jobs" / f"{job_id}.yaml").exists() else None


def test_no_request_can_stop_the_requests_behind_it(team):
    """H1: a request the worker could not apply (a lone surrogate in an edit's text, JSON nested
    200,000 deep, a directory whose set-aside name bob had made his) stayed taken, was retried
    first at every pass, and every later request waited for ever."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al.yaml", SLEEPER)
    wait_until(lambda: _state(team, "al") == "running", what="al to run")
    bad = {
        "r-1-00000000000000a1.json": b'{"verb": "edit", "ids": ["nothing"], "args": {"text": "\\ud800"}}',
        "r-1-00000000000000a2.json": b'{"verb": "cancel", "ids": [], "args": ' + b"[" * 200000,
    }
    for name, data in bad.items():
        _put_request(team, BOB, name, data)
    for _ in range(2):  # a directory, then the same name again, while bob fills the first
        _put_request(team, BOB, "r-1-00000000000000a3.json", None, directory=True)
        wait_until(lambda: not (team.root / "requests" / "r-1-00000000000000a3.json").exists(), what="taken")
    # F4: 2000 levels deep, renamed in whole: shutil.rmtree's recursion gave up on it and the
    # taken directory stopped every request on every box.
    _put_request(team, BOB, "r-1-00000000000000a4.json", None, directory=True, depth=2000)
    wait_until(lambda: not (team.root / "requests" / "r-1-00000000000000a4.json").exists(), what="the deep one taken")
    for name in bad:
        assert not _reply(team, name)["ok"]
    cancel = team.as_user(ALICE, "cancel", "al")
    assert cancel.returncode == 0, cancel.stderr
    assert wait_until(lambda: team.finished("al"), what="al cancelled")["state"] == "cancelled"
    assert team.workers["a"].poll() is None
    assert not list((team.root / "state" / "requests").iterdir())  # nothing of bob's left in state/
    aside = [p for p in (team.root / "requests").iterdir() if p.name.endswith(".not-a-request")]
    assert len(aside) == 3 and all(p.lstat().st_uid == team.users[BOB].pw_uid for p in aside)  # his, to remove


def test_a_file_under_another_members_job_id_is_never_that_job(team):
    """H2: cancel and hold looked at jobs/<id>.yaml first, so bob's file under alice's id (kept
    there by rewriting it unparsable) let him cancel her running job, replace her held spec,
    and half-apply her retry; a second file (x.yaml beside her x.yml) and a spec under her
    sweep's id stood in for her jobs."""
    team.write_config(spec_settle_s=60)  # bob's unparsable files wait that long before rejection
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al-r2.yaml", SLEEPER)
    team.drop_as(ALICE, "al-done.yaml", "command: echo one\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: _state(team, "al-r2") == "running" and team.finished("al-done"), what="alice's jobs")
    team.drop_as(BOB, "al-r2.yaml", "command: [unterminated\n")  # pending, unparsable: kept a while
    cancel = team.as_user(BOB, "cancel", "al-r2")
    assert cancel.returncode == 1 and f"belongs to {ALICE}" in cancel.stderr, cancel.stdout
    assert _state(team, "al-r2") == "running"
    # Under her ended job's id, his unparsable file is refused at once (it blocked her retry).
    team.drop_as(BOB, "al-done.yaml", "command: [unterminated\n")
    assert f"belongs to {ALICE}'s job" in wait_until(lambda: team.refusals("al-done"), what="bob's al-done refused")
    retry = team.as_user(ALICE, "retry", "al-done")
    assert retry.returncode == 0 and "attempt 2" in retry.stdout, retry.stderr
    never = "command: sleep 60\ngpus: 1\ngpu_mem: 90GiB\nworkdir: /\n"  # pending: fits no GPU here
    team.drop_as(ALICE, "al-h1.yaml", never)
    wait_until(lambda: team.status()["pending"], what="al-h1 pending")
    assert team.gpuq("hold", "al-h1").returncode == 0
    team.drop_as(BOB, "al-h1.yaml", "command: [unterminated\n")
    hold = team.as_user(BOB, "hold", "al-h1")
    assert hold.returncode == 1 and f"belongs to {ALICE}" in hold.stderr, hold.stderr  # hers, held
    assert os.stat(team.root / "state" / "held" / "al-h1.yaml").st_uid == team.users[ALICE].pw_uid
    team.drop_as(ALICE, "ay.yml", never)
    wait_until(lambda: any(j["id"] == "ay" for j in team.status()["pending"]), what="ay pending")
    team.drop_as(BOB, "ay.yaml", never)  # a second file for her id: refused, never her job
    assert "already has the id 'ay'" in wait_until(lambda: team.refusals("ay"), what="bob's duplicate refused")
    held = team.as_user(ALICE, "hold", "ay")
    assert held.returncode == 0, held.stderr
    assert os.stat(team.root / "state" / "held" / "ay.yaml").st_uid == team.users[ALICE].pw_uid


def test_a_spec_refused_for_another_members_id_is_never_retried_under_it(team):
    """A spec bob dropped under alice's job id was refused with the hint `gpuq retry <id>`: for
    her ended job that retry was hers (bob was refused), for her running one it put his spec
    back, to be refused again. The only fix is a new name; the message says so."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al-run.yaml", SLEEPER)
    team.drop_as(ALICE, "al-end.yaml", "command: echo one\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: _state(team, "al-run") == "running" and team.finished("al-end"), what="alice's jobs")
    messages = []
    for job_id in ("al-run", "al-end"):
        team.drop_as(BOB, f"{job_id}.yaml", SLEEPER)
        text = wait_until(lambda job_id=job_id: team.refusals(job_id), what=f"bob's {job_id} refused")
        assert "already used by an earlier job" in text and f"{job_id}-2.yaml" in text and "retry" not in text, text
        retry = team.as_user(BOB, "retry", job_id)
        assert retry.returncode == 1, retry.stdout
        assert not (team.root / "jobs" / f"{job_id}.yaml").exists()
        messages.append(retry.stderr)
    for message in messages:  # under her id, retry is her job's, running or ended
        assert f"belongs to {ALICE}" in message, message
    hers = team.as_user(ALICE, "retry", "al-run")  # her running job, not bob's refused spec
    assert hers.returncode == 1 and "al-run: has not ended yet" in hers.stderr, hers.stderr
    assert _state(team, "al-run") == "running" and team.finished("al-end")["state"] == "done"


def test_a_refused_spec_of_another_suffix_never_takes_a_members_error_file(team):
    """alice's al.yaml was refused; bob's al.yml, refused too, wrote its message over hers
    (state/rejected/al.error is named by the stem alone), so `gpuq show al` told her his error."""
    team.write_config(spec_settle_s=0.5)
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al.yaml", "command: echo hi\ngpus: 0\nworkdir: /\nbogus_field: 1\n")
    error = team.root / "state" / "rejected" / "al.error"
    wait_until(error.exists, what="alice's al refused")
    hers = error.read_text()
    assert "bogus_field" in hers, hers
    team.drop_as(BOB, "al.yml", "command: [never closed\n")
    wait_until(lambda: not (team.root / "jobs" / "al.yml").exists(), what="bob's al.yml refused")
    team.wait_passes("a")
    assert error.read_text() == hers
    assert "bogus_field" in team.as_user(ALICE, "show", "al").stdout
    bobs = [p for p in (team.root / "state" / "rejected").glob("al+*.error")]
    assert len(bobs) == 1 and "not valid YAML" in bobs[0].read_text(), bobs


def test_a_group_id_and_a_members_id_cannot_be_squatted(team):
    """H2(e), M2: bob's spec under alice's sweep id stood for her group in cancel and show;
    bob's file made in advance under a member's id was listed as her member."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(BOB, "asw_x1.yaml", "command: sleep 60\ngpus: 0\nworkdir: /\nhosts: [nowhere]\n")
    team.drop_as(ALICE, "asw.yaml", "command: echo {x}\ngpus: 0\nworkdir: /\nsweep: {x: [1, 2]}\n")
    group = team.root / "state" / "groups" / "asw.json"
    wait_until(group.exists, what="the sweep expanded")
    data = json.loads(group.read_text())
    assert data["members"] == ["asw_x2"] and data["skipped"] == ["asw_x1"]
    team.drop_as(BOB, "asw.yaml", SLEEPER)
    assert "is the id of a sweep or array" in wait_until(lambda: team.refusals("asw"), what="bob's spec refused")


def test_a_flood_of_requests_never_stalls_the_heartbeat_and_others_go_first(team):
    """H4: 300 requests of 10,000 ids each, applied in one step, stalled the heartbeat 108 s
    and the supervisors fenced alice's job. Now a request holds at most 1,000 ids, a pass
    applies requests for at most half a second, and senders take turns."""
    team.write_config(lost_after_s=20, grace_s=2)
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al-long.yaml", SLEEPER)
    wait_until(lambda: _state(team, "al-long") == "running", what="al-long")
    big = json.dumps({"verb": "cancel", "ids": [f"nope-{i}" for i in range(1001)]}).encode()
    _put_request(team, BOB, "r-1-0000000000000b00.json", big)
    assert "at most 1000" in _reply(team, "r-1-0000000000000b00.json")["outcomes"][0]["message"]
    many = json.dumps({"verb": "cancel", "ids": [f"nope-{i}" for i in range(1000)]}).encode()
    (team.base / "many").write_bytes(many)
    os.chmod(team.base / "many", 0o644)
    script = (
        f"import os\nd = {str(team.root / 'requests')!r}\nmany = open({str(team.base / 'many')!r}, 'rb').read()\n"
        f"for i in range(150):\n"
        f"    t = os.path.join(d, '.x%d' % i); open(t, 'wb').write(many)\n"
        f"    os.rename(t, os.path.join(d, 'r-2-%016x.json' % i))\n"
    )
    assert team.py_as(BOB, script).returncode == 0
    beat = team.root / "state" / "workers" / "a.json"
    seq = json.loads(beat.read_text())["seq"]
    cancel = team.as_user(ALICE, "cancel", "al-long")  # her turn comes before bob's 150
    assert cancel.returncode == 0, cancel.stderr
    wait_until(lambda: json.loads(beat.read_text())["seq"] >= seq + 3, what="heartbeats during the flood")
    record = wait_until(lambda: team.finished("al-long"), what="al-long cancelled")
    assert record["state"] == "cancelled" and f"cancelled by {ALICE}" in record["reason"]


def test_a_request_name_cannot_be_taken_first_and_the_queue_lock_is_the_workers(team):
    """M3: the request's temp name gave its final name away, bob created it first, and
    alice's command failed with a false message. L1: any member could flock state/queue.lock
    and slow every pass by 2 s."""
    team.start_worker("a", "1x80GiB")
    script = f"""
import os, time
d = {str(team.root / "requests")!r}
seen, end = set(), time.time() + 8
while time.time() < end:
    for n in os.listdir(d):
        if n.startswith('.') and 'r-' in n and n not in seen:
            seen.add(n)
            final = n[1:].split('.json')[0] + '.json'
            try: os.close(os.open(os.path.join(d, final), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except OSError: pass
print(len(seen))
"""
    squatter = team.popen_as(BOB, script)
    for i in range(3):
        team.drop_as(ALICE, f"sq{i}.yaml", SLEEPER.replace("gpus: 0", "gpus: 1\ngpu_mem: 90GiB"))
    for i in range(3):
        done = team.as_user(ALICE, "cancel", f"sq{i}")
        assert done.returncode == 0, done.stderr
    squatter.wait(timeout=30)
    lock = team.root / "state" / "queue.lock"
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
    assert team.py_as(BOB, f"open({str(lock)!r})").returncode != 0


def test_a_long_name_or_a_directory_posing_as_a_spec_never_jams_intake_or_lies(team):
    """M1: a 250-character spec name made every intake pass fail (ENAMETOOLONG) and lost its
    .error; M5: `gpuq cancel` of a directory posing as a spec said "nothing was changed" but
    wrote a record and left bob's 0777 directory in state/finished/."""
    assert team.py_as(BOB, f"import os; os.mkdir({str(team.root / 'jobs' / 'bdir.yaml')!r}, 0o777)").returncode == 0
    cancel = team.gpuq("cancel", "bdir", check=False)  # root's own cancel: applied at once, no worker
    assert cancel.returncode == 1 and "is a directory, not a job" in cancel.stderr, cancel.stderr
    assert team.finished("bdir") is None and not [p for p in (team.root / "state" / "finished").iterdir() if p.is_dir()]
    team.start_worker("a", "1x80GiB")
    long = "x" * 249
    for name in (f"{long}.yaml", f"{long}2.yaml"):  # 254 and 255 bytes: names the kernel allows
        made = team.py_as(BOB, f"open({str(team.root / 'jobs' / name)!r}, 'w').write({SLEEPER!r})")
        assert made.returncode == 0, made.stderr
    team.drop_as(ALICE, "after.yaml", "command: echo ok\ngpus: 0\nworkdir: /\n")
    assert wait_until(lambda: team.finished("after"), timeout=30, what="a job past the junk")["state"] == "done"
    errors = list((team.root / "state" / "rejected").glob("bad-name-*.error"))
    wait_until(
        lambda: len(list((team.root / "state" / "rejected").glob("bad-name-*.error"))) == 2,
        what="both long names refused, each with its .error",
    )
    assert team.workers["a"].poll() is None and errors is not None
    wait_until(lambda: (team.root / "state" / "rejected" / "bdir.error").exists(), what="the directory refused")
    # bob's directory is his: set aside in jobs/ for him to remove, never kept in state/
    aside = [p for p in (team.root / "jobs").iterdir() if p.name.startswith(".bdir.yaml.")]
    assert len(aside) == 1 and aside[0].name.endswith(".not-a-spec") and aside[0].is_dir()
    assert "jobs/" + aside[0].name in (team.root / "state" / "rejected" / "bdir.error").read_text()
    assert not [
        p for p in (team.root / "state").rglob("*") if p.is_dir() and p.lstat().st_uid != 0 and p.owner() == BOB
    ]


def test_a_request_being_sent_never_has_two_links(tmp_path, monkeypatch):
    """A worker refuses a request file with two links (below). The CLI linked its temp file
    into place and then unlinked the temp name: a loaded run's worker took a request in
    between and refused the member's own release. Sent with the temp name's removal slowed,
    a watcher must never see a request with two links."""
    import threading
    import time

    from gpuq.spool.inbox import send
    from gpuq.spool.layout import Layout

    layout = Layout(tmp_path)
    layout.requests.mkdir(parents=True)
    real_unlink = os.unlink

    def slow_unlink(path, *args, **kwargs):
        if str(path).startswith(".tmp-"):
            time.sleep(0.3)  # the sender descheduled right there
        return real_unlink(path, *args, **kwargs)

    links, done = [], threading.Event()

    def watch() -> None:
        while not done.is_set():
            for entry in os.scandir(layout.requests):
                if entry.name.startswith("r-"):
                    try:
                        links.append(entry.stat(follow_symlinks=False).st_nlink)
                    except FileNotFoundError:
                        pass
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    monkeypatch.setattr(os, "unlink", slow_unlink)
    try:
        name = send(layout, "cancel", ("x",))
        wait_until(lambda: links, what="the watcher to see the sent request")
    finally:
        monkeypatch.setattr(os, "unlink", real_unlink)
        done.set()
        watcher.join()
    assert links and set(links) == {1}, links
    assert [p.name for p in layout.requests.iterdir()] == [name]  # no temp file left


def test_a_request_with_two_links_is_refused(team):
    """Identity is the request file's owner: a hard link to someone else's file would borrow
    theirs, so a request with more than one link is refused (bob links his own here)."""
    team.start_worker("a", "1x80GiB")
    path, spare = team.root / "requests" / "r-1-00000000deadbeef.json", team.base / "bob-spare"
    os.chmod(team.base, 0o777)  # somewhere bob may keep the second link
    code = (
        f"import os\nt = {str(path.parent / '.x-linked')!r}\n"
        f'open(t, \'w\').write(\'{{"verb": "cancel", "ids": ["nosuch"], "args": {{}}, "from": ""}}\')\n'
        f"os.link(t, {str(spare)!r}); os.rename(t, {str(path)!r})\n"
    )
    done = team.py_as(BOB, code)
    assert done.returncode == 0, done.stderr
    reply = _reply(team, path.name)
    assert not reply["ok"] and "not a plain file with one link" in reply["outcomes"][0]["message"], reply


# --- a third round, from a review that used the recommended setup as two members ----------


def _flags(team):
    """A directory where the attackers' scripts and the test signal each other."""
    flags = team.base / "flags"
    flags.mkdir(exist_ok=True)
    os.chmod(flags, 0o777)
    return flags


def test_a_refused_spec_others_could_write_is_never_put_back(team):
    """A spec bob left group-writable was refused and kept in state/rejected as it was. Alice
    had opened it for writing meanwhile (a chmod does not take a handle back). Its fix once
    said `chmod go-w` and `gpuq retry`; later retry queued a fresh copy, but of the text read at
    the retry, which hers was by then (an attack review: her command ran as bob). Now such a
    spec is kept under a name retry does not take: retry refuses it, and a fresh file is the fix."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(BOB, "gw.yaml", "command: echo bob-ran\ngpus: 0\nworkdir: /\n", mode=0o664)
    error = team.root / "state" / "rejected" / "gw.error"
    said = wait_until(lambda: error.exists() and error.read_text(), what="bob's group-writable spec refused")
    assert "can be changed by other users" in said and "fresh copy" in said and "gpuq retry" not in said, said
    (refused,) = (team.root / "state" / "rejected").glob("gw+*.yaml")  # not gw.yaml: retry never takes it
    chmodded = _flags(team) / "chmodded"
    alice = team.popen_as(
        ALICE,
        f"""
import os, time
fd = os.open({str(refused)!r}, os.O_WRONLY)  # while the team may write it
print("opened", flush=True)
end = time.time() + 60
while not os.path.exists({str(chmodded)!r}) and time.time() < end:
    time.sleep(0.02)
os.ftruncate(fd, 0)
os.pwrite(fd, b"command: echo alice-ran\\ngpus: 0\\nworkdir: /\\n", 0)
print("wrote", flush=True)
""",
    )
    assert alice.stdout.readline().strip() == "opened"
    assert team.run_as(BOB, ["chmod", "go-w", str(refused)]).returncode == 0  # as the old fix said
    chmodded.touch()
    assert alice.stdout.readline().strip() == "wrote", alice.stderr.read()  # through her handle, after the chmod
    alice.wait(timeout=30)
    retry = team.as_user(BOB, "retry", "gw")
    assert retry.returncode == 1 and "cannot be put back" in retry.stderr and "fresh copy" in retry.stderr, retry
    assert not (team.root / "jobs" / "gw.yaml").exists()
    shown = team.as_user(BOB, "status").stdout
    assert "gw" in shown and "can be changed by other users" in shown, shown  # the refusal stays in view
    team.drop_as(BOB, "gw.yaml", "command: echo bob-ran\ngpus: 0\nworkdir: /\n")  # the fix: a fresh file
    record = wait_until(lambda: team.finished("gw"), timeout=60, what="bob's fresh spec")
    assert record["state"] == "done" and "bob-ran" in team.log("gw"), team.log("gw")


def test_a_retry_refuses_a_refused_spec_others_may_still_write(team):
    team.start_worker("a", "1x80GiB")
    team.drop_as(BOB, "gw2.yaml", "command: echo bob-ran\ngpus: 0\nworkdir: /\n", mode=0o664)
    wait_until(lambda: (team.root / "state" / "rejected" / "gw2.error").exists(), what="refused")
    retry = team.as_user(BOB, "retry", "gw2")
    assert retry.returncode == 1 and "cannot be put back" in retry.stderr, retry.stdout + retry.stderr
    assert not (team.root / "jobs" / "gw2.yaml").exists()


def test_a_directory_posing_as_a_request_leaves_nothing_its_maker_can_write_in_state(team):
    """bob's directory in requests/ was moved into state/requests/ and set aside, still his
    and 2755: a shell of his inside it went on writing files and links in state/. Now it goes
    back to his inbox, set aside: what he writes through his open handle lands there."""
    team.start_worker("a", "1x80GiB")
    name, go = "r-2-00000000000000bb.json", _flags(team) / "try-now"
    bob = team.popen_as(
        BOB,
        f"""
import os, time
d = os.path.join({str(team.root / "requests")!r}, {name!r})
os.mkdir(d)
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)  # as a shell whose working directory it is
end = time.time() + 60
while not os.path.exists({str(go)!r}) and time.time() < end:
    time.sleep(0.02)
try:
    os.close(os.open("planted", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    print("wrote")
except OSError as e:
    print("refused", e.errno)
""",
    )
    aside = lambda: list((team.root / "requests").glob(f".{name}.*.not-a-request"))  # noqa: E731
    wait_until(aside, what="the directory set aside in requests/")
    assert not list((team.root / "state" / "requests").iterdir())
    go.touch()
    out, err = bob.communicate(timeout=90)
    assert out.startswith("wrote"), out + err  # into his own directory, wherever it is now
    assert not list((team.root / "state").rglob("planted")), "bob wrote into state/"
    assert list((team.root / "requests").glob(f".{name}.*.not-a-request/planted"))


def test_a_reused_request_name_never_overwrites_a_members_reply(team):
    """Once a worker took alice's request its name was free in the inbox: bob sent his own
    under it, and his outcome replaced hers in state/replies/, where her CLI may read it.
    (Then a request under an answered name was dropped; two boxes could still each take one.)
    Now each asker's reply has its own name."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "mine.yaml", SLEEPER)
    wait_until(lambda: _state(team, "mine") == "running", what="alice's job to run")
    assert team.as_user(ALICE, "cancel", "mine").returncode == 0
    (reply,) = (team.root / "state" / "replies").iterdir()
    hers = json.loads(reply.read_text())
    assert hers["ok"] and hers["uid"] == team.users[ALICE].pw_uid, hers
    name = reply.name.partition("-")[2]
    _put_request(team, BOB, name, b'{"verb": "cancel", "ids": ["nonexistent-zz"]}')
    assert not _reply(team, name)["ok"]  # his, under his uid
    assert json.loads(reply.read_text()) == hers and _reply(team, name, ALICE) == hers


def test_a_cli_reads_only_the_reply_to_its_own_request(tmp_path):
    """The other half of the reused name: a reply written for someone else is not the
    sender's outcome, so its CLI waits on (and says the request waits) rather than print it."""
    from gpuq.spool.inbox import Reply, finish, read_reply
    from gpuq.spool.layout import Layout

    layout = Layout(tmp_path)
    layout.replies.mkdir(parents=True)
    name = "r-1-00000000000000cc.json"
    finish(layout, "a", name, Reply(((False, "x: no such job"),), "a", 4242))
    assert read_reply(layout, name, 4343) is None
    assert read_reply(layout, name, 4242) == Reply(((False, "x: no such job"),), "a", 4242)
    # a worker of an earlier version: the request's name alone, with the asker's uid or none
    (layout.replies / name).write_text(json.dumps(Reply(((True, "y: cancelled"),), "b", 4545).to_json()))
    assert read_reply(layout, name, 4343) is None and read_reply(layout, name, 4545).ok
    (layout.replies / name).write_text('{"ok": true, "outcomes": [{"ok": true, "message": "y: cancelled"}], "by": "b"}')
    assert read_reply(layout, name, 4343).ok


def test_a_member_saying_root_sent_a_request_is_named_as_himself(team):
    """Root's requests say so (`"root": true`), so a cancel by root reads "cancelled by root"
    rather than the queue account's name. A member's file saying it is named as its owner:
    only a file the worker's own account owns is believed."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(BOB, "bo-claims.yaml", SLEEPER)
    wait_until(lambda: _state(team, "bo-claims") == "running", what="bo-claims")
    forged = json.dumps({"verb": "cancel", "ids": ["bo-claims"], "root": True}).encode()
    _put_request(team, BOB, "r-1-0000000000000c00.json", forged)
    record = wait_until(lambda: team.finished("bo-claims"), what="bo-claims cancelled")
    assert record["state"] == "cancelled" and record["reason"] == f"cancelled by {BOB}", record["reason"]


def test_a_flood_of_specs_that_never_parse_neither_fences_the_box_nor_keeps_others_waiting(team):
    """A member's hundreds of 250 KB specs that never parse, touched again and again, held
    one pass for minutes (each read anew): the lease went stale and every running job on the
    box was fenced, and `gpuq submit` said no worker was running. A pass now reads jobs/ for
    a bounded time, each member's files in turn, and leaves the rest to the next."""
    team.write_config(lost_after_s=20)  # fenced once the lease is 12 s old
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al-run.yaml", SLEEPER)
    wait_until(lambda: _state(team, "al-run") == "running", what="al-run")
    jobs = str(team.root / "jobs")
    # 250 KB each (the size cap is 256 KiB), 40,000 keys under one field no spec has: ~0.2 s to parse
    flood = team.popen_as(
        BOB,
        f"import os, time\nd = {jobs!r}\n"
        "junk = ('command: echo\\nx:\\n' + ''.join('  k%d: 1\\n' % i for i in range(40000)))[:250000]\n"
        "for i in range(300):\n"
        "    t = os.path.join(d, '.j%d' % i); open(t, 'w').write(junk); os.rename(t, os.path.join(d, 'j%d.yaml' % i))\n"
        "print('dropped', flush=True)\n"
        "end = time.monotonic() + 90\n"
        "while time.monotonic() < end:\n"
        "    for i in range(300):\n"
        "        os.utime(os.path.join(d, 'j%d.yaml' % i))\n"
        "    time.sleep(0.5)\n",
    )
    try:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "dropped", flood.stderr
        team.drop_as(ALICE, "al-new.yaml", SLEEPER)
        wait_until(lambda: _state(team, "al-new") == "running", timeout=60, what="al-new started during the flood")
        beat = team.root / "state" / "workers" / "a.json"
        seq = json.loads(beat.read_text())["seq"]
        wait_until(lambda: json.loads(beat.read_text())["seq"] >= seq + 5, timeout=60, what="passes go on")
        record = json.loads((team.root / "state" / "running" / "al-run.json").read_text())
        assert record["state"] == "running" and record.get("attempt", 1) == 1, record
        assert "fenced" not in (team.root / "logs" / "al-run.log").read_text()
    finally:
        flood.kill()
        flood.wait(timeout=30)
