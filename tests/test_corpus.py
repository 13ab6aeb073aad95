"""The hostile-spec corpus (tests/corpus/): every bad spec is refused with its message, by the
worker and by `gpuq submit --spec`, without disturbing anything else; the good variants run.
`submit` and what one pass of a box refuses at once run in this process (tests/harness.py);
the whole corpus goes through a real worker, whose peak memory and bytes read are its process's."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
from harness import PassWorker, gpuq, status

from conftest import wait_until
from gpuq import hooks
from gpuq.model.names import JOB_ID_RE

CORPUS = Path(__file__).resolve().parent / "corpus"


def expected() -> dict[str, str]:
    rows = [
        line.split("\t")
        for line in (CORPUS / "expected.tsv").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    return {name: _without_extras(CORPUS / "bad" / name) or message for name, message in rows}


def _without_extras(path: Path) -> str | None:
    """What a spec setting a field of an extra that is not here is refused with instead (a core
    whose containers extra was deleted: tests/test_extras.py), or None."""
    text = path.read_text(errors="replace")
    for name in hooks.FIELDS_OF_EXTRAS:
        if re.search(rf"^{name}:", text, re.M) and (missing := hooks.missing_field(name)) is not None:
            return missing[0]
    return None


def good_specs() -> list[Path]:
    """The good variants this installation runs (one with a container needs its extra)."""
    return [p for p in sorted((CORPUS / "good").iterdir()) if _without_extras(p) is None]


def special_cases(jobs: Path, secret: Path) -> dict[str, str]:
    """Bad specs a repository cannot hold: links, a FIFO, a directory, 100 MB, odd names."""
    os.symlink(secret, jobs / "symlink-to-secret.yaml")
    (jobs.parent / "outside.yaml").write_text("command: echo linked\n")
    os.link(jobs.parent / "outside.yaml", jobs / "hardlink.yaml")
    os.mkfifo(jobs / "fifo.yaml")
    (jobs / "directory.yaml").mkdir()
    with open(jobs / "huge.yaml", "wb") as f:
        f.truncate(100 * 1024 * 1024)  # 100 MB (sparse: cheap to make, as big to read)
    (jobs / "new\nline.yaml").write_text("command: echo x\n")
    return {
        "symlink-to-secret.yaml": "is a symbolic link",
        "hardlink.yaml": "has more than one hard link",
        "fifo.yaml": "is not a regular file",
        "directory.yaml": "is not a regular file",
        "huge.yaml": "over the 262144 cap",
        "new\nline.yaml": "the file name is not a usable job id",
    }


def _kept_as(name: str) -> str:
    """The id a refused file is kept and listed under: its own, or one of gpuq's for a name
    that is not a job id (a line break in it)."""
    stem = name.rsplit(".", 1)[0]
    if JOB_ID_RE.fullmatch(stem):
        return stem
    return f"bad-name-{hashlib.sha1(stem.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


def test_corpus_is_large_and_every_file_has_its_message():
    bad = sorted(p.name for p in (CORPUS / "bad").iterdir())
    assert len(bad) + 6 >= 40 and sorted(expected()) == bad


@pytest.mark.slow
def test_the_worker_refuses_every_bad_spec_with_its_message_and_runs_the_rest(queue, tmp_path):
    queue.write_config(spec_settle_s=0.5, recent_finished=100, allow_root_jobs=True)
    jobs = queue.root / "jobs"
    want = expected()
    for name in want:
        shutil.copy(CORPUS / "bad" / name, jobs / name)
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    want.update(special_cases(jobs, secret))
    for good in good_specs():
        shutil.copy(good, jobs / good.name)
    worker = queue.start_worker("a", "1x80GiB")
    rejected = queue.root / "state" / "rejected"
    for name, message in want.items():
        stem = _kept_as(name)
        error = wait_until(
            lambda stem=stem: (rejected / f"{stem}.error").exists() and (rejected / f"{stem}.error"),
            timeout=30,
            what=f"{name} to be refused",
        )
        text = error.read_text()
        assert (f"jobs/{name}" in text or f"jobs/{name!r}" in text) and message in text and "Fix: " in text, (
            name,
            text,
        )
    # The link's target was never read into anything the team can see (the refused link itself
    # is moved to rejected/ as it is: a link, not a copy):
    leaked = [p for d in ("state", "logs") for p in (queue.root / d).rglob("*") if b"root only" in _plain_bytes(p)]
    assert leaked == []
    # 100 MB never read: the worker's peak resident memory (VmHWM), not today's, stays under it.
    peak_kib = int(re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{queue.worker_pid('a')}/status").read_text()).group(1))
    assert peak_kib < 100 * 1024, f"the worker's peak memory is {peak_kib} KiB"
    # ... nor streamed through a small buffer: all the worker has read, every file together.
    read = int(re.search(r"rchar: (\d+)", Path(f"/proc/{queue.worker_pid('a')}/io").read_text()).group(1))
    assert read < 50 * 2**20, f"the worker has read {read} bytes"
    for good in ("crlf", "bom", "comments", "extension"):
        record = wait_until(lambda good=good: queue.finished(good), what=f"{good} to run")
        assert record["state"] == "done"
    listed = {r["id"] for r in queue.status()["rejected"]}
    assert {_kept_as(n) for n in want} <= listed, sorted(listed)
    assert worker.poll() is None


def test_submit_refuses_what_the_worker_refuses_before_writing_anything(tmp_path):
    root = PassWorker(tmp_path / "root").root  # no pass: submit reads and writes the spool only
    for name, message in expected().items():
        result = gpuq(root, "submit", "--spec", str(CORPUS / "bad" / name), check=False)
        assert result.returncode == 2 and message in result.stderr and "Nothing was written" in result.stderr, (
            name,
            result.stderr,
        )
    assert os.listdir(root / "jobs") == []
    for good in good_specs():
        assert gpuq(root, "submit", "--spec", str(good)).returncode == 0
    assert len(os.listdir(root / "jobs")) == len(good_specs())
    for bad_id in ("../escape", "a\nb", "x" * 4096):
        result = gpuq(root, "submit", "--id", bad_id, "--", "true", check=False)
        assert result.returncode == 2 and "ids are letters, digits" in result.stderr, result.stderr


def test_what_is_wrong_with_the_file_itself_is_refused_at_once_content_waits_to_settle(tmp_path):
    """At once: by the box's first pass, its clock not moved; the half-written one waits out
    spec_settle_s (30 s) shown as invalid, passes later still."""
    box = PassWorker(tmp_path / "root", spec_settle_s=30, allow_root_jobs=True)
    jobs = box.root / "jobs"
    os.mkfifo(jobs / "pipe.yaml")
    os.symlink(tmp_path / "nowhere", jobs / "link.yaml")
    (jobs / "half.yaml").write_text("command: [unfinished\n")  # maybe still being written
    box.run_pass()
    rejected = box.root / "state" / "rejected"
    assert (rejected / "pipe.error").exists() and (rejected / "link.error").exists()
    for _ in range(3):
        box.run_pass(after_s=5)  # 15 s on: still within its settling time
    assert not (rejected / "half.error").exists() and (jobs / "half.yaml").exists()
    assert any(p["id"] == "half" for p in status(box.root)["invalid"])  # shown, with its problem
    assert box.launched() == []


def _plain_bytes(path: Path) -> bytes:
    """A plain file's bytes; nothing for a link, a directory or a file the running worker
    removed since the listing (a temp file renamed into place, a request answered)."""
    try:
        return path.read_bytes() if path.is_file() and not path.is_symlink() else b""
    except FileNotFoundError:
        return b""
