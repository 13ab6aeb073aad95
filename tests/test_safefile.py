"""host/safefile.py: the one reader of a file others may have written. Each way a file can
be wrong is refused with its reason, judged on the open file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuq.host import safefile
from gpuq.host.safefile import NotPlain, read_plain


def _why(path: Path, cap: int = 100, owners=None) -> str:
    with pytest.raises(NotPlain) as refused:
        read_plain(path, cap, owners)
    return refused.value.why


def test_a_plain_file_is_read_with_its_stat(tmp_path: Path):
    plain = tmp_path / "spec.yaml"
    plain.write_bytes(b"command: true\n")
    data, st = read_plain(plain, 100, {os.getuid()})
    assert data == b"command: true\n" and st.st_size == len(data)


def test_every_kind_of_wrong_file_is_refused_with_why(tmp_path: Path):
    target = tmp_path / "secret"
    target.write_bytes(b"x")
    (tmp_path / "link").symlink_to(target)
    assert _why(tmp_path / "link") == safefile.LINK
    os.mkfifo(tmp_path / "fifo")  # never blocks: opened non-blocking, then refused
    assert _why(tmp_path / "fifo") == safefile.NOT_REGULAR
    (tmp_path / "dir").mkdir()
    assert _why(tmp_path / "dir") == safefile.NOT_REGULAR
    os.link(target, tmp_path / "hard")
    assert _why(tmp_path / "hard") == safefile.LINKS
    big = tmp_path / "big"
    big.write_bytes(b"y" * 101)
    assert _why(big) == safefile.TOO_BIG
    assert read_plain(big, 101)[0] == b"y" * 101  # at the cap: read
    other = tmp_path / "other"
    other.write_bytes(b"z")
    assert _why(other, owners={os.getuid() + 1}) == safefile.NOT_OWNER
    with pytest.raises(FileNotFoundError):
        read_plain(tmp_path / "missing", 100)


def test_a_file_read_while_its_writer_removes_its_temporary_name_is_read(tmp_path):
    """atomic_write(exclusive=True) links the file into place, then removes its temporary
    name: read in between, it has two links, the second its writer's temporary name (an id
    reservation read so was nobody's, and a job of the demo was refused as another's)."""
    import threading

    path, temporary = tmp_path / "x.json", tmp_path / ".x.json.tmp"
    path.write_bytes(b'{"uid":0}')
    os.link(path, temporary)
    timer = threading.Timer(0.02, os.unlink, (temporary,))
    timer.start()
    try:
        assert read_plain(path, 100)[0] == b'{"uid":0}'
    finally:
        timer.join()


def test_a_file_that_keeps_a_second_link_is_still_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"{}")
    os.link(path, tmp_path / "elsewhere")
    with pytest.raises(NotPlain) as refused:
        read_plain(path, 100)
    assert refused.value.why == safefile.LINKS


def test_a_file_whose_writer_was_killed_before_it_removed_its_temporary_name_is_read(tmp_path):
    """Killed between linking the file into place and removing its temporary name, a writer
    leaves both for good: an id reservation read so was nobody's, and a killed worker's
    t0088 was refused for ever as "an unknown member's job". Its own temporary name beside it
    is no second owner's link."""
    path = tmp_path / "t0088"
    path.write_bytes(b'{"uid":0}')
    os.link(path, tmp_path / ".t0088.17163.698245d5.tmp")
    assert read_plain(path, 100)[0] == b'{"uid":0}'


def test_two_links_in_a_directory_others_may_write_are_refused_whatever_their_names(tmp_path):
    """In jobs/ (sticky, the team's) a member could give another's file two names, one of them
    looking like a writer's temporary name: no exception there."""
    shared = tmp_path / "jobs"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    path = shared / "x.yaml"
    path.write_bytes(b"command: true\n")
    os.link(path, shared / ".x.yaml.1.ab.tmp")
    with pytest.raises(NotPlain):
        read_plain(path, 100)
