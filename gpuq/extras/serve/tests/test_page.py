"""The serve extra in-process: what of a status view the page serves, and the cached view that
keeps the last data (and says why) when the queue cannot be read."""

from __future__ import annotations

import json

from gpuq.extras.serve.page import page_data
from gpuq.extras.serve.server import Snapshot, _addressed_to_loopback

VIEW = {
    "now": 1000.0,
    "hosts": [
        {
            "host": "a",
            "alive": False,
            "stopped": False,
            "last_seen_s": 75.0,
            "drain": None,
            "pid": 4711,
            "gpus": [
                {
                    "index": 0,
                    "name": "H100",
                    "uuid": "GPU-secret-uuid",
                    "util_pct": None,
                    "mem_used_mib": 1024,
                    "mem_total_mib": 81920,
                    "jobs": [],
                }
            ],
        }
    ],
    "running": [
        {
            "id": "r-1",
            "name": "r\u202ecod.exe",
            "user": "ann",
            "host": "a",
            "gpus": [0],
            "elapsed_s": 65.0,
            "command": "python train.py --token=abc",
        }
    ],
    "pending": [
        {
            "id": "p-1",
            "name": "p",
            "user": "bob",
            "position": 1,
            "gpus": 2,
            "gpu_mem_mib": 20480,
            "waiting_s": 3.0,
            "reason": "waiting for 2 GPUs",
            "expected_start": None,
            "no_estimate": "unknown",
            "command": "secret",
        }
    ],
    "pending_total": 1,
    "finished": [{"id": "f-1", "state": "failed", "exit_code": None, "signal": 9, "host": "a", "gpus": [0, 1]}],
    "fair_share": [{"user": "ann"}],
    "alerts": [],
}


def test_the_page_holds_the_screens_words_and_none_of_the_rest():
    data = page_data(VIEW)
    text = json.dumps(data)
    assert "train.py" not in text and "secret" not in text and "4711" not in text and "fair_share" not in text
    assert data["hosts"][0]["state"] == "NOT RESPONDING" and data["hosts"][0]["seen"] == "1m15s"
    assert data["hosts"][0]["gpus"][0] == {
        "index": 0,
        "name": "H100",
        "util_pct": None,
        "util": "-",
        "mem_used_mib": 1024,
        "mem_total_mib": 81920,
        "mem": "1GiB/80GiB",
        "jobs": "-",
    }
    assert data["running"][0] == {
        "id": "r-1",
        "user": "ann",
        "name": "r\\u202ecod.exe",
        "where": "a:0",
        "elapsed": "1m05s",
    }
    assert (data["pending"][0]["ask"], data["pending"][0]["start_by"]) == ("2x20GiB", "unknown")
    assert (data["finished"][0]["exit"], data["finished"][0]["where"]) == ("sig9", "a:0,1")


def test_the_view_is_built_once_per_interval_and_kept_when_the_queue_cannot_be_read():
    calls: list[int] = []

    def build() -> dict:
        calls.append(1)
        if len(calls) > 1:
            raise OSError(5, "Input/output error")
        return {"n": 1}

    snapshot = Snapshot(build, max_age_s=3600)
    first = json.loads(snapshot.body())
    assert first == {"error": None, "data": {"n": 1}} and json.loads(snapshot.body()) == first and len(calls) == 1
    snapshot = Snapshot(build, max_age_s=0)
    calls.clear()
    snapshot.body()
    assert json.loads(snapshot.body()) == {"error": "OSError: Input/output error", "data": {"n": 1}}


def test_a_loopback_server_answers_loopback_names_only():
    for host in ("localhost:8080", "127.0.0.1:9000", "[::1]:8080", "LOCALHOST", "localhost"):
        assert _addressed_to_loopback(host), host
    for host in ("evil.example:8080", "localhost.evil.example", "", "127.0.0.2:8080"):
        assert not _addressed_to_loopback(host), host
