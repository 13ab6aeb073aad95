"""`gpuq report`: the figures against a hand computation on a small event and samples log,
then through the real worker and CLI (JSON, text, --by, --html, and the error without
matplotlib)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import PY, REPO, wait_until
from gpuq.extras.reports.report import Pending, _open_run, build, percentile

FAKE_USE = f"{PY} {REPO / 'gpuq.py'} fake-use"


def ev(t, job, frm, to, **kw) -> dict:
    return {"t": t, "by": kw.pop("by", "h1"), "job": job, "from": frm, "to": to, **kw}


# The window is [0, 600): 60 slices of 10 s. Times are seconds.
EVENTS = [
    # a (alice): queued 105, recorded running at 110, ran 112..410 on h1 GPUs 0,1, done.
    ev(110, "a", "pending", "running", user="alice", queued_at=105, host="h1", gpus=[0, 1], started_at=None),
    ev(410, "a", "running", "done", user="alice", queued_at=105, host="h1", gpus=[0, 1], started_at=112, ended_at=410),
    # b (bob): queued 100, ran 205..300 on h1:2, preempted, back in the queue until 350,
    # ran 352..499, failed.
    ev(200, "b", "pending", "running", user="bob", queued_at=100, host="h1", gpus=[2]),
    ev(
        300,
        "b",
        "running",
        "pending",
        user="bob",
        queued_at=100,
        host="h1",
        gpus=[2],
        started_at=205,
        reason="preempted: for job x",
    ),
    ev(350, "b", "pending", "running", user="bob", queued_at=100, host="h1", gpus=[2], attempt=2),
    ev(500, "b", "running", "failed", user="bob", queued_at=100, host="h1", gpus=[2], started_at=352, ended_at=499),
    # c (alice): queued 50, cancelled while pending at 150.
    ev(150, "c", "pending", "cancelled", user="alice", queued_at=50, by="h2"),
    # g (bob): queued 500, held 510..530, still waiting at the end.
    ev(510, "g", "pending", "held", user="bob", queued_at=500, by="h2"),
    ev(530, "g", "held", "pending", user="bob", queued_at=500, by="h2"),
    # e (bob): started before the window on h2:3 and still running.
    ev(-50, "e", "pending", "running", user="bob", queued_at=-100, host="h2", gpus=[3], by="h2"),
    ev(-40, "e", "running", "running", reason="warning: over its gpu_mem", by="h2"),
    # f (alice): queued 400, ran 421..590 on h2:0, past its time limit.
    ev(420, "f", "pending", "running", user="alice", queued_at=400, host="h2", gpus=[0], by="h2"),
    ev(
        590,
        "f",
        "running",
        "timeout",
        user="alice",
        queued_at=400,
        host="h2",
        gpus=[0],
        started_at=421,
        ended_at=590,
        by="h2",
    ),
]
SAMPLES = [
    {
        "t": -10,
        "s": 60,
        "host": "h1",
        "gpus": [{"i": 0, "util": 99, "held_s": 60, "idle_held_s": 60, "jobs": ["x"]}],
    },  # before the window
    {"t": 60, "s": 60, "host": "h1", "gpus": [{"i": 0, "util": 50, "held_s": 0, "idle_held_s": 0, "jobs": []}]},
    {
        "t": 180,
        "s": 60,
        "host": "h1",
        "gpus": [
            {"i": 0, "util": 0, "held_s": 60, "idle_held_s": 60, "jobs": ["a"]},
            {"i": 2, "util": 2, "held_s": 60, "idle_held_s": 60, "jobs": ["a", "b"]},
        ],
    },
]
PENDING = [Pending("d", "carol", 550), Pending("g", "bob", 500)]


def test_figures_match_a_hand_computation():
    r = build(EVENTS, SAMPLES, PENDING, since=0, until=600).to_json()
    total = r["total"]
    # GPU-seconds: a 2×298 + b 95 + 147 + e 600 (the window) + f 169 = 1607
    assert total["gpu_hours"] == round(1607 / 3600, 4)
    # held idle: 60 s on h1:0 + 60 s on h1:2; the sample before the window does not count
    assert total["idle_held_gpu_hours"] == round(120 / 3600, 4)
    # waits (first start − queued): a 5, b 100, f 20; nearest rank over [5, 20, 100]
    assert total["jobs_started"] == 3
    assert total["wait_s"] == {"p50": 20, "p90": 100, "p99": 100, "max": 100}
    assert total["ended"] == {"done": 1, "failed": 1, "timeout": 1, "lost": 0, "cancelled": 1, "rejected": 0}
    assert total["preemptions"] == 1
    assert r["bucket_s"] == 10 and len(r["queue_length"]["max"]) == 60
    q_mean, q_max = r["queue_length"]["mean"], r["queue_length"]["max"]
    # [100, 110): c and b all along, a from 105 -> mean 2.5, max 3
    assert (q_mean[10], q_max[10]) == (2.5, 3)
    assert (q_mean[5], q_max[5], q_mean[11], q_mean[15], q_mean[30], q_mean[40]) == (1, 1, 2, 1, 1, 1)
    assert (q_mean[0], q_max[0], q_mean[35], q_max[45]) == (0, 0, 0, 0)
    # g waits 500..510, is held until 530, then waits again; d joins at 550
    assert (q_mean[50], q_mean[51], q_mean[52], q_mean[53], q_mean[55]) == (1, 0, 0, 1, 2)
    assert r["gpus"]["h1:0"] == {
        "held_hours": round(60 / 3600, 4),
        "idle_held_hours": round(60 / 3600, 4),
        "mean_util_pct": 25.0,
        "util_pct": [None] * 3 + [50.0] + [None] * 11 + [0.0] + [None] * 44,
    }
    assert r["gpus"]["h1:2"]["mean_util_pct"] == 2.0
    assert r["pending_now"] == 2 and r["longest_pending_s"] == 100


def test_by_user_host_and_gpu_split_the_same_total():
    by_user = build(EVENTS, SAMPLES, PENDING, 0, 600, by="user").to_json()["groups"]
    assert set(by_user) == {"alice", "bob"}
    assert by_user["alice"]["gpu_hours"] == round((596 + 169) / 3600, 4)
    assert by_user["bob"]["gpu_hours"] == round((95 + 147 + 600) / 3600, 4)
    # h1:2's idle minute was shared by a and b: half each; h1:0's was a's alone
    assert by_user["alice"]["idle_held_gpu_hours"] == round(90 / 3600, 4)
    assert by_user["bob"]["idle_held_gpu_hours"] == round(30 / 3600, 4)
    assert by_user["alice"]["wait_s"]["max"] == 20 and by_user["bob"]["wait_s"]["p50"] == 100
    assert by_user["alice"]["ended"]["cancelled"] == 1 and by_user["bob"]["preemptions"] == 1
    by_gpu = build(EVENTS, SAMPLES, PENDING, 0, 600, by="gpu").to_json()["groups"]
    assert {k: round(v["gpu_hours"] * 3600) for k, v in by_gpu.items() if v["gpu_hours"]} == {
        "h1:0": 298,
        "h1:1": 298,
        "h1:2": 242,
        "h2:0": 169,
        "h2:3": 600,
    }
    by_host = build(EVENTS, SAMPLES, PENDING, 0, 600, by="host").to_json()["groups"]
    assert by_host["h1"]["ended"]["failed"] == 1 and by_host["h2"]["ended"]["timeout"] == 1


def test_a_narrower_window_cuts_runs_at_its_edges():
    r = build(EVENTS, SAMPLES, PENDING, since=300, until=400).to_json()["total"]
    # a 2×100; b's first run ends at the edge (0), its second 352..499 counts 352..400 = 48;
    # e, still running, 100; f 0 (started at 421)
    assert round(r["gpu_hours"] * 3600) == 200 + 48 + 100
    assert r["jobs_started"] == 0 and r["preemptions"] == 1  # the preemption at 300 is inside


def test_percentile_is_nearest_rank():
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 51) == 3
    assert percentile([7], 99) == 7 and percentile([], 50) is None


def test_sample_log_weights_each_reading_by_its_time_and_caps_gaps(tmp_path):
    from gpuq.extras.reports.samples import SampleLog, read_samples
    from gpuq.model.gpu import GpuSnapshot
    from gpuq.model.record import Record
    from gpuq.model.states import State
    from gpuq.spool.layout import Layout

    layout = Layout(tmp_path)
    log = SampleLog(layout, "h", every_s=6, idle_util_pct=5, max_gap_s=3)
    job = Record(id="j", state=State.RUNNING, spec={}, gpus=[0])
    gpu = lambda util, used: [GpuSnapshot(0, "GPU-0", "fake", 1000, used, util)]  # noqa: E731
    log.observe(gpu(90, 100), [], now=1000)  # the first reading covers nothing
    log.observe(gpu(90, 100), [], now=1002)  # 2 s at 90%, no job
    log.observe(gpu(0, 500), [job], now=1003)  # 1 s held at 0%: held idle
    log.observe(gpu(60, 500), [job], now=1013)  # a 10 s gap counts as 3 s (max_gap_s), at 60%
    [line] = list(read_samples(layout, since=0))
    assert (line["t"], line["s"], line["host"]) == (1013, 6, "h")
    assert line["gpus"] == [
        {
            "i": 0,
            "util": round((90 * 2 + 0 * 1 + 60 * 3) / 6, 2),
            "mem": round((100 * 2 + 500 * 4) / 6),
            "total": 1000,
            "held_s": 4,
            "idle_held_s": 1,
            "jobs": ["j"],
            "idle_by_job": {"j": 1},
        }
    ]
    assert list(read_samples(layout, since=1013)) == []


def test_the_samples_publisher_ends_its_line_with_the_worker_s_last_publication(tmp_path):
    """The worker hands the samples what it publishes with its heartbeat; a line is written
    every sample_every_s, and the worker's last publication (it is stopping) writes the part
    it had, so that a short run still leaves its figures; a run that covered no time (a
    `--once` worker's one pass) leaves no line."""
    from gpuq.extras.reports.samples import read_samples, start
    from gpuq.model.config import Config
    from gpuq.model.gpu import GpuSnapshot
    from gpuq.spool.layout import Layout
    from gpuq.worker.publishing import BoxState, Published

    layout = Layout(tmp_path)
    publish = start(layout, Config(sample_every_s=60), "h")
    state = BoxState([GpuSnapshot(0, "GPU-0", "fake", 1000, 100, 40)], [], {}, {}, set(), {}, {}, None, {}, {}, None)

    def published(wall: float, last: bool = False) -> Published:
        return Published("h", state, wall, wall, None, None, last=last)  # type: ignore[arg-type]

    publish(published(1000))
    publish(published(1001))
    assert list(read_samples(layout, since=0)) == []  # 1 s of 60: nothing written yet
    publish(published(1002, last=True))
    [line] = list(read_samples(layout, since=0))
    assert (line["t"], line["s"], line["gpus"][0]["util"]) == (1002, 1, 40)
    once = start(layout, Config(sample_every_s=60), "h")  # one pass, then the last word
    once(published(2000))
    once(published(2000.003, last=True))
    assert len(list(read_samples(layout, since=0))) == 1


def test_a_job_is_charged_from_its_claim_and_only_its_own_idle_time(tmp_path):
    """A job claimed just before a reading held its GPU for that moment, not for the whole
    gap since the reading before; jobs on a GPU at once split its idle time; a short job
    beside a long idle one is charged its own seconds, not half of the line's."""
    from gpuq.extras.reports.samples import SampleLog, read_samples
    from gpuq.model.gpu import GpuSnapshot
    from gpuq.model.record import Record
    from gpuq.model.states import State
    from gpuq.spool.layout import Layout

    layout = Layout(tmp_path)
    log = SampleLog(layout, "h", every_s=100, idle_util_pct=5, max_gap_s=10)
    idle = [GpuSnapshot(0, "GPU-0", "fake", 1000, 500, 0)]
    long = Record(id="long", state=State.RUNNING, spec={}, gpus=[0], claimed_at=990.0)
    short = Record(id="short", state=State.RUNNING, spec={}, gpus=[0], claimed_at=1009.0)
    log.observe(idle, [], now=1000)
    log.observe(idle, [long], now=1008)  # long: 8 s alone
    log.observe(idle, [long, short], now=1010)  # 1 s long alone, 1 s shared: short 0.5 s
    log.observe(idle, [long], now=1018)  # short is gone: long 8 s alone
    log.flush(1018)
    [line] = list(read_samples(layout, since=0))
    [gpu] = line["gpus"]
    assert (gpu["held_s"], gpu["idle_held_s"]) == (18, 18)
    assert gpu["idle_by_job"] == {"long": 17.5, "short": 0.5}
    late = Record(id="late", state=State.RUNNING, spec={}, gpus=[0], claimed_at=1019.5)
    log.observe(idle, [late], now=1020)  # claimed 0.5 s before the reading: 0.5 s, not 2
    log.flush(1020)
    assert list(read_samples(layout, since=1018))[0]["gpus"][0]["idle_by_job"] == {"late": 0.5}
    # --by user takes each job's own part; a line without it (older workers) splits evenly
    events = [
        ev(1000, job, "pending", "running", user=user, queued_at=999, host="h", gpus=[0], by="h")
        for job, user in (("long", "ana"), ("short", "ben"))
    ]
    offenders = build(events, [line], [], 1000, 1100).to_json()["idle_offenders"]
    assert offenders == [
        {"job": "long", "user": "ana", "idle_held_gpu_hours": round(17.5 / 3600, 4)},
        {"job": "short", "user": "ben", "idle_held_gpu_hours": round(0.5 / 3600, 4)},
    ]
    by_user = build(events, [line], [], 1000, 1100, by="user").to_json()["groups"]
    assert by_user["ben"]["idle_held_gpu_hours"] == round(0.5 / 3600, 4)
    assert by_user["ana"]["idle_held_gpu_hours"] == round(17.5 / 3600, 4)
    old = {**line, "gpus": [{k: v for k, v in gpu.items() if k != "idle_by_job"}]}
    assert build(events, [old], [], 1000, 1100, by="user").to_json()["groups"]["ben"]["idle_held_gpu_hours"] == round(
        9 / 3600, 4
    )


def test_sample_lines_with_garbage_figures_are_not_counted_and_never_crash_the_report():
    """Samples are the workers' own, but a torn or foreign line must not crash a report,
    reach --json as NaN, or make the users add up to more than the total."""
    events = [
        ev(10, job, "pending", "running", user=user, queued_at=5, host="h", gpus=[0], by="h")
        for job, user in (("a", "ana"), ("b", "ben"))
    ]
    line = lambda gpu: {"t": 60, "s": 60, "host": "h", "gpus": [gpu]}  # noqa: E731
    garbage = [
        line({"i": 0, "held_s": 60, "idle_held_s": 60, "jobs": ["a", "b"], "idle_by_job": {"a": bad, "b": 1}})
        for bad in (float("nan"), float("inf"), -1e6, 1e300, "lots", [1])
    ]
    garbage += [
        line({"i": 0, "held_s": "x", "idle_held_s": "60", "util": "hot", "jobs": "a"}),
        {"t": 60, "s": 60, "host": "h", "gpus": ["not a gpu", None]},
        {"t": 60, "s": 60, "gpus": 7},
    ]
    for bad in garbage:
        r = build(events, [bad], [], 0, 120, by="user").to_json()
        json.dumps(r, allow_nan=False)  # raises on NaN or infinity
        users = sum(g["idle_held_gpu_hours"] for g in r["groups"].values())
        assert users <= r["total"]["idle_held_gpu_hours"] + 1e-4, (bad, r["groups"])
    # a line whose own parts are garbage is split evenly, as a line from before they were kept
    split = build(events, [garbage[0]], [], 0, 120, by="user").to_json()["groups"]
    assert split["ana"]["idle_held_gpu_hours"] == split["ben"]["idle_held_gpu_hours"] == round(30 / 3600, 4)


# --- through the real worker and CLI ------------------------------------------------------


@pytest.mark.slow
def test_report_through_the_worker(queue, tmp_path):
    queue.write_config(sample_every_s=1)
    queue.start_worker("a", "2x80GiB")
    # 50GiB each: one per GPU (utilization is a GPU's, so a holder sharing a busy GPU is not idle)
    # busy runs long enough that the time it sat at 0% while starting stays well under half its run
    queue.drop("busy.yaml", f"command: {FAKE_USE} --mem 4GiB --util 80 --seconds 8\ngpus: 1\ngpu_mem: 50GiB\n")
    queue.drop("holder.yaml", f"command: {FAKE_USE} --mem 4GiB --util 0 --seconds 3\ngpus: 1\ngpu_mem: 50GiB\n")
    queue.drop("broken.yaml", "command: exit 3\ngpus: 0\n")
    queue.drop("typo.yaml", "command: 'true'\ngpus: two\n")  # rejected: still its owner's, not "?"
    for job in ("busy", "holder", "broken"):
        wait_until(lambda job=job: queue.finished(job), timeout=30, what=job)
    wait_until(lambda: (queue.root / "state" / "rejected" / "typo.error").exists(), what="typo to be rejected")
    # a sample line covering the holder's last seconds is written within sample_every_s
    wait_until(
        lambda: (
            json.loads(queue.gpuq("report", "--since", "1h", "--json").stdout)["total"]["idle_held_gpu_hours"] * 3600
            >= 2
        ),
        timeout=10,
        what="the holder's idle time in the samples",
    )
    r = json.loads(queue.gpuq("report", "--since", "1h", "--json", "--by", "user").stdout)
    used_s = sum(queue.finished(j)["ended_at"] - queue.finished(j)["started_at"] for j in ("busy", "holder"))
    assert abs(r["total"]["gpu_hours"] * 3600 - used_s) <= 0.18  # rounded to 1e-4 h
    assert r["total"]["ended"]["done"] == 2 and r["total"]["ended"]["failed"] == 1
    assert r["total"]["jobs_started"] == 3 and r["total"]["wait_s"]["max"] is not None
    assert set(r["groups"]) == {queue.finished("busy")["user"]} and r["total"]["ended"]["rejected"] == 1
    # Only the holder sat idle on its GPU, not the busy one as well. Not a bound in seconds on
    # the total: a job is held from its claim, and the reading that ends its time comes with
    # a pass, later on a loaded machine (holder_s + 1.5 failed beside a busy loop). The total
    # is what the samples charged the jobs; the busy job is charged only while it started.
    idle_s = r["total"]["idle_held_gpu_hours"] * 3600
    charged: dict[str, float] = {}
    for path in (queue.root / "state" / "samples").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            for g in json.loads(line)["gpus"]:
                for job, share in g.get("idle_by_job", {}).items():
                    charged[job] = charged.get(job, 0.0) + share
    # each job is charged at most its own run (the busy one only while it started, at 0%)
    assert set(charged) <= {"busy", "holder"} and charged["holder"] >= 2, charged
    assert abs(idle_s - sum(charged.values())) <= 0.36, (idle_s, charged)  # the report rounds to 1e-4 h
    busy = queue.finished("busy")
    assert charged.get("busy", 0.0) < (busy["ended_at"] - busy["claimed_at"]) / 2, charged
    for job, seconds in charged.items():
        assert seconds <= queue.finished(job)["ended_at"] - queue.finished(job)["claimed_at"] + 0.5, charged
    util = {k: g["mean_util_pct"] for k, g in r["gpus"].items()}
    assert set(util) == {"a:0", "a:1"} and max(util.values()) > 0
    text = queue.gpuq("report", "--since", "1h").stdout
    assert "GPU utilization over time" in text and "a:0" in text and "queue length" in text
    # Asked for no window, this young queue's report starts at its first event: its slices
    # are seconds, not the 7 days' 6 hours (one bar).
    first = min(min(e["t"], e.get("queued_at") or e["t"]) for e in queue.events())
    default = json.loads(queue.gpuq("report", "--json").stdout)
    assert default["since"] == int(first) and default["bucket_s"] <= 5, (default["since"], first, default["bucket_s"])
    assert default["total"]["ended"] == r["total"]["ended"]
    assert json.loads(queue.gpuq("report", "--json", "--since", "7d").stdout)["bucket_s"] == 6 * 3600


@pytest.mark.slow
def test_a_stopped_worker_writes_the_samples_it_had_not_written_yet(queue):
    """worker.py stopped (SIGTERM) long before a line's sample_every_s is up: its last
    publication writes the part it had, so a report covers the run up to the stop."""
    queue.write_config(sample_every_s=3600)
    queue.start_worker("a", "1x80GiB")
    queue.drop("busy.yaml", f"command: {FAKE_USE} --mem 4GiB --util 70 --seconds 2\ngpus: 1\ngpu_mem: 50GiB\n")
    wait_until(lambda: queue.finished("busy"), timeout=60, what="busy to end")
    assert not list((queue.root / "state" / "samples").glob("*.jsonl"))  # an hour's line is not due
    queue.stop_worker("a")
    [line] = [json.loads(t) for f in (queue.root / "state" / "samples").glob("*.jsonl") for t in f.read_text().split()]
    held = line["gpus"][0]["held_s"]
    assert line["host"] == "a" and line["s"] > 0 and held > 0 and "busy" in line["gpus"][0]["jobs"], line


@pytest.mark.slow
def test_report_rejects_a_bad_since(queue):
    out = queue.gpuq("report", "--since", "last tuesday", check=False)
    assert out.returncode == 2
    assert "--since 'last tuesday'" in out.stderr and "7d" in out.stderr


@pytest.mark.slow
def test_report_refuses_a_window_of_centuries(queue):
    done = queue.gpuq("report", "--since", "99999999999999999999999s", check=False)
    assert done.returncode not in (0, None) and "Traceback" not in done.stderr, done.stderr
    assert "--since" in done.stderr and "100 years" in done.stderr, done.stderr
    assert "100 years back" in queue.gpuq("report", "--since", "0001-01-01", check=False).stderr


@pytest.mark.slow
def test_a_forged_event_never_stops_the_report(queue):
    """The attack review's F5 (tests/test_attacks_boundary.py has status and show): a line in
    the event log that is not an event, or names a path for a job or host, is skipped."""
    events = queue.root / "state" / "events" / "z.jsonl"  # as if written into the spool somehow
    events.parent.mkdir(parents=True, exist_ok=True)
    forged = [
        {"t": time.time(), "by": "a", "job": "../../../rootonly/pwned", "to": "done", "user": "alice"},
        {"t": time.time(), "by": "../b", "job": "x", "to": "failed"},
    ]
    compact = (",", ":")  # as gpuq writes events
    events.write_text("\n".join([*(json.dumps(f, separators=compact) for f in forged), "not json"]) + "\n")
    for asked in (["--since", "1d"], ["--since", "1d", "--json"], ["--by", "user"]):
        done = queue.gpuq("report", *asked, check=False)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (asked, done.stderr)


@pytest.mark.slow
def test_html_report_is_one_self_contained_page(queue, tmp_path):
    pytest.importorskip("matplotlib", reason="the [report] extra; the test extra installs it")
    queue.write_config(sample_every_s=1)
    queue.start_worker("a", "1x80GiB")
    queue.drop("j.yaml", f"command: {FAKE_USE} --mem 1GiB --util 60 --seconds 1\ngpus: 1\ngpu_mem: 2GiB\n")
    wait_until(lambda: queue.finished("j"), timeout=30)
    page = tmp_path / "report.html"
    out = queue.gpuq("report", "--since", "10m", "--html", str(page))
    assert out.stdout == "" and "wrote" in out.stderr
    html = page.read_text()
    assert html.count('src="data:image/png;base64,') == 3  # utilization, queue length, waits
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert "a:0" in html
    victim = tmp_path / "victim"
    victim.write_text("someone's file\n")
    (tmp_path / "planted.html").symlink_to(victim)  # a link planted where the page is to go
    out = queue.gpuq("report", "--since", "10m", "--html", str(tmp_path / "planted.html"), check=False)
    assert out.returncode == 2 and "a symbolic link, never written through" in out.stderr, out.stderr
    assert victim.read_text() == "someone's file\n"


@pytest.mark.slow
def test_html_without_matplotlib_names_the_extra(queue, tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('not installed')\n")
    env = {**queue.env(), "PYTHONPATH": f"{blocker}"}
    out = subprocess.run(
        [PY, str(REPO / "gpuq.py"), "--root", str(queue.root), "report", "--html", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2
    # D12: the checkout's own extra, with the interpreter gpuq runs on (no package index has gpuq-spool).
    assert "matplotlib" in out.stderr and f"-m pip install '{REPO}[report]'" in out.stderr, out.stderr
    assert not (tmp_path / "r.html").exists()


def test_notes_are_not_changes_and_preemptions_are_counted_by_cause():
    start = {"job": "j", "from": "pending", "to": "running", "t": 10.0, "user": "u", "host": "h", "gpus": [0]}
    note = {"job": "j", "note": "warning", "reason": "over its gpu_mem", "t": 20.0}
    old_note = {"job": "j", "from": "running", "to": "running", "reason": "warning: x", "t": 30.0}
    assert _open_run([start, note, old_note]) is start
    requeued = {
        **start,
        "from": "running",
        "to": "pending",
        "t": 40.0,
        "started_at": 10.0,
        "ended_at": 40.0,
        "reason": "it yielded",  # no prefix: only the cause says so
        "cause": "preempted",
    }
    report = build([start, note, requeued], [], [], 0.0, 100.0, by="user").to_json()
    assert report["groups"]["u"]["preemptions"] == 1 and report["total"]["preemptions"] == 1


def test_a_preempted_attempt_counts_its_gpu_hours_and_a_never_run_job_is_no_hosts():
    """D2: a preemption's event had no started_at, and its attempt's GPU-hours were left out;
    D15: a job cancelled while pending was put on a `<host>:cpu` row of `--by gpu`."""
    start = {"job": "lo", "from": "pending", "to": "running", "t": 100.0, "user": "u", "host": "h", "gpus": [1]}
    preempted = {**start, "from": "running", "to": "pending", "t": 400.0, "started_at": None, "cause": "preempted"}
    again = {**start, "t": 500.0}
    done = {**start, "from": "running", "to": "done", "t": 600.0, "started_at": 500.0, "ended_at": 600.0}
    never = {"job": "c", "from": "pending", "to": "cancelled", "t": 50.0, "user": "u", "by": "h", "host": None}
    report = build([start, preempted, again, done, never], [], [], 0.0, 1000.0, by="gpu").to_json()
    assert report["total"]["gpu_hours"] == round(400 / 3600, 4)  # 300 s preempted + 100 s done
    assert set(report["groups"]) == {"h:1"} and report["total"]["ended"]["cancelled"] == 1
