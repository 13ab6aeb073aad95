#!/usr/bin/env python3
"""Faults, injected into real workers on fake GPUs, and what they cost: for each fault, how
many times it happened (as measured: the crash and disk faults each leave a line in a fault
log as they fire; the others are counted as main() prints under the table), how many jobs,
how many were lost or ran twice, how many had a copy fenced (gpuq's own word: the line its
supervisor logs, or the reason recovery records), and how long recovery took (from the fault,
or from the restart that follows it, to every job's final record). Target: no job lost, none
recorded twice, and every job that ran twice had a copy fenced (its result never recorded).

    python bench/faults.py [--jobs 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import NamedTuple

import psutil
from _common import PY, REPO, clean_env, make_root, remove_root

sys.path.insert(0, str(REPO))
from gpuq.host.faults import CRASH_ENV, CRASH_POINTS, FAULT_LOG_ENV, RECOVERY_CRASH_POINTS  # noqa: E402

RUN = "ran-once"
# What a supervisor logs when it leaves its attempt's result unrecorded (run/supervise.py), and
# how recovery words the loss of an attempt fenced while its supervisor was gone.
NOT_RECORDED = "this attempt's result is not recorded"
FENCED_REASON = "fenced"


class Outcome(NamedTuple):
    fired: int  # how many times the fault happened, as measured
    jobs: int
    lost: int  # no final record
    unknown: int  # recorded as lost, exit unknown
    twice: int  # ran more than once
    fenced: int  # had a copy fenced
    twice_unfenced: int  # ran more than once, and no copy of it was fenced
    took: float
    problems: tuple[str, ...] = ()  # what this fault's own checks found wrong


class Queue:
    def __init__(self, name: str, **config: object) -> None:
        self.root = make_root(f"faults-{name}", poll_interval=0.2, grace_s=1, **config)
        self.workers: dict[str, subprocess.Popen] = {}
        self.fault_log = self.root / "faults.log"  # gpuq.host.faults: one line per fault that fired

    def start(self, host: str, env: dict[str, str] | None = None, wait: bool = True) -> subprocess.Popen:
        proc = subprocess.Popen(
            [
                PY,
                str(REPO / "worker.py"),
                "--root",
                str(self.root),
                "--host",
                host,
                "--fake-gpus",
                "2x80GiB",
                "--foreground",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**clean_env(), FAULT_LOG_ENV: str(self.fault_log), **(env or {})},
        )
        self.workers[host] = proc
        while wait and not (self.root / "state" / "workers" / f"{host}.json").exists():
            time.sleep(0.02)
        return proc

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_running(self, job_id: str) -> None:
        """Until the job's record says running and its supervisor has started it (the log's
        header is written just before the job is)."""
        log = self.root / "logs" / f"{job_id}.log"
        while not (self.root / "state" / "running" / f"{job_id}.json").exists() or not (
            log.exists() and "==> command:" in log.read_text()
        ):
            time.sleep(0.02)

    def fired(self) -> int:
        """How many faults have fired so far (crash points and I/O faults)."""
        try:
            return len(self.fault_log.read_text().splitlines())
        except FileNotFoundError:
            return 0

    def kill(self, host: str) -> bool:
        """Kill `host`'s worker; whether it was still running to be killed."""
        proc = self.workers.pop(host)
        alive = proc.poll() is None
        proc.kill()
        proc.wait()
        return alive

    def events(self) -> list[dict]:
        """Every host's event log (state/events/HOST.jsonl): each change of a job's state, with its reason."""
        found = []
        for path in sorted((self.root / "state" / "events").glob("*.jsonl")):
            found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return found

    def drop(self, n: int, command: str = f"echo {RUN}") -> list[str]:
        ids = [f"j{i:04d}" for i in range(n)]
        for job_id in ids:
            tmp = self.root / "jobs" / f".{job_id}.tmp"
            tmp.write_text(f"command: {json.dumps(command)}\ngpus: 1\ngpu_mem: 1GiB\n")
            os.rename(tmp, self.root / "jobs" / f"{job_id}.yaml")
        return ids

    def settled(self, ids: list[str]) -> bool:
        running = self.root / "state" / "running"
        return all(
            (self.root / "state" / "finished" / f"{i}.json").exists() and not (running / f"{i}.json").exists()
            for i in ids
        )

    def wait_settled(self, ids: list[str], timeout: float = 300) -> None:
        """Until every job has its final record (or the timeout: `tally` counts the rest lost)."""
        deadline = time.monotonic() + timeout
        while not self.settled(ids) and time.monotonic() < deadline:
            time.sleep(0.05)

    def recover(self, host: str, ids: list[str], fired: int, env: dict[str, str] | None = None) -> Outcome:
        """Start `host`'s worker again (as cron would) and wait until every job is settled."""
        t = time.monotonic()
        self.start(host, env, wait=False)
        self.wait_settled(ids)
        return self.outcome(fired, ids, time.monotonic() - t)

    def outcome(self, fired: int, ids: list[str], took: float, problems: tuple[str, ...] = ()) -> Outcome:
        """The jobs' fate, read from their final records, their logs and the event logs."""
        lost = unknown = twice = fenced = twice_unfenced = 0
        fenced_by_recovery = {e["job"] for e in self.events() if str(e.get("reason") or "").startswith(FENCED_REASON)}
        for i in ids:
            log_path = self.root / "logs" / f"{i}.log"
            log = log_path.read_text() if log_path.exists() else ""
            was_fenced = NOT_RECORDED in log or i in fenced_by_recovery
            ran_twice = log.splitlines().count(RUN) > 1
            fenced += was_fenced
            twice += ran_twice
            twice_unfenced += ran_twice and not was_fenced
            try:
                state = json.loads((self.root / "state" / "finished" / f"{i}.json").read_text())["state"]
            except FileNotFoundError:
                lost += 1
                continue
            unknown += state == "lost"
        return Outcome(fired, len(ids), lost, unknown, twice, fenced, twice_unfenced, took, problems)

    def close(self) -> None:
        self.power_cut()
        remove_root(self.root)

    def power_cut(self) -> None:
        """End every worker, spawner, supervisor and job of this root."""
        for host in list(self.workers):
            self.kill(host)
        for p in psutil.process_iter(["cmdline", "environ"]):
            try:
                if any(str(self.root) in a for a in p.info["cmdline"] or []) or (p.info["environ"] or {}).get(
                    "GPUQ_ROOT"
                ) == str(self.root):
                    p.kill()
            except psutil.Error:
                pass


def crash_at(*points: str) -> Outcome:
    """A crash at each of `points` in turn (a requeue's points are reached only after a first crash)."""
    with Queue(points[-1].replace(":", "-")) as q:
        q.start("a", {CRASH_ENV: ",".join(points)})
        ids = q.drop(1)
        deadline = time.monotonic() + 60
        while q.fired() < len(points) and time.monotonic() < deadline:  # a point that never fires shows less
            time.sleep(0.02)
        if points[-1].startswith(("worker:", "recovery:")):
            q.workers["a"].wait(30)
            q.workers.pop("a")
        else:
            q.kill("a")
        return q.recover("a", ids, q.fired())


def kill_storm(n: int) -> Outcome:
    hosts = ("a", "b", "c", "d")
    with Queue("storm") as q:
        for h in hosts:
            q.start(h)
        ids = q.drop(n)
        t, kills, rng = time.monotonic(), 0, random.Random(7)
        while not q.settled(ids):
            time.sleep(0.5)
            h = rng.choice(hosts)
            kills += q.kill(h)  # a worker that had already exited is not a kill
            q.start(h, wait=False)
        return q.outcome(kills, ids, time.monotonic() - t)


def frozen_host() -> Outcome:
    with Queue("frozen", lost_after_s=6) as q:
        q.start("a")
        ids = q.drop(1, command=f"echo {RUN}; [ $GPUQ_ATTEMPT = 1 ] && sleep 600; true")
        q.wait_running("j0000")
        q.start("b")
        worker = psutil.Process(q.workers["a"].pid)
        deadline = time.monotonic() + 30  # the job's first copy: its shell has started its sleep
        while not any("sleep" in p.name() for p in worker.children(recursive=True)) and time.monotonic() < deadline:
            time.sleep(0.02)
        everything = [worker, *worker.children(recursive=True)]
        stale = [p for p in everything if "sleep" in p.name()]
        frozen = [p for p in everything if p not in stale]
        t = time.monotonic()
        for p in frozen:
            p.suspend()
        froze = bool(stale) and worker.status() == psutil.STATUS_STOPPED  # a running copy, on a host stopped
        q.wait_settled(ids)
        took = time.monotonic() - t
        for p in frozen:
            p.resume()
        deadline = time.monotonic() + 30  # docs/reliability.md: killed within min(5 s, lost_after_s / 10)
        while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in stale) and time.monotonic() < deadline:
            time.sleep(0.05)
        dead = all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in stale)
        record = json.loads((q.root / "state" / "finished" / "j0000.json").read_text())
        # Beyond gpuq's word for it (the fenced column): the stale copy was killed, and its
        # result is not the one recorded (the record is b's second attempt).
        problems = []
        if not dead:
            problems.append("the stale copy still ran 30 s after the host resumed")
        if (record["host"], record["attempt"]) != ("b", 2):
            problems.append(f"the recorded result is {record['host']}'s attempt {record['attempt']}, not b's second")
        return q.outcome(int(froze), ids, took, tuple(problems))


def reboot() -> Outcome:
    with Queue("reboot") as q:
        q.start("a", {"GPUQ_TEST_BOOT_ID": "one"})
        ids = q.drop(1, command=f"[ $GPUQ_ATTEMPT = 1 ] && sleep 600; echo {RUN}")
        q.wait_running("j0000")
        q.power_cut()
        result = q.recover("a", ids, 0, {"GPUQ_TEST_BOOT_ID": "two"})
        # It happened if the worker that came back saw the reboot: it records the attempt
        # that was running as lost to it (worker/recovery.py).
        seen = sum(str(e.get("reason") or "").startswith("host rebooted") for e in q.events())
        return result._replace(fired=seen)


def _twenty_starts(q: Queue, stay: int) -> tuple[list[subprocess.Popen], int, float]:
    """20 simultaneous cron starts of host a; returns them once all but `stay` have exited,
    how many of them ran at once (still running when the last was started), and the seconds
    that took."""
    t = time.monotonic()
    starts = [
        subprocess.Popen(
            [
                PY,
                str(REPO / "worker.py"),
                "--root",
                str(q.root),
                "--host",
                "a",
                "--fake-gpus",
                "2x80GiB",
                "--foreground",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=clean_env(),
        )
        for _ in range(20)
    ]
    at_once = sum(p.poll() is None for p in starts)
    while sum(p.poll() is None for p in starts) > stay:
        time.sleep(0.01)
    return starts, at_once, time.monotonic() - t


def _left_badly(starts: list[subprocess.Popen]) -> tuple[str, ...]:
    """A start that finds the worker there leaves quietly with status 0 (README, "On a GPU box")."""
    bad = [p.returncode for p in starts if p.returncode not in (None, 0)]
    return (f"{len(bad)} starts exited with status {sorted(set(bad))}",) if bad else ()


def cron_overlap() -> Outcome:
    """No worker yet: the 20 starts race, and one of them boots while the others leave."""
    with Queue("cron") as q:
        starts, at_once, took = _twenty_starts(q, stay=1)
        (survivor,) = [p for p in starts if p.poll() is None]
        q.workers["a"] = survivor
        ids = q.drop(20)
        q.wait_settled(ids)
        return q.outcome(at_once if at_once > 1 else 0, ids, took, _left_badly(starts))  # one alone is no race


def cron_overlap_while_running() -> Outcome:
    """The worker runs (cron's usual case): all 20 starts leave; jobs carry on."""
    with Queue("cron-running") as q:
        q.start("a")
        ids = q.drop(4, command=f"sleep 3; echo {RUN}")
        for job_id in ids:
            q.wait_running(job_id)
        starts, at_once, took = _twenty_starts(q, stay=0)  # the worker was there first: all leave
        overlapped = at_once if q.workers["a"].poll() is None else 0  # beside a running worker
        q.wait_settled(ids)
        return q.outcome(overlapped, ids, took, _left_badly(starts))


def disk_full() -> Outcome:
    with Queue("diskfull") as q:
        q.start("a", {"GPUQ_TEST_IO_FAULT": "write:running=ENOSPC"})
        ids = q.drop(20)
        deadline = time.monotonic() + 60
        while q.fired() < 20 and time.monotonic() < deadline:  # refused writes, a pass or more each
            time.sleep(0.05)
        q.kill("a")
        return q.recover("a", ids, q.fired())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=2000, help="jobs in the kill storm")
    n = p.parse_args().jobs
    print(
        f"{'fault':44s} {'faults':>6s} {'jobs':>5s} {'lost':>5s} {'unknown':>8s} {'twice':>6s} "
        f"{'fenced':>7s} {'recovery':>9s}"
    )
    missed: list[str] = []

    def row(name: str, r: Outcome, faults_needed: int = 1) -> None:
        print(
            f"{name:44s} {r.fired:6d} {r.jobs:5d} {r.lost:5d} {r.unknown:8d} {r.twice:6d} {r.fenced:7d} {r.took:8.2f}s",
            flush=True,
        )
        if r.fired < faults_needed:
            missed.append(f"{name}: the fault never happened")
        if r.lost or r.twice_unfenced:
            missed.append(f"{name}: {r.lost} lost, {r.twice_unfenced} ran twice unfenced")
        missed.extend(f"{name}: {problem}" for problem in r.problems)

    for point in CRASH_POINTS:
        row(f"crash at {point}", crash_at(point))
    for point in RECOVERY_CRASH_POINTS:
        row(f"crash at supervisor:owned+{point}", crash_at("supervisor:owned", point), 2)
    row("worker SIGKILL every 0.5 s, 4 hosts", kill_storm(n))
    row("host frozen (SIGSTOP), lost_after_s 6", frozen_host())
    row("reboot (new boot id)", reboot())
    row("cron overlap: 20 starts (time: to 1 left)", cron_overlap())
    row("cron: 20 starts, worker running (to 0)", cron_overlap_while_running())
    row("disk full writing running records", disk_full())
    print(
        "faults: how often it happened (crash and disk rows: as the fault log recorded them firing;\n"
        "storm: workers killed while running; frozen: a host stopped with a copy of its job running;\n"
        "reboot: attempts the returning worker recorded as lost to the reboot; cron: starts running\n"
        "at once, beside the worker in the second row). lost: jobs without a final record.\n"
        "unknown: recorded as lost, exit unknown (see docs/reliability.md). twice: ran more than once.\n"
        "fenced: jobs with a copy whose result gpuq left unrecorded, as its supervisor logged it or\n"
        "recovery recorded it (the frozen host's stale copy is also checked killed, and the result\n"
        "recorded b's). recovery: from the restart after the fault (crashes, reboot, disk full), from\n"
        "the first kill (storm), from the freeze (frozen host), from the 20 starts (cron)."
    )
    print(
        "target (no job lost; every second run fenced; every fault happened): "
        + ("met" if not missed else "NOT MET: " + "; ".join(missed))
    )


if __name__ == "__main__":
    main()
