"""The package's layers hold (tools/layers.py): imports go one way, no cycles, no import inside a
function but the listed ones; and `pip install .` (not only -e) installs every subpackage."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, remove_local_dir, wait_until
from gpuq.single_instance import default_local_dir
from tools import layers


def test_the_package_has_no_upward_import_no_cycle_and_no_unlisted_lazy_import() -> None:
    assert layers.problems() == []


@pytest.mark.slow
def test_the_command_prints_every_package_and_what_it_imports() -> None:
    out = subprocess.run([sys.executable, "-m", "tools.layers"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    *packages, size = out.stdout.splitlines()  # a line per package, then the size of the code
    assert [line.split()[0] for line in packages] == list(layers.ALLOWED)
    model = next(line for line in packages if line.startswith("model"))
    assert model.endswith("(nothing of gpuq)")
    assert size.startswith("lines: core ")


def _non_blank_lines(paths: list[Path]) -> int:
    return sum(1 for path in paths for line in path.read_text().splitlines() if line.strip())


def test_the_size_of_the_core_and_of_the_extras_is_printed_apart(capsys: pytest.CaptureFixture[str]) -> None:
    """The line `python -m tools.layers` ends its graph with: the core's and the extras' non-blank
    lines of Python, as counting the files here gives them (an extra's tests/ is not its code)."""
    assert layers.main([]) == 0
    size = capsys.readouterr().out.splitlines()[len(layers.ALLOWED)]
    found = re.fullmatch(r"lines: core (\d+), extras (\d+) \(non-blank lines of Python; .*\)", size)
    assert found, size
    every = [p for p in layers.PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts]
    extras_dir = layers.PACKAGE_DIR / "extras"
    core = [p for p in every if not p.is_relative_to(extras_dir)]
    extras = [p for p in every if p.is_relative_to(extras_dir) and "tests" not in p.relative_to(extras_dir).parts]
    assert int(found[1]) == _non_blank_lines(core) > int(found[2]) == _non_blank_lines(extras) > 0


def test_the_size_counts_what_each_part_gains(tmp_path: Path) -> None:
    """Lines added to the core count in the core, to an extra in the extras; blank lines and an
    extra's tests count nowhere."""
    copy = _copy_of_package(tmp_path)
    before = layers.line_counts(copy)
    _append(copy / "model" / "units.py", "\n\nA = 1\n\n   \nB = 2\n")
    (copy / "extras" / "one").mkdir()
    (copy / "extras" / "one" / "__init__.py").write_text('"""One extra."""\n\nC = 3\n')
    (copy / "extras" / "one" / "tests").mkdir()
    (copy / "extras" / "one" / "tests" / "test_one.py").write_text("def test_c():\n    assert True\n")
    assert layers.line_counts(copy) == {"core": before["core"] + 2, "extras": before["extras"] + 2}


def _copy_of_package(tmp_path: Path) -> Path:
    copy = tmp_path / "gpuq"
    shutil.copytree(layers.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_each_kind_of_break_is_found(tmp_path: Path) -> None:
    """The check is not vacuous: each way of breaking the layers makes a problem naming it."""
    copy = _copy_of_package(tmp_path)
    _append(copy / "model" / "units.py", "\nfrom gpuq.spool.layout import Layout\n")
    _append(
        copy / "sched" / "placement.py",
        "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpuq.sched.plan import plan\n",
    )
    _append(copy / "host" / "wake.py", "\ndef later():\n    from gpuq.host import probe\n    return probe\n")
    _append(copy / "views" / "render.py", "\ndef later():\n    import json\n    return json\n")
    _append(copy / "spool" / "ids.py", "\nimport importlib\nviews = importlib.import_module('gpuq.views.render')\n")
    _append(
        copy / "run" / "limits.py",
        "\ndef pick(x):\n    match x:\n        case 1:\n            from gpuq.cli import common\n",
    )
    for extra in ("one", "other"):  # two extras of its own: the check must not need any real one
        (copy / "extras" / extra).mkdir()
        (copy / "extras" / extra / "__init__.py").write_text("")
    (copy / "extras" / "one" / "trace.py").write_text(
        "from typing import TYPE_CHECKING\nif not TYPE_CHECKING:\n    def f():\n        from gpuq.model import units\n"
    )
    _append(copy / "worker" / "claiming.py", "\nfrom gpuq.extras.one import trace\n")  # the core names an extra
    _append(copy / "extras" / "other" / "__init__.py", "from gpuq.extras.one import trace\n")
    (copy / "extra.py").write_text("from gpuq.model import units\n")
    found = "\n".join(layers.problems(copy))
    assert "gpuq.model.units" in found and "model may not import spool" in found
    assert "import cycle:" in found and "gpuq.sched.placement" in found and "gpuq.sched.plan" in found
    assert "gpuq.host.wake" in found and "imports gpuq inside a function" in found
    assert "gpuq.views.render" in found and "imports json inside a function" in found
    assert "gpuq.spool.ids" in found and "imports by name (import_module)" in found
    assert "gpuq.run.limits" in found and "run may not import cli" in found  # inside a match case
    assert "gpuq.extras.one.trace" in found and "imports gpuq inside a function" in found  # `if not TYPE_CHECKING`
    assert "gpuq.worker.claiming" in found and "worker may not import extras" in found
    assert "gpuq.extras.other" in found and "one extra may not import another" in found
    assert "gpuq.extra is in no package" in found


def test_a_function_longer_than_the_limit_is_found(tmp_path: Path) -> None:
    """The check is not vacuous: a function, a method or a nested one of more than
    MAX_FUNCTION_LINES lines (docstring and comments count) is named, in the core and in an
    extra; one of exactly the limit, and one in an extra's tests, are not."""
    limit = layers.MAX_FUNCTION_LINES
    assert layers.long_functions() == []

    def function(name: str, lines: int, indent: str = "") -> str:
        body = [f'{indent}    """Says what it does."""', f"{indent}    # why"]
        body += [f"{indent}    x = {i}" for i in range(lines - 1 - len(body))]
        return "\n".join([f"{indent}def {name}() -> None:", *body]) + "\n"

    copy = _copy_of_package(tmp_path)
    _append(
        copy / "views" / "render.py", "\n\n" + function("too_long", limit + 1) + "\n\n" + function("at_limit", limit)
    )
    _append(copy / "sched" / "plan.py", "\n\nclass Long:\n" + function("method", limit + 1, "    "))
    _append(copy / "model" / "units.py", "\n\ndef outer() -> None:\n" + function("inner", limit + 5, "    "))
    (copy / "extras" / "one" / "tests").mkdir(parents=True)
    (copy / "extras" / "one" / "__init__.py").write_text(function("register", limit + 1))
    (copy / "extras" / "one" / "tests" / "test_one.py").write_text(function("test_long", limit + 1))
    found = layers.long_functions(copy)
    named = [re.fullmatch(r"(\S+): (\S+) \(line \d+\) is (\d+) lines long: .*", line) for line in found]
    assert [m.groups() if m else line for m, line in zip(named, found)] == [
        ("gpuq.extras.one", "register", str(limit + 1)),
        ("gpuq.model.units", "outer", str(limit + 6)),
        ("gpuq.model.units", "outer.inner", str(limit + 5)),
        ("gpuq.sched.plan", "Long.method", str(limit + 1)),
        ("gpuq.views.render", "too_long", str(limit + 1)),
    ]
    assert found[0] == (
        f"gpuq.extras.one: register (line 1) is {limit + 1} lines long: split it along its concerns (at most {limit})"
    )
    assert set(found) <= set(layers.problems(copy))


def test_loosening_allowed_against_the_layers_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(layers.ALLOWED, "model", frozenset({"views"}))
    monkeypatch.setitem(layers.ALLOWED, "worker", layers.ALLOWED["worker"] | {"views"})
    found = layers.problems()
    assert "ALLOWED lets model import views, which is not in a layer below it" in found
    assert "ALLOWED lets worker import views, which is not in a layer below it" in found


def test_the_verb_table_counts_as_imports_of_the_cli() -> None:
    """`gpuq status` loads only its verb's module; for the check, each is an import of the verb
    table's module, gpuq.cli.verbs (so a verb module importing the CLI back is a cycle)."""
    verbs = {e.imported for e in layers.edges() if e.importer == "gpuq.cli.verbs" and e.kind == "verb"}
    assert {"gpuq.cli.status", "gpuq.cli.submit", "gpuq.cli.completion", "gpuq.cli.workflow"} <= verbs


@pytest.mark.long
@pytest.mark.slow
def test_pip_install_not_editable_installs_every_subpackage(tmp_path: Path) -> None:
    """pyproject.toml finds the subpackages: a plain `pip install .` has every module, and its
    entry points run from anywhere."""
    target = tmp_path / "site"
    build = tmp_path / "src"
    shutil.copytree(
        REPO,
        build,
        ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "logs", "jobs", "state"),
    )
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(build)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    installed = {p.relative_to(target).as_posix() for p in (target / "gpuq").rglob("*.py")}
    source = {p.relative_to(REPO).as_posix() for p in layers.PACKAGE_DIR.rglob("*.py")}
    extras_tests = {s for s in source if s.startswith("gpuq/extras/") and "/tests/" in s}  # an extra's own tests
    assert extras_tests and installed == source - extras_tests
    env = {**os.environ, "PYTHONPATH": str(target)}
    for command in (["gpuq", "--help"], ["gpuq-worker", "--help"]):
        run = subprocess.run(
            [sys.executable, str(target / "bin" / command[0]), *command[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0 and "usage:" in run.stdout, run.stdout + run.stderr
        assert command[0] != "gpuq" or "simulate" in run.stdout  # an installed copy finds its extras
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pkgutil, importlib, gpuq\n"
            "for m in pkgutil.walk_packages(gpuq.__path__, 'gpuq.'): importlib.import_module(m.name)\n"
            "print(gpuq.__file__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().startswith(str(target))
    # A cron start of the installed worker while one runs leaves before loading the rest of gpuq.
    root = tmp_path / "q"
    init = subprocess.run(
        [sys.executable, str(target / "bin" / "gpuq"), "init", str(root)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert init.returncode == 0, init.stdout + init.stderr
    start = [sys.executable, str(target / "bin" / "gpuq-worker"), "--root", str(root), "--host", "box", "--fake-gpus"]
    running = subprocess.Popen([*start, "1x80GiB", "--foreground"], cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: (root / "state" / "workers" / "box.json").exists(), what="the installed worker's heartbeat")
        again = subprocess.run(
            [*start, "1x80GiB"],
            cwd=tmp_path,
            env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
            capture_output=True,
            text=True,
        )
        assert again.returncode == 0, again.stderr[-2000:]
        loaded = {line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines() if "|" in line}
        assert "gpuq.single_instance" in loaded and not {"gpuq.worker_main", "yaml", "argparse"} & loaded, loaded
    finally:
        running.terminate()
        running.wait(timeout=30)
        remove_local_dir(default_local_dir(str(root), "box"))
