"""Services: a job with `restart: on-failure` or `restart: always` is started again by its
supervisor, in the same attempt, on the same GPUs, whose memory stays charged to it meanwhile
(the running record stays): a long-running inference server holds its GPU memory like a
quota. Between starts it waits a backoff that doubles from BACKOFF_S to MAX_BACKOFF_S and
starts again from BACKOFF_S once a run has stayed up HEALTHY_S. A stop (cancel, time limit,
preemption, fencing) is never followed by a restart."""

from __future__ import annotations

BACKOFF_S = 1.0
MAX_BACKOFF_S = 300.0
HEALTHY_S = 600.0


def restart_delay(
    policy: str, exit_code: int | None, signal: int | None, stopped: bool, quick_failures: int
) -> float | None:
    """Seconds to wait before the next start, or None for no restart. `quick_failures`:
    earlier runs in a row that ended before HEALTHY_S."""
    if policy == "never" or stopped:
        return None
    if policy == "on-failure" and exit_code == 0 and signal is None:
        return None
    return min(MAX_BACKOFF_S, BACKOFF_S * 2**quick_failures)
