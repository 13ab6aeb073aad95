"""Prometheus metrics: the extra's publisher in a worker driven pass by pass (where it writes,
at what pace), then the file a real worker writes, parsed with prometheus_client's parser."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from harness import PassWorker, status
from prometheus_client.parser import text_string_to_metric_families

from conftest import PY, REPO, wait_until
from gpuq import hooks
from gpuq.extras.reports.metrics import EVERY_S, HELP, MIN_GAP_S
from gpuq.model.config import Config
from gpuq.spool.inbox import send

FAKE_USE = f"{PY} {REPO / 'gpuq.py'} fake-use"


def samples(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_publisher_writes_into_metrics_dir_every_few_seconds_and_soon_after_a_start(tmp_path: Path):
    """Registered by the extra, the worker hands it each publication of its box; it writes the
    file every EVERY_S, and MIN_GAP_S after the jobs running here changed, not at every pass."""
    assert hooks.unused_keys(Config(metrics_dir="/m")) == []  # with the extra, metrics_dir is read
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB", metrics_dir=str(tmp_path / "prom-{host}"))
    path = tmp_path / "prom-a" / "gpuq-a.prom"

    def running() -> float:
        return samples(path.read_text())[("gpuq_jobs", (("host", "a"), ("state", "running")))]

    box.run_pass()
    assert running() == 0 and oct(path.stat().st_mode & 0o777) == "0o644"
    written = path.read_text()
    box.drop("one.yaml", "command: 'true'\ngpus: 1\n")
    box.run_pass(after_s=MIN_GAP_S / 2)  # a job started, but the file was written just now
    assert path.read_text() == written
    box.run_pass(after_s=MIN_GAP_S / 2)
    assert running() == 1
    written = path.read_text()
    box.run_pass(after_s=EVERY_S / 2)  # nothing changed: the file waits for its EVERY_S
    assert path.read_text() == written
    box.run_pass(after_s=EVERY_S / 2)
    assert path.read_text() != written and running() == 1


def test_a_cancelled_job_is_running_until_it_ends_and_only_a_preempted_one_is_yielding(tmp_path: Path):
    """A cancelled job, opportunistic or not, is told to stop (the heartbeat lists it, for the
    plan); it is still running, not yielding, until its supervisor records its end."""
    box = PassWorker(tmp_path / "root", fake_gpus="2x80GiB")
    path = tmp_path / "root" / "state" / "metrics" / "gpuq-a.prom"
    box.drop("busy.yaml", "command: sleep 600\ngpus: 1\n")
    box.drop("lo.yaml", "command: sleep 600\ngpus: 1\npriority: low\n")
    for _ in range(8):  # a low job starts once its GPU has been idle for a minute
        box.run_pass(after_s=10)
    assert sorted(box.launched()) == ["busy", "lo"]
    send(box.layout, "cancel", ("busy", "lo"), sent_from="a")
    box.run_pass(after_s=EVERY_S)
    assert set(box.stops) == {"busy", "lo"} and box.heartbeat()["stopping"] == ["busy", "lo"]
    assert {j: o["cause"] for j, o in box.heartbeat()["stops"].items()} == {"busy": "cancelled", "lo": "cancelled"}
    s = samples(path.read_text())
    assert s[("gpuq_jobs", (("host", "a"), ("state", "running")))] == 2
    assert s[("gpuq_jobs", (("host", "a"), ("state", "yielding")))] == 0
    shown = {r["id"]: (r["stopping"], r["yielding"]) for r in status(box.root)["running"]}
    assert shown == {"busy": (True, False), "lo": (True, False)}


def test_a_preempted_low_job_is_counted_yielding(tmp_path: Path):
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB", idle_windows="00:00-23:59")
    path = tmp_path / "root" / "state" / "metrics" / "gpuq-a.prom"
    box.drop("lo.yaml", "command: sleep 600\ngpus: 1\npriority: low\n")
    for _ in range(8):  # a low job starts once its GPU has been idle for a minute
        box.run_pass(after_s=10)
    box.drop("hi.yaml", "command: x\ngpus: 1\n")
    for _ in range(5):
        box.run_pass(after_s=2)
    assert "lo" in box.stops
    box.run_pass(after_s=EVERY_S)
    s = samples(path.read_text())
    assert s[("gpuq_jobs", (("host", "a"), ("state", "yielding")))] == 1
    assert s[("gpuq_jobs", (("host", "a"), ("state", "running")))] == 0


@pytest.mark.slow
def test_the_worker_writes_parseable_metrics_per_gpu_state_and_user(queue):
    queue.start_worker("a", "2x80GiB")
    queue.drop("busy.yaml", f"command: {FAKE_USE} --mem 5GiB --util 30 --seconds 30\ngpus: 1\ngpu_mem: 8GiB\n")
    queue.drop("huge.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 100GiB\n")  # waits forever
    queue.drop("quick.yaml", "command: 'true'\ngpus: 0\n")
    wait_until(lambda: queue.finished("quick"), what="quick to finish")
    path = queue.root / "state" / "metrics" / "gpuq-a.prom"

    def current() -> dict | None:
        if not path.exists():
            return None
        s = samples(path.read_text())
        ready = s.get(("gpuq_job_gpu_memory_bytes", (("host", "a"), ("job", "busy"), ("user", "root")))) and s.get(
            ("gpuq_jobs_finished_total", (("host", "a"), ("state", "done")))
        )
        return s if ready else None

    s = wait_until(current, timeout=30, what="metrics with the running job's memory")
    gpu0 = (("gpu", "0"), ("host", "a"))
    assert s[("gpuq_up", (("host", "a"),))] == 1
    assert (
        s[
            (
                "gpuq_gpu_memory_total_bytes",
                (
                    ("gpu", "0"),
                    ("host", "a"),
                    ("name", "Fake GPU 80GiB"),
                    ("uuid", json.loads((queue.root / "state/workers/a.json").read_text())["gpus"][0]["uuid"]),
                ),
            )
        ]
        == 80 * 2**30
    )
    busy_gpu = [k for k, v in s.items() if k[0] == "gpuq_gpu_jobs" and v == 1]
    assert len(busy_gpu) == 1
    index = dict(busy_gpu[0][1])["gpu"]
    on = (("gpu", index), ("host", "a"))
    assert s[("gpuq_gpu_memory_used_bytes", on)] == 5 * 2**30
    assert s[("gpuq_gpu_memory_declared_bytes", on)] == 8 * 2**30
    assert s[("gpuq_gpu_utilization_ratio", on)] == 0.3
    assert ("gpuq_gpu_temperature_celsius", gpu0) in s
    assert s[("gpuq_jobs", (("host", "a"), ("state", "running")))] == 1
    assert s[("gpuq_jobs", (("host", "a"), ("state", "pending")))] == 1
    assert s[("gpuq_jobs_finished_total", (("host", "a"), ("state", "done")))] == 1
    assert s[("gpuq_user_gpus", (("host", "a"), ("user", "root")))] == 1
    assert s[("gpuq_user_jobs", (("host", "a"), ("state", "pending"), ("user", "root")))] == 1
    assert s[("gpuq_job_gpu_memory_bytes", (("host", "a"), ("job", "busy"), ("user", "root")))] == 5 * 2**30
    assert oct(path.stat().st_mode & 0o777) == "0o644"  # node_exporter runs as its own user


def test_the_grafana_dashboard_uses_only_metrics_the_worker_writes():
    dashboard = json.loads((REPO / "contrib" / "grafana-gpuq.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"gpuq_[a-z_]+", e)}
    assert used and used <= set(HELP), used - set(HELP)
    assert set(HELP) - {"gpuq_up"} <= used  # every metric has a panel
