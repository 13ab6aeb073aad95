"""gpuq/hooks.py: extras are found by listing their folder, and a broken one is left out with
why and the fix, never taking the core down with it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import gpuq.extras
from gpuq import hooks

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
    assert (
        "RuntimeError: boom" in got.broken["raises"] and "delete the folder gpuq/extras/raises" in got.broken["raises"]
    )
    assert "no register(registry) function" in got.broken["noregister"]


def test_the_real_extras_register_their_verbs_and_backend():
    got = hooks.registry()
    assert got.broken == {}
    assert {"simulate", "export"} <= {v.name for v in got.verbs}
    assert got.backends == {"slurm": "extras.slurm.bridge:BridgeWorker"}
