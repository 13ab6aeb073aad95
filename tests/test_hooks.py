"""gpuq/hooks.py: extras are found by listing their folder, and a broken one is left out with
why and the fix, never taking the core down with it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import gpuq.extras
from gpuq import hooks
from gpuq.cli.doctor import check_extras
from gpuq.model.config import Config

GOOD = """
from gpuq.hooks import Verb
def register(registry):
    registry.verbs.append(Verb("hello", "say hello", lambda parser: None, "extras.good:run"))
    registry.backends["elsewhere"] = "extras.good:Worker"
"""


@pytest.fixture
def extras_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A registry over extras written into tmp_path instead of gpuq/extras/."""
    monkeypatch.setattr(hooks, "EXTRAS_DIR", tmp_path)
    monkeypatch.setattr(gpuq.extras, "__path__", [str(tmp_path)])
    monkeypatch.setattr(hooks, "_registry", None)
    before = set(sys.modules)

    def write(name: str, init: str | None) -> None:
        (tmp_path / name).mkdir()
        if init is not None:
            (tmp_path / name / "__init__.py").write_text(init)

    yield write
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_a_broken_extra_is_left_out_with_why_and_the_others_load(extras_in):
    extras_in("good", GOOD)
    extras_in("raises", "def register(registry):\n    registry.verbs.append(1)\n    raise RuntimeError('boom')\n")
    extras_in("noregister", "X = 1\n")
    extras_in("syntax", "def register(:\n")
    extras_in("notapackage", None)  # a folder without __init__.py: not an extra
    got = hooks.registry()
    assert [v.name for v in got.verbs] == ["hello"] and got.backends == {"elsewhere": "extras.good:Worker"}
    assert set(got.broken) == {"raises", "noregister", "syntax"}
    assert "RuntimeError: boom" in got.broken["raises"] and "delete the folder gpuq/extras/raises" in hooks.fix(
        "raises"
    )
    assert "no register(registry) function" in got.broken["noregister"]


def test_an_extra_that_exits_a_copy_a_link_or_one_others_can_write_is_left_out(extras_in, tmp_path: Path):
    extras_in("good", GOOD)
    extras_in("exits", "import sys\nsys.exit(3)\n")
    extras_in("good_copy", GOOD)  # a second copy under a name that imports: its verbs are taken
    extras_in("slurm-old", GOOD)  # a backup copy under a name that is no identifier
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "__init__.py").write_text(GOOD)
    (tmp_path / "linked").symlink_to(elsewhere)
    extras_in("writable", GOOD.replace("hello", "hi").replace("elsewhere", "there"))
    (tmp_path / "writable").chmod(0o777)
    got = hooks.registry()
    assert [v.name for v in got.verbs] == ["hello"]
    assert set(got.broken) == {"exits", "good_copy", "slurm-old", "linked", "writable"}
    assert "SystemExit" in got.broken["exits"]
    assert "another extra already gives elsewhere, hello" in got.broken["good_copy"]
    assert "no Python identifier" in got.broken["slurm-old"]
    assert "is a symbolic link" in got.broken["linked"]
    assert "is not gpuq's own" in got.broken["writable"] and "mode 777" in got.broken["writable"]


def test_doctor_reports_a_broken_extra_and_a_backend_no_extra_gives(extras_in):
    extras_in("raises", "raise ImportError('half installed')\n")
    findings = check_extras(Config(backend="slurm"))
    assert [(f.level, f.check) for f in findings] == [("warn", "extras"), ("fail", "extras")]
    assert "half installed" in findings[0].message and "delete the folder gpuq/extras/raises" in findings[0].fix
    assert "every worker refuses to start" in findings[1].message and "backend: local" in findings[1].fix
    assert [(f.level, f.message) for f in check_extras(Config())][:1] == [("warn", findings[0].message)]
