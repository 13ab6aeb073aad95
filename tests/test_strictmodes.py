"""What a root start refuses to trust (spool/strictmodes.py), on a stand-in copy of the code's
tree: whoever can change gpuq's code runs as root at the next cron start."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest

from gpuq.spool import strictmodes
from gpuq.spool.layout import Layout

MODULES = ("__init__.py", "model/__init__.py", "model/spec.py", "spool/__init__.py", "spool/strictmodes.py")


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Layout]:
    """The code's shape (packages, and modules in them) under tmp_path/gpuq, and a queue root:
    problems() finds the code from where strictmodes.py lies, here in the stand-in."""
    code = tmp_path / "gpuq"
    for module in MODULES:
        (code / module).parent.mkdir(parents=True, exist_ok=True)
        (code / module).write_text("")
    monkeypatch.setattr(strictmodes, "__file__", str(code / "spool" / "strictmodes.py"))
    layout = Layout(tmp_path / "root")
    layout.ensure()
    return code, layout


def _code_problems(layout: Layout) -> list[str]:
    me = os.geteuid()
    return sorted(p.split(" (gpuq's code) ")[0] for p in strictmodes.problems(layout, me, root_uid=me))


@pytest.mark.skipif(os.geteuid() != 0, reason="gives entries to another uid (CI runs as root)")
def test_a_module_file_others_can_write_is_reported_not_only_a_package_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A world-writable module, and a group-writable one of a group other than root's, are
    each named with the fix: a check of the package directories alone would pass a module
    that any member may rewrite, and so run as root."""
    code, layout = _stand_in(tmp_path, monkeypatch)
    me = os.geteuid()  # whose the code must be: root's for a root start, here this test's

    def code_problems() -> list[str]:
        return [p for p in strictmodes.problems(layout, me, root_uid=me) if "(gpuq's code)" in p]

    assert code_problems() == []  # the stand-in as installed: nothing to report
    world = code / "model" / "spec.py"
    os.chmod(world, 0o666)
    group = code / "spool" / "strictmodes.py"
    os.chmod(group, 0o664)
    if os.stat(group).st_gid == 0:  # group root may write (allowed); a team's group may not
        os.chown(group, -1, 4242)
    found = code_problems()
    assert [p.split(" (gpuq's code) ")[0] for p in found] == [str(world), str(group)], found
    assert all("can be written by others" in p for p in found), found
    assert found[0].endswith(f"Fix: chmod go-w {world}")


def test_a_link_in_the_code_is_judged_by_where_it_leads_and_a_directory_by_its_own_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A module that is a link to a file others can write, a package that is a link to a
    directory others can write, a module others can write in a package that is a link to a
    safe directory (Python imports it all the same), and a package directory others can
    write: each named. The tree is walked entry by entry, so a link must be followed on its own."""
    code, layout = _stand_in(tmp_path, monkeypatch)
    me = os.geteuid()
    outside = tmp_path / "outside"
    (outside / "pkg").mkdir(parents=True)
    (outside / "evil.py").write_text("")
    os.chmod(outside / "evil.py", 0o666)
    os.chmod(outside / "pkg", 0o777)
    (outside / "safe").mkdir()  # a directory nobody else may write, with a module anyone may
    (outside / "safe" / "mod.py").write_text("")
    os.chmod(outside / "safe" / "mod.py", 0o666)
    (code / "model" / "linked.py").symlink_to(outside / "evil.py")
    (code / "linkedpkg").symlink_to(outside / "pkg")
    (code / "safepkg").symlink_to(outside / "safe")
    (code / "model" / "up").symlink_to(code)  # a link back up: walked once, not for ever
    os.chmod(code / "spool", 0o777)
    found = [p.split(" (gpuq's code) ")[0] for p in strictmodes.problems(layout, me, root_uid=me)]
    want = [outside / "evil.py", outside / "pkg", code / "safepkg" / "mod.py", code / "spool"]
    assert sorted(found) == sorted(map(str, want)), found


def test_what_another_uid_owns_in_the_code_is_named_even_a_link_back_up_or_cached_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A link another uid owns (its owner can point it anywhere), also one that leads back up
    into the code; bytecode another uid planted in `__pycache__` (Python imports it instead of
    compiling the module); a package directory others may write though it is sticky (anyone
    may add such bytecode to it)."""
    code, layout = _stand_in(tmp_path, monkeypatch)
    (code / "model" / "up").symlink_to(code)
    os.lchown(code / "model" / "up", 4242, -1)
    cache = code / "spool" / "__pycache__"
    cache.mkdir()
    (cache / "strictmodes.cpython-311.pyc").write_bytes(b"")
    os.chown(cache / "strictmodes.cpython-311.pyc", 4242, -1)
    os.chmod(code / "model", 0o1777)
    want = [code / "model", code / "model" / "up", cache / "strictmodes.cpython-311.pyc"]
    assert _code_problems(layout) == sorted(map(str, want))


@pytest.mark.parametrize("shared_mode", [0o777, 0o1777])
def test_a_link_is_judged_at_every_hop_and_one_to_nothing_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_mode: int
):
    """A module that links to a link in a directory others can write, which links on to a safe
    file: the middle hop is theirs to swap (unless the directory is sticky). A module that
    links to nothing: whoever may make what it names decides what root imports, sticky
    directory or not."""
    code, layout = _stand_in(tmp_path, monkeypatch)
    safe, shared = tmp_path / "safe", tmp_path / "shared"
    safe.mkdir()
    shared.mkdir()
    os.chmod(shared, shared_mode)
    (safe / "real.py").write_text("")
    (shared / "hop.py").symlink_to(safe / "real.py")
    (code / "model" / "bounce.py").symlink_to(shared / "hop.py")
    (code / "model" / "plug.py").symlink_to(shared / "plug.py")
    want = [code / "model" / "plug.py"] + ([shared] if shared_mode == 0o777 else [])
    assert _code_problems(layout) == sorted(map(str, want))


def test_a_directory_python_imports_from_is_nobodys_to_add_to_even_sticky(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The code directory, the directory above it (first on the worker's sys.path: a json.py
    there is imported in place of the standard library's), and a package that is a link to a
    directory: a sticky bit keeps others from swapping what is there, not from adding a
    module (or an extension module, which Python prefers to a .py)."""
    code, layout = _stand_in(tmp_path, monkeypatch)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    (sticky / "mod.py").write_text("")
    (code / "plugins").symlink_to(sticky)
    for directory in (code, tmp_path, sticky):
        os.chmod(directory, 0o1777)
    assert _code_problems(layout) == sorted(map(str, [code, tmp_path, code / "plugins"]))


def _acl(path: Path, named: list[tuple[int, int]]) -> None:
    """Give `path` a POSIX ACL (as `setfacl` writes it): owner rw, its group r, the `named`
    (tag, id) entries rw, mask rw, others r. Its mode's group bits then show the mask (rw)."""
    entries = sorted([(0x01, 6, 0xFFFFFFFF), *((tag, 6, who) for tag, who in named), (0x04, 4, 0xFFFFFFFF)])
    entries += [(0x10, 6, 0xFFFFFFFF), (0x20, 4, 0xFFFFFFFF)]  # the kernel takes them in tag order
    value = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(path, "system.posix_acl_access", value)
    except OSError as e:
        pytest.skip(f"this filesystem keeps no POSIX ACLs ({e})")


def test_a_member_an_acl_lets_write_a_module_or_add_one_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A helper's review: the mode of a root:root module read 0664 (its ACL's mask), and the
    ACL let uid 4242 rewrite it, run as root at the next start; a directory's let gid 4343
    add a module. ACL entries for root or the worker's own account are no one else's."""
    code, layout = _stand_in(tmp_path, monkeypatch)
    _acl(code / "model" / "spec.py", [(0x02, 4242)])
    _acl(code / "spool", [(0x08, 4343)])
    _acl(code / "model" / "__init__.py", [(0x02, 0), (0x08, 0)])
    assert stat.S_IMODE(os.stat(code / "model" / "spec.py").st_mode) & stat.S_IWGRP
    found = strictmodes.problems(layout, os.geteuid(), root_uid=os.geteuid())
    assert _code_problems(layout) == sorted(map(str, [code / "model" / "spec.py", code / "spool"]))
    assert any("spec.py (gpuq's code) can be written by uid 4242 through its ACL" in p for p in found), found
    assert any(f"Fix: setfacl -b {code / 'spool'}" in p and "gid 4343" in p for p in found), found


def test_an_entry_gone_while_the_code_is_walked_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A file removed between the directory's listing and its lstat: nothing to import, and no
    traceback in place of the root start's refusal or of doctor's report."""
    code, layout = _stand_in(tmp_path, monkeypatch)
    real_lstat = os.lstat

    def vanishing(path, *args, **kwargs):
        if str(path).endswith("spec.py"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", vanishing)
    assert _code_problems(layout) == []


def test_links_in_a_circle_are_named_not_followed_for_ever(tmp_path: Path):
    from gpuq.host.hostinfo import chain_problems

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert [why for _, why, _ in chain_problems(tmp_path / "a" / "x.py", os.geteuid())] == [
        "is reached through too many links, or too long a path"
    ]
