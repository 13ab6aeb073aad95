"""`gpuq eff`: how well one job used what it held, and why it may be slow. Pure: fed the
job's record (what its supervisor measured: CPU time, RAM peak, GPU memory peak, mean GPU
utilization) and the sample lines of the GPUs it held (samples.py: utilization over
time, time held at under `alert_idle_util_pct`).

The rules (README, "Why is my job slow? `gpuq eff`"), each a hint with its figures:
- input-bound: GPU utilization under INPUT_BOUND_GPU_PCT while its CPUs ran at
  INPUT_BOUND_CPU_PCT or more of the cores it was given;
- over-declared GPU memory: its peak under OVER_DECLARED_PCT of the declared `gpu_mem`;
- memory-bound: its peak too close to what it held for the margin `show` suggests (the
  peak + 10%, in whole GiB, is more than it held; up to all of it): the two never disagree;
- over its gpu_mem: its peak above what it declared (it needs more, not less);
- held while idle: IDLE_HELD_PCT or more of its GPU time, and IDLE_HELD_MIN_S or more, at
  under `alert_idle_util_pct` (a job's first seconds are idle while it loads);
- fits a fraction: a whole GPU held, its peak memory and mean utilization both at
  FRACTION_PCT or less of one;
- over-declared RAM: its RAM peak under RAM_OVER_DECLARED_PCT of its `mem`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from gpuq.extras.reports.report import idle_shares
from gpuq.extras.reports.reportview import spark  # the report's marks: one look for utilization
from gpuq.host.usage import suggest_gpu_mem
from gpuq.model.record import Record
from gpuq.model.text import safe_text
from gpuq.model.units import format_duration, format_mib

INPUT_BOUND_GPU_PCT = 40.0
INPUT_BOUND_CPU_PCT = 85.0
OVER_DECLARED_PCT = 50.0
IDLE_HELD_PCT = 25.0
IDLE_HELD_MIN_S = 60.0
FRACTION_PCT = 50.0
RAM_OVER_DECLARED_PCT = 25.0


@dataclass
class Hint:
    kind: str  # input-bound, over-declared, memory-bound, over-gpu-mem, idle-held, fits-fraction, ram-over-declared
    text: str  # plain words with the numbers behind them, and what to try


@dataclass
class Efficiency:
    """One attempt's figures. None: not known (a running job's CPU time is counted when it
    ends; a GPU NVML gave no utilization for)."""

    id: str
    user: str
    state: str
    host: str | None
    gpus: int
    run_s: float | None
    time_limit_s: float | None
    cores: int | None  # the cores it was given (cpus:), None without a limit
    cpu_s: float | None
    cpu_eff_pct: float | None  # CPU time / (cores x run time)
    busy_cores: float | None  # CPU time / run time
    peak_rss_mib: int | None
    mem_limit_mib: int | None
    declared_gpu_mem_mib: int | None  # the spec's gpu_mem, None: the whole GPU
    held_gpu_mem_mib: int | None  # what it was charged per GPU: declared, or the whole GPU
    gpu_total_mib: int | None
    peak_gpu_mem_mib: int | None
    gpu_util_mean_pct: float | None
    gpu_util_series: list[tuple[float, float]] = field(default_factory=list)  # (end of sample, util %)
    idle_held_s: float = 0.0  # GPU-seconds held at under alert_idle_util_pct
    shared_with: int = 0  # most other jobs seen on its GPU at once: utilization is then the GPU's, not its own
    hints: list[Hint] = field(default_factory=list)

    @property
    def gpu_s(self) -> float:
        return (self.run_s or 0.0) * self.gpus

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpu_util_series"] = [list(p) for p in self.gpu_util_series]
        d["time_used_pct"] = _pct(self.run_s, self.time_limit_s)
        d["ram_used_pct"] = _pct(self.peak_rss_mib, self.mem_limit_mib)
        d["gpu_mem_used_pct"] = _pct(self.peak_gpu_mem_mib, self.held_gpu_mem_mib)
        d["idle_held_pct"] = _pct(self.idle_held_s, self.gpu_s)
        return d


def _pct(part: float | None, whole: float | None) -> float | None:
    return round(100.0 * part / whole, 1) if part is not None and whole else None


def job_samples(lines: Iterable[dict], records: Iterable[Record], now: float) -> dict[str, list[dict]]:
    """For each record, the GPU entries of the sample lines that cover its attempt on its own
    host and GPUs, each with the line's end `t` and length `s` added. Torn lines are skipped."""
    wanted: dict[tuple[str, int], list[Record]] = {}
    for r in records:
        if r.host and r.started_at is not None:
            for i in r.gpus:
                wanted.setdefault((r.host, i), []).append(r)
    found: dict[str, list[dict]] = {}
    for line in lines:
        t, s, gpus = line.get("t"), line.get("s"), line.get("gpus")
        if not _number(t) or not _number(s) or not isinstance(gpus, list):
            continue
        for g in gpus:
            if not isinstance(g, dict) or type(g.get("i")) is not int or not isinstance(g.get("jobs"), list):
                continue
            for r in wanted.get((str(line.get("host")), g["i"]), ()):
                ended = r.ended_at if r.ended_at is not None else now
                if r.id in g["jobs"] and t > r.started_at and t - s < ended + s:  # type: ignore[operator]
                    found.setdefault(r.id, []).append({**g, "t": t, "s": s})
    return found


def _most_at_once(record: Record, samples: list[dict], spans: Mapping[str, tuple[float, float]], now: float) -> int:
    """The most other jobs that ran on its GPUs at the same moment as it. A sample line names
    every job seen on a GPU over its minute, so two jobs a line names together may never have
    met: only the other jobs' own start and end say whether they overlapped (one whose times
    are not known is not counted)."""
    if record.started_at is None:
        return 0
    own_end = record.ended_at if record.ended_at is not None else now
    others = {j for g in samples for j in g.get("jobs", ()) if isinstance(j, str) and j != record.id}
    moments = []
    for job in others & spans.keys():
        start, end = max(spans[job][0], record.started_at), min(spans[job][1], own_end)
        if start < end:
            moments += [(start, 1), (end, -1)]
    most = running = 0
    for _, step in sorted(moments):  # an end before a start at the same moment: they did not meet
        running += step
        most = max(most, running)
    return most


def _number_or_zero(v: object) -> float:
    return float(v) if _number(v) and v >= 0 else 0.0  # type: ignore[arg-type,operator]


def _number(v: object) -> bool:
    return (type(v) is int or type(v) is float) and v == v and abs(v) != float("inf")


def efficiency(
    record: Record, samples: list[dict], now: float, spans: Mapping[str, tuple[float, float]] | None = None
) -> Efficiency:
    """The figures of `record`'s attempt, and the hints they call for. `spans`: when each other
    job seen on its GPUs ran (start, end), to count the ones that ran beside it at once."""
    run_s = None
    if record.started_at is not None:
        run_s = max(0.0, (record.ended_at if record.ended_at is not None else now) - record.started_at)
    cores = len(record.cpu_cores) or record.spec.get("cpus") or None
    cpu_s = record.cpu_s if record.ended_at is not None else None
    series = _util_series(samples)
    util = record.mean_gpu_util_pct
    if util is None and series:  # still running: from the samples so far
        util = round(sum(u for _, u in series) / len(series), 1)
    totals = [g["total"] for g in samples if _number(g.get("total"))]
    eff = Efficiency(
        id=record.id,
        user=record.user,
        state=record.state.value,
        host=record.host,
        gpus=len(record.gpus),
        run_s=run_s,
        time_limit_s=record.time_limit_s,
        cores=cores,
        cpu_s=cpu_s,
        cpu_eff_pct=round(100.0 * cpu_s / (cores * run_s), 1) if cpu_s is not None and cores and run_s else None,
        busy_cores=round(cpu_s / run_s, 2) if cpu_s is not None and run_s else None,
        peak_rss_mib=record.peak_rss_mib,
        mem_limit_mib=record.mem_limit_mib,
        declared_gpu_mem_mib=record.spec.get("gpu_mem_mib"),
        held_gpu_mem_mib=record.gpu_mem_mib,
        gpu_total_mib=int(max(totals)) if totals else None,
        peak_gpu_mem_mib=record.peak_gpu_mem_mib,
        gpu_util_mean_pct=util,
        gpu_util_series=series,
        idle_held_s=sum(idle_shares(g, _number_or_zero(g.get("idle_held_s"))).get(record.id, 0.0) for g in samples),
        shared_with=_most_at_once(record, samples, spans or {}, now),
    )
    # A sample line covers sample_every_s; a job that ran a part of it held idle at most its own time.
    eff.idle_held_s = min(eff.idle_held_s, eff.gpu_s)
    eff.hints = hints(eff)
    return eff


def _util_series(samples: list[dict]) -> list[tuple[float, float]]:
    """Utilization over time: per sample line, the mean over the job's GPUs that reported one."""
    by_t: dict[float, list[float]] = {}
    for g in samples:
        if _number(g.get("util")):
            by_t.setdefault(g["t"], []).append(float(g["util"]))
    return [(t, round(sum(us) / len(us), 1)) for t, us in sorted(by_t.items())]


def hints(e: Efficiency) -> list[Hint]:
    """The rules of the module docstring, in that order."""
    found: list[Hint] = []
    util = e.gpu_util_mean_pct
    if util is not None and util < INPUT_BOUND_GPU_PCT and e.cpu_eff_pct is not None:
        if e.cpu_eff_pct >= INPUT_BOUND_CPU_PCT:
            found.append(
                Hint(
                    "input-bound",
                    f"GPU utilization averaged {util:.0f}% while its {e.cores} CPU core(s) ran at "
                    f"{e.cpu_eff_pct:.0f}%: the GPU waits for input. Try more data-loader workers (and "
                    "more `cpus:` for them), pinned memory (pin_memory=True), data on local disk",
                )
            )
    peak, held = e.peak_gpu_mem_mib, e.held_gpu_mem_mib
    declared = e.declared_gpu_mem_mib
    if peak and declared and 100.0 * peak / declared < OVER_DECLARED_PCT:
        right = suggest_gpu_mem([peak])
        if right is not None and right < declared:
            found.append(
                Hint(
                    "over-declared",
                    f"GPU memory peaked at {format_mib(peak)} of the {format_mib(declared)} declared "
                    f"({100.0 * peak / declared:.0f}%): `gpu_mem: {format_mib(right)}` lets other jobs use the rest",
                )
            )
    if peak and held and peak > held:
        right = suggest_gpu_mem([peak])
        found.append(
            Hint(
                "over-gpu-mem",
                f"GPU memory peaked at {format_mib(peak)}, above the {format_mib(held)} it held "
                f"({100.0 * peak / held:.0f}%): it crowds the jobs beside it and may be stopped for it "
                f"(config gpu_mem_overuse); declare what it needs"
                + (f", `gpu_mem: {format_mib(right)}`" if right else ""),
            )
        )
    elif peak and held and held < (suggest_gpu_mem([peak]) or 0):  # what `show` suggests would not fit
        found.append(
            Hint(
                "memory-bound",
                f"GPU memory peaked at {format_mib(peak)} of the {format_mib(held)} it held "
                f"({100.0 * peak / held:.0f}%): mixed precision (bf16/fp16) or gradient accumulation "
                "(smaller batches, same effective batch) would let it fit a smaller share",
            )
        )
    if e.gpu_s and e.idle_held_s >= IDLE_HELD_MIN_S and 100.0 * e.idle_held_s / e.gpu_s >= IDLE_HELD_PCT:
        found.append(
            Hint(
                "idle-held",
                f"{'its GPUs' if e.gpus > 1 else 'its GPU'} sat idle for {format_duration(e.idle_held_s)} "
                f"of {format_duration(e.gpu_s)} held "
                f"({100.0 * e.idle_held_s / e.gpu_s:.0f}%): run CPU-only steps (preprocessing, evaluation, "
                "waiting) as their own job with `gpus: 0`, chained with `after:`",
            )
        )
    whole = e.gpu_total_mib
    if declared is None and peak and whole and util is not None:
        share = max(100.0 * peak / whole, util)
        if share <= FRACTION_PCT:
            right = suggest_gpu_mem([peak])
            found.append(
                Hint(
                    "fits-fraction",
                    f"it held a whole GPU ({format_mib(whole)}) but peaked at {format_mib(peak)} and "
                    f"{util:.0f}% utilization: it would fit a fraction of one. "
                    + (f"`gpu_mem: {format_mib(right)}` lets another job share the GPU" if right else ""),
                )
            )
    rss, mem = e.peak_rss_mib, e.mem_limit_mib
    if rss and mem and 100.0 * rss / mem < RAM_OVER_DECLARED_PCT:
        found.append(
            Hint(
                "ram-over-declared",
                f"RAM peaked at {format_mib(rss)} of its `mem: {format_mib(mem)}` "
                f"({100.0 * rss / mem:.0f}%): asking for less leaves room for other jobs on the box",
            )
        )
    return found


SERIES_WIDTH = 60  # marks in a job's utilization line: longer series are averaged down


def _of(part: str, whole: str | None, pct: float | None) -> str:
    return part + (f" of {whole} ({pct:.0f}%)" if whole is not None and pct is not None else "")


def _spark(series: list[tuple[float, float]]) -> str:
    values = [u for _, u in series]
    if len(values) > SERIES_WIDTH:  # averaged down into SERIES_WIDTH slices
        n = len(values)
        values = [
            sum(chunk) / len(chunk)
            for k in range(SERIES_WIDTH)
            if (chunk := values[k * n // SERIES_WIDTH : (k + 1) * n // SERIES_WIDTH])
        ]
    return spark(values, 100.0)


def detail_text(e: Efficiency) -> str:
    """One job, in the manner of Slurm's seff (and Princeton's jobstats for the GPU lines)."""
    d = e.to_json()
    where = f" on {e.host} ({e.gpus} GPU{'s' if e.gpus != 1 else ''})" if e.host else ""
    lines = [f"{safe_text(e.id)} ({safe_text(e.user)}): {e.state}{safe_text(where)}"]
    if e.run_s is None:
        return "\n".join([*lines, "  never ran: it ended before it started, so it has no figures"])
    limit = format_duration(e.time_limit_s) if e.time_limit_s else None
    lines.append(f"  run time     {_of(format_duration(e.run_s), limit, d['time_used_pct'])}")
    if e.cpu_s is None:
        lines.append("  CPU          counted when it ends")
    else:
        cores = f" of {e.cores} core{'s' if e.cores != 1 else ''}" if e.cores else " cores"
        eff = f" ({e.cpu_eff_pct:.0f}% efficiency)" if e.cpu_eff_pct is not None else " (no cpus: given)"
        lines.append(f"  CPU          {e.busy_cores or 0:.2f}{cores} busy{eff}, {format_duration(e.cpu_s)} CPU time")
    if e.peak_rss_mib is not None:
        mem = f"its mem {format_mib(e.mem_limit_mib)}" if e.mem_limit_mib else None
        lines.append(f"  RAM          {_of('peak ' + format_mib(e.peak_rss_mib), mem, d['ram_used_pct'])}")
    if e.gpus:
        util = "not reported" if e.gpu_util_mean_pct is None else f"mean {e.gpu_util_mean_pct:.0f}%"
        if e.shared_with and e.gpu_util_mean_pct is not None:
            util += f" (the GPU's: shared with up to {e.shared_with} other job{'s' if e.shared_with > 1 else ''})"
        marks = f"   {_spark(e.gpu_util_series)}" if e.gpu_util_series else ""
        lines.append(f"  GPU util     {util}{marks}")
        if e.peak_gpu_mem_mib is not None:
            held = format_mib(e.held_gpu_mem_mib) + " held" if e.held_gpu_mem_mib else None
            lines.append(f"  GPU memory   {_of('peak ' + format_mib(e.peak_gpu_mem_mib), held, d['gpu_mem_used_pct'])}")
        idle = format_duration(e.idle_held_s)
        lines.append(f"  held idle    {_of(idle, format_duration(e.gpu_s) + ' GPU time', d['idle_held_pct'])}")
    if e.hints:
        lines.append("  hints")
        lines.extend(f"    {h.kind}: {h.text}" for h in e.hints)
    else:
        lines.append("  hints        none: nothing above calls for one")
    return "\n".join(lines)


TABLE_HEAD = ("ID", "USER", "STATE", "ELAPSED", "TIME%", "CPU%", "RAM%", "GPU%", "GPUMEM%", "IDLE%", "HINTS")


def table_text(effs: list[Efficiency]) -> str:
    """Many jobs, one row each (in the manner of reportseff), the hints' kinds in the last column."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    rows = [TABLE_HEAD]
    for e in effs:
        d = e.to_json()
        rows.append(
            (
                safe_text(e.id),
                safe_text(e.user),
                e.state,
                format_duration(e.run_s),
                pct(d["time_used_pct"]),
                pct(e.cpu_eff_pct),
                pct(d["ram_used_pct"]),
                pct(e.gpu_util_mean_pct),
                pct(d["gpu_mem_used_pct"]),
                pct(d["idle_held_pct"]) if e.gpus else "-",
                ",".join(h.kind for h in e.hints) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEAD))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
