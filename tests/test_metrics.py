"""Prometheus metrics written by the real worker, parsed with prometheus_client's parser."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import PY, REPO, wait_until

FAKE_USE = f"{PY} {REPO / 'gpuq.py'} fake-use"


def samples(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


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
    import re

    from gpuq.worker.metrics import HELP

    dashboard = json.loads((REPO / "contrib" / "grafana-gpuq.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"gpuq_[a-z_]+", e)}
    assert used and used <= set(HELP), used - set(HELP)
    assert set(HELP) - {"gpuq_up"} <= used  # every metric has a panel
