"""bench/gpu_check.py is for a real GPU box; its --fake mode runs the same checks on fake
GPUs so the script stays ready for the day a person runs it on one."""

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow
def test_gpu_check_passes_on_fake_gpus():
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--fake"], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout and "FAIL" not in proc.stdout


def _view(usable_mib: int, declared_mib: int | None, running: bool = True) -> dict:
    return {
        "hosts": [{"host": "box", "gpus": [{"index": 0, "usable_mib": usable_mib, "mem_total_mib": 81920}]}],
        "running": [{"host": "box", "gpus": [0], "gpu_mem_mib": declared_mib}] if running else [],
    }


def test_the_accounting_check_fails_where_the_accounting_is_wrong():
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_check import check_accounting

    def failures(views: list[dict]) -> list[str]:
        found: list[str] = []
        check_accounting(views, 256, found)
        return found

    assert failures([_view(81920 - 256 - 4096, 4096)]) == []
    assert failures([_view(81920 - 4096, 4096)])  # the reserve left out
    assert failures([_view(81920 - 256 - 4096, 4096), _view(81920 - 256, 4096)])  # wrong in one snapshot
    assert failures([_view(0, None)]) == []  # a whole-GPU job leaves nothing usable
    assert failures([_view(1, None)])
    assert failures([_view(81920 - 256, 0, running=False)])  # no job seen: vacuous, so a failure
    exact: list[str] = []
    check_accounting([_view(81920 - 256 - 2 * 4096, 4096)], 256, exact, exact=True)
    assert exact  # charged twice: within the bound, but not what fake GPUs must show
