"""gpuq/hooks.py: extras are found by listing their folder, and a broken one is left out with
why and the fix, never taking the core down with it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from harness import PassWorker

import gpuq.extras
from gpuq import hooks
from gpuq.cli.doctor import check_extras
from gpuq.model.config import Config
from gpuq.spool.applying import apply_request
from gpuq.spool.inbox import RequestError, parse_request
from gpuq.spool.layout import Layout
from gpuq.views.render import status_text
from gpuq.views.status import status

GOOD = """
from gpuq.hooks import Verb
def register(registry):
    registry.verbs.append(Verb("hello", "say hello", lambda parser: None, "extras.good:run"))
    registry.backends["elsewhere"] = "extras.good:Worker"
"""


# Publishers (hooks.BoxPublisher): one that records what each publication hands it, one that
# cannot start, one that fails each time it is called.
PUBLISHERS = """
from gpuq.hooks import BoxPublisher
SEEN = []
def start(layout, config, host):
    def publish(published):
        SEEN.append((host, published.mono, [r.id for r in published.state.running], published.finished.counts()))
    return publish
def start_broken(layout, config, host):
    raise RuntimeError("no start")
def start_failing(layout, config, host):
    def publish(published):
        raise OSError("disk full")
    return publish
LAST = []
def start_last(layout, config, host):
    def publish(published):
        LAST.append(published.last)
    return publish
def register(registry):
    registry.publishers.append(BoxPublisher("seen", "extras.pub:start"))
    registry.publishers.append(BoxPublisher("never", "extras.pub:start_broken"))
    registry.publishers.append(BoxPublisher("failing", "extras.pub:start_failing"))
    registry.publishers.append(BoxPublisher("last", "extras.pub:start_last", last_word=True))
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
    # Its fix is to take the write bit away (a checkout copied with a group's: a Slurm user's finding).
    assert f"chmod -R go-w {tmp_path / 'writable'}" in hooks.fix("writable")
    assert "reinstall gpuq" in hooks.fix("exits")


def test_doctor_reports_a_broken_extra_and_a_backend_no_extra_gives(extras_in, tmp_path_factory):
    extras_in("raises", "raise ImportError('half installed')\n")
    layout = Layout(tmp_path_factory.mktemp("queue"))
    findings = check_extras(layout, Config(backend="slurm"))
    assert [(f.level, f.check) for f in findings] == [("warn", "extras"), ("fail", "extras")]
    assert "half installed" in findings[0].message and "delete the folder gpuq/extras/raises" in findings[0].fix
    assert "every worker refuses to start" in findings[1].message and "backend: local" in findings[1].fix
    assert [(f.level, f.message) for f in check_extras(layout, Config())][:1] == [("warn", findings[0].message)]


def test_an_extras_publisher_gets_each_publication_of_the_box_and_one_that_fails_stops_nothing(
    extras_in, tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
):
    extras_in("pub", PUBLISHERS)
    extras_in("pub_copy", PUBLISHERS)  # the same publishers' names again: left out whole
    assert "another extra already gives failing, last, never, seen" in hooks.registry().broken["pub_copy"]
    caplog.set_level(logging.INFO, logger="gpuq.worker")
    box = PassWorker(tmp_path_factory.mktemp("queue") / "root", fake_gpus="1x80GiB")
    assert "publisher never (extras.pub:start_broken) could not start" in caplog.text and "no start" in caplog.text
    seen, last = sys.modules["gpuq.extras.pub"].SEEN, sys.modules["gpuq.extras.pub"].LAST
    box.layout.spec_cache("a").mkdir()  # the spec cache cannot be written: the extras still publish
    box.drop("one.yaml", "command: 'true'\ngpus: 1\n")
    box.run_pass()
    box.run_pass()  # the clock stood still: the box does not publish again, nor do its publishers
    assert [(host, running) for host, _, running, _ in seen] == [("a", ["one"])]
    box.finish("one")
    box.run_pass(after_s=1)
    host, mono, running, finished = seen[-1]
    assert len(seen) == 2 and mono == box.clock.mono() and running == [] and finished == {"done": 1}
    assert caplog.text.count("the extras' publisher failing failed") == 2 and "disk full" in caplog.text
    assert box.heartbeat()["host"] == "a"  # the failing publisher took nothing of the heartbeat
    assert caplog.text.count("cannot write " + str(box.layout.spec_cache("a"))) == 1
    # As the worker stops, only a publisher that asks for the last word is called again.
    assert last == [False, False]
    box.worker.end()
    assert last == [False, False, True] and len(seen) == 2


def test_a_key_only_an_absent_extra_reads_is_said_once_by_the_worker_and_by_doctor(
    extras_in, tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
):
    extras_in("good", GOOD)  # no reports extra among them
    caplog.set_level(logging.WARNING, logger="gpuq.worker")
    PassWorker(tmp_path_factory.mktemp("queue") / "root")
    assert "metrics_dir" not in caplog.text  # unset: the default file nobody asked for, not a word
    box = PassWorker(tmp_path_factory.mktemp("queue") / "root", metrics_dir="/var/lib/prometheus/{host}")
    for _ in range(3):
        box.run_pass(after_s=1)
    said = "config.yaml sets metrics_dir, which only the reports extra reads, and gpuq/extras/reports is not there"
    assert caplog.text.count(said) == 1 and "remove metrics_dir from config.yaml" in caplog.text
    assert not list(box.layout.state.glob("metrics/*.prom"))  # and the worker went on, writing none
    (finding,) = [f for f in check_extras(box.layout, Config(metrics_dir="/m")) if "metrics_dir" in f.message]
    assert finding.level == "warn" and said in finding.message and "restore gpuq/extras/reports" in finding.fix


# An extra with the bookings extra's kinds of hooks, written here: the core asks for each
# without naming an extra (a placement rule's values reach the plan, a section reaches status,
# a request kind is let into the inbox and applied).
ASIDE = """
from gpuq.hooks import PlacementRule, StatusSection
from gpuq.model.jobs import SetAside
def set_aside(layout, now):
    return [SetAside("a", (0,), now - 1, now + 3600, "nobody")]
def read(layout, now, live_hosts):
    return {"said": "hello"}
def render(part):
    return ["", "ASIDE " + part["said"]]
def apply(layout, config, host, actor, request):
    return [(True, "aside by " + actor.name)]
def register(registry):
    registry.placement_rules.append(PlacementRule("aside", "extras.aside:set_aside"))
    registry.views.append(StatusSection("aside", "ASIDE", "extras.aside:read", "extras.aside:render"))
    registry.request_kinds["aside"] = "extras.aside:apply"
"""


def test_an_extras_placement_rule_section_and_request_kind_reach_the_core(extras_in, tmp_path_factory):
    extras_in("aside", ASIDE)
    extras_in("aside_copy", ASIDE)  # the same names again: left out whole
    assert "another extra already gives aside" in hooks.registry().broken["aside_copy"]
    box = PassWorker(tmp_path_factory.mktemp("queue") / "root", fake_gpus="1x80GiB")
    box.drop("mine.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 1GiB\n")
    for _ in range(3):
        box.run_pass(after_s=1)
    assert box.launched() == []  # the GPU is set aside for nobody
    view = status(box.layout, box.worker.config, now=box.clock.wall())
    assert view["pending"][0]["reason"].startswith("GPU a:0 booked for nobody until ")
    assert view["aside"] == {"said": "hello"} and "\nASIDE hello\n" in status_text(view)
    request = parse_request(b'{"verb": "aside"}', "r-1-0000000000000000.json", 0)
    assert apply_request(box.layout, box.worker.config, "a", request).outcomes == ((True, "aside by root"),)


def test_without_the_extra_its_request_kind_is_refused_and_its_files_are_ignored_said_once(extras_in, tmp_path_factory):
    extras_in("good", GOOD)  # no bookings extra among them
    with pytest.raises(RequestError, match="no known verb"):
        parse_request(b'{"verb": "book", "args": {}}', "r-1-0000000000000000.json", 0)
    layout = Layout(tmp_path_factory.mktemp("queue"))
    layout.ensure()
    assert not [f for f in check_extras(layout, Config()) if "state/bookings" in f.message]  # empty: not a word
    (layout.state / "bookings" / "bk-1.json").write_text("{}")
    (finding,) = [f for f in check_extras(layout, Config()) if "state/bookings" in f.message]
    assert finding.level == "warn" and "gpuq/extras/bookings is not there" in finding.message
    assert "they are ignored" in finding.message and "restore gpuq/extras/bookings" in finding.fix


# A spec field and a launch wrapper (hooks.SpecField, hooks.LaunchWrapper): `nice` runs the
# command under nice(1) at the level the spec gives.
NICE = """
from gpuq.hooks import LaunchWrapper, SpecField
from gpuq.run.launch import Wrapped
def parse(value, fail):
    if not isinstance(value, int) or not 0 <= value <= 19:
        raise fail("nice", f"{value!r} is not a level", "give 0 to 19")
    return value
def wrap(start):
    level = start.spec.extras["nice"]
    argv = ["nice", "-n", str(level), *start.argv]
    return Wrapped(argv, {**start.base_env, **start.variables}, "nice", str(level), start.variables, "the host's")
def register(registry):
    registry.spec_fields["nice"] = SpecField("nice", "0-19", "none", "A nice level.", "10", "extras.nice:parse")
    registry.launch_wrappers.append(LaunchWrapper("nice", "nice", "extras.nice:wrap"))
"""


def test_an_extras_spec_field_is_checked_kept_and_wraps_the_start_and_one_given_twice_is_left_out(
    extras_in, tmp_path: Path
):
    from gpuq.model.errors import SpecError
    from gpuq.model.record import Record
    from gpuq.model.spec import JobSpec, parse_spec_text
    from gpuq.model.states import State
    from gpuq.run.joblocal import Runtime
    from gpuq.run.launch import CannotStart, build_launch
    from gpuq.spool.layout import Layout
    from gpuq.views.preview import what_the_job_sees

    extras_in("nice", NICE)
    extras_in("nicer", NICE.replace("extras.nice:", "extras.nicer:"))  # the same field again
    got = hooks.registry()
    assert list(got.spec_fields) == ["nice"] and "another extra already gives nice" in got.broken["nicer"]
    spec = parse_spec_text(b"command: [train]\nnice: 10\n", "jobs/j.yaml")
    assert spec.extras == {"nice": 10} and JobSpec.from_json(spec.to_json()) == spec
    with pytest.raises(SpecError, match="field 'nice': 99 is not a level. Fix: give 0 to 19"):
        parse_spec_text(b"command: x\nnice: 99\n", "jobs/j.yaml")
    record = Record(id="j", state=State.RUNNING, spec=spec.to_json(), gpus=[0])
    rt = Runtime(Layout(tmp_path), "a", "boot", tmp_path / "local", 1.0, 10.0, {})
    launch = build_launch(rt, record, spec, None)
    assert launch.argv == ["nice", "-n", "10", "train"] and launch.wrapped is not None
    # `container` is a field of an extra that is not here: refused with the fix, and a spec
    # taken in before the extra went cannot start.
    with pytest.raises(SpecError, match="field 'container': needs the containers extra, which this installation"):
        parse_spec_text(b"command: x\ncontainer: img\n", "jobs/j.yaml")
    old = JobSpec.from_json({**spec.to_json(), "container": {"image": "img"}})
    with pytest.raises(CannotStart, match="container: needs the containers extra.*Fix: restore gpuq/extras/containers"):
        build_launch(rt, record, old, None)
    sees = what_the_job_sees(Layout(tmp_path), Config(), "j", old, record, None)  # `gpuq show` says why
    assert sees["command_line"].startswith("(cannot start: container: needs the containers extra"), sees


OFFERS = """
from gpuq.hooks import HostOffers
class Probe:
    def __init__(self, config, team):
        self.found, self.problems, self.calls = {}, {}, 0
    def refresh(self, now):
        self.calls += 1
        if self.calls == 2:
            raise OSError("the daemon's socket went away")
        self.found, self.problems = {"tool": "1.0"}, {"other": "not installed"}
def broken(config, team):
    raise RuntimeError("no probe")
def register(registry):
    registry.offers.append(HostOffers("tool", "extras.offers:Probe"))
    registry.offers.append(HostOffers("never", "extras.offers:broken"))
"""


def test_what_the_extras_probes_offer_is_published_and_a_probe_that_fails_stops_nothing(extras_in, caplog):
    from gpuq.worker.offers import Offers, start_offers

    extras_in("offers", OFFERS)
    offers = Offers(start_offers(Config(), team=False))
    assert "the extras' probe never (extras.offers:broken) could not start" in caplog.text
    offers.refresh(0.0)
    assert offers.found == {"tool": "1.0"} and offers.problems == {"other": "not installed"}
    offers.refresh(1.0)  # it fails: what it found last stands, and the pass goes on
    assert offers.found == {"tool": "1.0"} and "the extras' probe Probe failed" in caplog.text


SHARING = """
from gpuq.hooks import GpuSharing
SETTLED = []
class Sharer:
    def __init__(self, local_dir, root_part, config, report_once):
        self.local_dir, self.root_part = local_dir, root_part
    def client(self, spec, gpu):
        return (f"/pipes/{gpu.index}", 40) if spec.gpu_mem_mib else None
    def settle(self, in_use, now, final):
        SETTLED.append((sorted(in_use), final))
    def state(self):
        return {"problem": None, "daemons": [], "dir": str(self.local_dir) + "-x"}
def broken(local_dir, root_part, config, report_once):
    raise RuntimeError("no daemons here")
def register(registry):
    registry.gpu_sharing.append(GpuSharing("never", "extras.share:broken"))
    registry.gpu_sharing.append(GpuSharing("x", "extras.share:Sharer"))
"""


def test_an_extras_gpu_sharing_makes_jobs_its_clients_settles_each_pass_and_one_that_cannot_start_stops_nothing(
    extras_in, tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
):
    extras_in("share", SHARING)
    box = PassWorker(tmp_path_factory.mktemp("queue") / "root", fake_gpus="2x80GiB")
    assert "the extras' GPU sharing never (extras.share:broken) could not start" in caplog.text
    box.drop("shared.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 10GiB\n")
    box.drop("whole.yaml", "command: 'true'\ngpus: 1\n")
    box.run_pass()
    box.run_pass(after_s=6)
    launched = [(r.mps_pipe, r.mps_compute_pct) for r in box.spawner.launched]
    assert set(launched) == {(None, None), ("/pipes/0", 40)}, launched
    settled = sys.modules["gpuq.extras.share"].SETTLED
    assert settled[-1] == ([0], False)  # the client's GPU is in use
    assert box.heartbeat()["mps"]["dir"].endswith("-x")
    box.worker.end()
    assert settled[-1] == ([0], True)


CHECKS = """
from gpuq.cli.doctor import Finding, fix_on
from gpuq.hooks import DoctorCheck
def says(host, hb, config, owner):
    return [Finding("ok", "thing", f"{host}: {len(hb['gpus'])} GPU(s)", fix_on(host, owner, "nothing"))]
def fails(host, hb, config, owner):
    raise KeyError("mps")
def register(registry):
    registry.doctor_checks.append(DoctorCheck("says", "extras.checks:says"))
    registry.doctor_checks.append(DoctorCheck("fails", "extras.checks:fails"))
"""


def test_an_extras_doctor_check_says_its_part_of_each_live_box_and_one_that_fails_is_a_warning(
    extras_in, tmp_path_factory: pytest.TempPathFactory
):
    from gpuq.cli.doctor import check_hosts

    extras_in("checks", CHECKS)
    box = PassWorker(tmp_path_factory.mktemp("queue") / "root", fake_gpus="2x80GiB")
    box.run_pass()
    found = {f.check: f for f in check_hosts(box.layout, box.worker.config, box.clock.wall())}
    assert found["thing"].level == "ok" and found["thing"].message == "a: 2 GPU(s)"
    assert (
        found["extras"].level == "warn"
        and "check fails (extras.checks:fails) failed: KeyError" in found["extras"].message
    )
