"""The alerts extra through the real worker on fake GPUs: each raised once, shown in status
until it clears, and handed to the alert command as JSON."""

from __future__ import annotations

import json
import signal

import pytest

from conftest import PY, REPO, wait_until

pytestmark = pytest.mark.slow  # every test here starts processes

FAKE_USE = f"{PY} {REPO / 'gpuq.py'} fake-use"


def _alerts(queue) -> dict[str, dict]:
    return {f"{a['kind']}:{a['subject']}": a for a in queue.status()["alerts"]}


def test_an_idle_holder_raises_its_alert_once_and_it_clears(queue, tmp_path):
    sink = tmp_path / "alerts.jsonl"
    queue.write_config(alert_idle_holder_s=1, alert_command=f"cat >> {sink}")
    queue.start_worker("a", "1x80GiB")
    go = tmp_path / "go"  # the job holds its memory, idle, until the test has seen what it needs
    queue.drop(
        "holder.yaml",
        f"command: {FAKE_USE} --mem 5GiB --util 0 -- sh -c 'while [ ! -e {go} ]; do sleep 0.1; done'\n"
        "gpus: 1\ngpu_mem: 8GiB\n",
    )
    shown = wait_until(lambda: _alerts(queue).get("idle_holder:holder"), timeout=20, what="the idle-holder alert")
    assert shown["message"].startswith("job holder (root) holds 5GiB of GPU memory at under 5% utilization")
    assert "idle_holder" in queue.gpuq("status").stdout
    queue.wait_passes("a", 5)  # passes that see the idle holder go on, after the one that raised it
    go.touch()
    wait_until(lambda: queue.finished("holder"), timeout=60)
    wait_until(lambda: "idle_holder:holder" not in _alerts(queue), what="the alert to clear")
    sent = [json.loads(line) for line in sink.read_text().splitlines()]
    assert [a["kind"] for a in sent if a["subject"] == "holder"] == ["idle_holder"]  # once
    assert set(sent[0]) == {"kind", "subject", "host", "message", "since"}


def test_long_waits_and_hot_gpus_are_alerts(queue, tmp_path):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "name": "Hot",
                        "uuid": "GPU-hot-0",
                        "memory_total_mib": 81920,
                        "memory_used_mib": 0,
                        "utilization": 0,
                        "temperature": 95,
                    }
                ],
                "processes": [],
            }
        )
    )
    queue.write_config(alert_wait_s=1)
    queue.start_worker("a", str(gpus))
    queue.drop("huge.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 100GiB\n")
    alerts = wait_until(
        lambda: (a := _alerts(queue)) and "long_wait:huge" in a and a, timeout=20, what="the long-wait alert"
    )
    assert alerts["gpu_hot:a:0"]["message"] == "GPU a:0 at 95°C (alert_gpu_temp_c 85)"
    assert alerts["long_wait:huge"]["message"].startswith("job huge (root) has waited")


def test_a_silent_worker_is_an_alert_until_it_speaks_again(queue):
    queue.write_config(alert_worker_silent_s=2)
    queue.start_worker("a", "1x80GiB")
    queue.start_worker("b", "1x80GiB")
    frozen = queue.worker_process("b")
    frozen.send_signal(signal.SIGSTOP)
    try:
        alert = wait_until(lambda: _alerts(queue).get("worker_silent:b"), timeout=20, what="b to be missed")
        assert alert["host"] == "a" and "the worker of b has not renewed its heartbeat" in alert["message"]
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_until(lambda: "worker_silent:b" not in _alerts(queue), timeout=20, what="the alert to clear")


def test_a_flood_of_very_short_jobs_is_an_alert(queue):
    queue.write_config(alert_short_jobs=20)
    queue.start_worker("a", "2x80GiB")
    for i in range(25):
        queue.drop(f"tiny-{i:02d}.yaml", "command: 'true'\ngpus: 0\n")
    alert = wait_until(lambda: _alerts(queue).get("short_job_flood:a"), timeout=30, what="the flood alert")
    assert alert["message"].startswith("2") and "jobs ran under 10 s each on a in the last 10m00s" in alert["message"]
