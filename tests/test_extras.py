"""Extras are deletable: each folder under gpuq/extras/ removed from a copy of the checkout
leaves a core whose fast set, layer check, CLI and one end-to-end story still pass, and which
no longer offers the extra's verbs (docs/design.md, "The new shape")."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from conftest import REPO
from gpuq import hooks
from gpuq.model.config import KEYS_OF_EXTRAS
from tools import layers

pytestmark = pytest.mark.slow  # each runs the fast set again in a copy

# A value other than the default for each key only an extra reads (else: a path under the test's folder).
SET_TO = {
    "max_booked_gpu_hours": 10,
    "sample_every_s": 30,
    "container_runtime": "podman",
    "container_clients": "{podman: /usr/bin/podman}",
    "container_env": "{DOCKER_HOST: 'unix:///run/docker.sock'}",
    "allow_docker": "true",
    "gpu_sharing": "mps",
    "retry_on_oom": 3,
    "shell_idle_timeout": "2h",
    "alert_command": "'cat >/dev/null'",
    "alert_wait_s": 60,
    "alert_idle_holder_s": 60,
    "alert_gpu_temp_c": 70,
    "alert_gpu_power_w": 300,
    "alert_worker_silent_s": 60,
    "alert_short_jobs": 10,
}
EXTRAS = sorted(d.name for d in hooks.EXTRAS_DIR.iterdir() if (d / "__init__.py").exists())


def test_the_extras_are_found_by_listing_their_folder():
    assert {
        "alerts",
        "bookings",
        "containers",
        "history",
        "interactive",
        "mps",
        "notify",
        "oom",
        "reports",
        "serve",
        "sim",
        "slurm",
    } <= set(EXTRAS) and hooks.registry().broken == {}
    verbs = {"book", "unbook", "report", "eff", "simulate", "export", "run", "shell", "serve", "history"}
    assert verbs <= {v.name for v in hooks.registry().verbs}
    assert set(hooks.registry().request_kinds) == {"book", "unbook"}
    assert [r.name for r in hooks.registry().placement_rules] == ["bookings"]
    assert [(v.name, v.after) for v in hooks.registry().views] == [
        ("alerts", "HOSTS"),
        ("bookings", "PENDING"),
        ("sessions", "RUNNING"),
    ]
    assert hooks.registry().backends == {"slurm": "extras.slurm.bridge:BridgeWorker"}
    assert [(p.name, p.start) for p in hooks.registry().publishers] == [
        ("alerts", "extras.alerts.watch:start"),
        ("notify", "extras.notify.watch:start"),
        ("metrics", "extras.reports.metrics:start"),
        ("samples", "extras.reports.samples:start"),
    ]
    assert (
        set(hooks.registry().spec_fields)
        == {"container", "retry_on_oom", "attach", "notify"}
        == set(hooks.FIELDS_OF_EXTRAS)
    )
    assert [(r.name, r.decide) for r in hooks.registry().retry_rules] == [("oom", "extras.oom.rule:decide")]
    assert [w.wrap for w in hooks.registry().launch_wrappers] == [
        "extras.containers.launching:wrap",
        "extras.interactive.wrapper:wrap",
    ]
    assert hooks.registry().member_programs == {"notify": "extras.notify.deliver"}
    assert [o.start for o in hooks.registry().offers] == ["extras.containers.launching:offers"]


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "checkout"
    ignore = shutil.ignore_patterns(
        ".git", "__pycache__", "*.egg-info", "build", "logs", "jobs", "state", ".ruff_cache"
    )
    shutil.copytree(REPO, copy, ignore=ignore)
    return copy


def test_a_broken_extra_leaves_gpuq_working_and_says_which_and_how_to_fix(tmp_path: Path):
    copy = _copy(tmp_path)
    (copy / "gpuq" / "extras" / "broken").mkdir()
    (copy / "gpuq" / "extras" / "broken" / "__init__.py").write_text("raise ImportError('half installed')\n")
    root = tmp_path / "root"
    made = subprocess.run([sys.executable, "gpuq.py", "init", str(root)], cwd=copy, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    status = subprocess.run(
        [sys.executable, "gpuq.py", "--root", str(root), "status"], cwd=copy, capture_output=True, text=True
    )
    assert status.returncode == 0 and "HOSTS" in status.stdout.upper(), status.stdout + status.stderr
    assert "gpuq/extras/broken could not be loaded (ImportError: half installed)" in status.stderr
    assert "delete the folder gpuq/extras/broken" in status.stderr
    doctor = subprocess.run(
        [sys.executable, "gpuq.py", "--root", str(root), "doctor", "--json"], cwd=copy, capture_output=True, text=True
    )
    extras = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "extras"]
    assert [f["level"] for f in extras] == ["warn"] and "half installed" in extras[0]["message"], doctor.stdout


def test_an_extras_verb_named_as_one_of_gpuqs_own_is_left_out_whichever_it_is(tmp_path: Path):
    """An extra may not take a core verb's name: it is left out with a word on stderr. Extras'
    verbs were added before `demo` and the hidden verbs, so one named `demo` was not seen to
    clash, and argparse refused the whole CLI."""
    copy = _copy(tmp_path)
    (copy / "gpuq" / "extras" / "clash").mkdir()
    (copy / "gpuq" / "extras" / "clash" / "__init__.py").write_text(
        "from gpuq.hooks import Verb\n\n\n"
        "def register(registry):\n"
        "    for name in ('status', 'demo', 'mine'):\n"
        "        registry.verbs.append(Verb(name, 'an extra\\'s', lambda p: None, 'extras.clash:run'))\n"
    )
    run = _runner(copy)
    usage = run("gpuq.py", "--help")
    assert usage.returncode == 0, usage.stderr
    for name in ("status", "demo"):
        assert f"an extra's verb {name!r} (extras.clash:run) is one of gpuq's own: left out" in usage.stderr
    assert "    mine " in usage.stdout and "an extra's" in usage.stdout, usage.stdout
    demo = run("gpuq.py", "demo", "--help")  # still the core's own
    assert demo.returncode == 0 and "--quick" in demo.stdout, demo.stdout + demo.stderr


def _runner(copy: Path):
    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=copy, capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def local() -> Iterator[Path]:
    """Where the copy's workers keep their boxes' local directories: a short path (they may
    hold sockets), removed after the test; never the default under /run/gpuq, which outlives it."""
    base = Path(tempfile.mkdtemp(prefix="gq-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _worker_once(run, root: Path, local: Path) -> subprocess.CompletedProcess:
    """One pass of box a's worker on the root, its local directory under `local`."""
    config = root / "config.yaml"
    kept = [line for line in config.read_text().splitlines() if not line.startswith("local_dir:")]
    config.write_text("\n".join([*kept, f"local_dir: {json.dumps(str(local / '{host}'))}"]) + "\n")
    return run("worker.py", "--root", str(root), "--host", "a", "--fake-gpus", "1x16GiB", "--once")


@pytest.mark.parametrize("extra", EXTRAS)
def test_deleting_an_extra_leaves_a_core_that_imports_and_no_longer_offers_it(tmp_path: Path, extra: str, local: Path):
    """Each extra deleted in turn: the layer check passes on what is left (run in this process,
    its parses shared with the other copies'), every extra left still loads (one that imported
    the deleted one would be said broken), the CLI no longer lists its verbs, a worker
    configured for its backend refuses clearly, one whose config sets a key only the extra
    reads runs and says once that the key goes unused, and a spec that sets a field only the
    extra gives is refused, naming the field and the fix (its `gpuq submit` option is gone).
    The core's tests run in the next test, with every extra deleted at once (each in turn
    would run them once per extra, for what one run shows: the core needs none of them)."""
    copy = _copy(tmp_path)
    verbs = {v.name for v in hooks.registry().verbs if v.handler.startswith(f"extras.{extra}.")}
    shutil.rmtree(copy / "gpuq" / "extras" / extra)
    run = _runner(copy)
    assert layers.problems(copy / "gpuq") == []
    usage = run("gpuq.py", "--help")
    assert usage.returncode == 0 and "status" in usage.stdout and "could not be loaded" not in usage.stderr, usage
    assert not [v for v in verbs if f"    {v} " in usage.stdout], usage.stdout
    for slurm in [v.slurm for v in hooks.registry().verbs if v.slurm and v.name in verbs]:  # `gpuq srun` by habit
        habit = run("gpuq.py", slurm)
        assert habit.returncode == 2 and f"Slurm's {slurm} " in habit.stderr and f"extras/{extra}" in habit.stderr
    backends = [name for name, spec in hooks.registry().backends.items() if spec.startswith(f"extras.{extra}.")]
    for backend in backends:  # a config that asks for the deleted extra's worker: a clear refusal
        root = tmp_path / f"root-{backend}"
        assert run("gpuq.py", "init", str(root)).returncode == 0
        (root / "config.yaml").write_text(f"backend: {backend}\n")
        refused = _worker_once(run, root, local)
        assert refused.returncode == 2 and f"gpuq/extras/{extra} is not there" in refused.stderr, refused.stderr
    keys = [key for key, reader in KEYS_OF_EXTRAS.items() if reader == extra]
    if keys:  # each set to a value other than its default (metrics_dir: where the metrics file would go)
        root = tmp_path / "root-keys"
        assert run("gpuq.py", "init", str(root)).returncode == 0
        (root / "config.yaml").write_text("".join(f"{key}: {SET_TO.get(key, tmp_path / key)}\n" for key in keys))
        ran = _worker_once(run, root, local)
        assert ran.returncode == 0, ran.stderr
        for key in keys:
            assert ran.stderr.count(f"sets {key}, which only the {extra} extra reads") == 1, ran.stderr
    _its_state_is_ignored_and_said_once(run, tmp_path, extra, local)
    _refuses_its_spec_fields(tmp_path, run, extra)


def _its_state_is_ignored_and_said_once(run, tmp_path: Path, extra: str, local: Path) -> None:
    """Files under state/ that only the deleted extra reads (STATE_OF_EXTRAS: bookings): a
    worker and `status` go on as if they were not there, and `doctor` warns once."""
    for name in [name for name, reader in hooks.STATE_OF_EXTRAS.items() if reader == extra]:
        root = tmp_path / f"root-state-{name}"
        assert run("gpuq.py", "init", str(root)).returncode == 0
        (root / "state" / name / "left.json").write_text("{}")
        ran = _worker_once(run, root, local)
        assert ran.returncode == 0, ran.stderr
        status = run("gpuq.py", "--root", str(root), "status")
        assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
        doctor = json.loads(run("gpuq.py", "--root", str(root), "doctor", "--json").stdout)
        said = [f for f in doctor["findings"] if f"state/{name} holds 1 file(s)" in f["message"]]
        assert [f["level"] for f in said] == ["warn"] and f"only the {extra} extra reads" in said[0]["message"]


def _refuses_its_spec_fields(tmp_path: Path, run, extra: str) -> None:
    """A spec with a field of the deleted extra is refused by `gpuq submit` (and so by the
    worker, which checks a spec the same way), naming the field, the extra and the fix."""
    fields = {n: f for n, f in hooks.registry().spec_fields.items() if f.parse.startswith(f"extras.{extra}.")}
    if not fields:
        return
    root = tmp_path / "root-fields"
    assert run("gpuq.py", "init", str(root)).returncode == 0
    for name, spec_field in fields.items():
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(f"command: 'true'\n{name}: {spec_field.example}\n")
        refused = run("gpuq.py", "--root", str(root), "submit", "--spec", str(spec))
        want = f"field '{name}': needs the {extra} extra, which this installation does not have"
        assert refused.returncode == 2 and want in refused.stderr, refused.stderr
        assert f"restore gpuq/extras/{extra}" in refused.stderr and "Nothing was written" in refused.stderr
        assert f"  --{name} " not in run("gpuq.py", "submit", "--help").stdout
    assert list((root / "jobs").iterdir()) == []


STORY = "sixty_jobs or submit_show_logs_and_cancel or cron_start or second_worker_start or without_gpus"


@pytest.mark.long
def test_the_core_alone_passes_its_fast_set_and_an_end_to_end_story(tmp_path: Path):
    """Every extra deleted: the core's fast set and one end-to-end story through real workers."""
    copy = _copy(tmp_path)
    for extra in EXTRAS:
        shutil.rmtree(copy / "gpuq" / "extras" / extra)
    run = _runner(copy)
    assert layers.problems(copy / "gpuq") == []
    # The story, not the whole file: jobs on three boxes exactly once, the CLI's round trip, a
    # cron start and a second start, a box without GPUs. The file's other tests are about one
    # verb's options or messages, which need no extra either; the suite runs them whole. It
    # runs beside the fast set: its workers mostly wait between passes, the fast set computes.
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"]
    with open(tmp_path / "story.out", "w+") as out:
        story = subprocess.Popen(
            [*pytest, "--basetemp", str(tmp_path / "story"), "tests/test_e2e_story.py", "-k", STORY],
            cwd=copy,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            # In one process: two (README's -n 2) cost each its own start and collection, about
            # 7 s of CPU, in a suite that runs this beside its other tests anyway.
            fast = run(*pytest[1:], "--basetemp", str(tmp_path / "fast"), "-m", "not slow")
            assert fast.returncode == 0, fast.stdout[-3000:] + fast.stderr[-2000:]
            assert story.wait(timeout=600) == 0, (tmp_path / "story.out").read_text()[-5000:]
        finally:
            if story.poll() is None:  # the fast set failed first: Ctrl-C, so that its teardown stops its workers
                story.send_signal(signal.SIGINT)
                try:
                    story.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    story.kill()
                    story.wait()
