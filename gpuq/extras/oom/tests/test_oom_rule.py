"""The oom extra's rule on its own: what counts as CUDA running out of memory in each
framework's words, what the next attempt asks for, and when there is none."""

from __future__ import annotations

import json

import pytest

from gpuq.extras.oom.rule import attempt_output, decide, out_of_memory
from gpuq.model.errors import SpecError
from gpuq.model.markers import Marker, Phase, parse_marker
from gpuq.model.record import Record
from gpuq.model.spec import parse_spec_text, spec_text_with
from gpuq.model.states import State
from gpuq.run.retry import Failure

GIB = 1024


@pytest.mark.parametrize(
    ("tail", "framework", "tried"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has", "PyTorch", 2048),
        (
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
            "PyTorch",
            None,
        ),
        (
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor",
            "TensorFlow",
            None,
        ),
        (
            "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.",
            "JAX",
            16384,
        ),
        ("jax: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50GiB", "JAX", 1536),
        ("cupy.cuda.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory", "CUDA", None),
    ],
)
def test_each_frameworks_words_for_out_of_gpu_memory(tail, framework, tried):
    assert out_of_memory("epoch 3\n" + tail + "\n") == (framework, tried)


@pytest.mark.parametrize(
    "tail",
    [
        "MemoryError",  # the host's memory
        "Killed",  # the kernel's OOM killer
        "FileNotFoundError: data.csv",
        "torch.cuda.is_available() -> False",
        "",
    ],
)
def test_other_failures_are_not_out_of_gpu_memory(tail):
    assert out_of_memory(tail) is None


def _failure(spec: dict, peak: int | None = None, total: int | None = 24 * GIB, retries: int = 0) -> Failure:
    record = Record(id="j", state=State.RUNNING, spec={"gpus": 1, **spec}, failure_retries=retries, attempt=retries + 1)
    tail = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    return Failure(record, 1, None, tail, peak, total)


def test_the_next_ask_is_the_peak_plus_the_failed_allocation_and_a_quarter_more():
    retry = decide(_failure({"gpu_mem_mib": 8 * GIB}, peak=9 * GIB), {"retry_on_oom": 1})
    assert retry is not None and retry.changes == {"gpu_mem": "14GiB"}
    assert retry.why == "out of GPU memory (PyTorch); gpu_mem 8GiB -> 14GiB (retry_on_oom: 1 of 1)"


def test_unsampled_the_ask_is_what_it_declared_plus_what_it_tried():
    retry = decide(_failure({"gpu_mem_mib": 8 * GIB}), {"retry_on_oom": 1})
    assert retry is not None and retry.changes == {"gpu_mem": "13GiB"}  # (8 + 2) x 1.25, up to a GiB


def test_near_the_gpus_memory_it_asks_for_the_whole_gpu():
    retry = decide(_failure({"gpu_mem_mib": 18 * GIB, "gpu_compute_pct": 50}), {"retry_on_oom": 1})
    assert retry is not None and retry.changes == {"gpu_mem": None, "gpu_compute": None}
    assert "gpu_mem 18GiB -> the whole GPU" in retry.why


@pytest.mark.parametrize(
    ("spec", "settings", "retries"),
    [
        ({"gpu_mem_mib": 8 * GIB}, {"retry_on_oom": 1}, 1),  # its one retry is spent
        ({"gpu_mem_mib": 8 * GIB, "retry_on_oom": 0}, {"retry_on_oom": 3}, 0),  # the spec says never
        ({"gpu_mem_mib": 8 * GIB}, {"retry_on_oom": 0}, 0),  # the team says never
        ({"gpu_mem_mib": None}, {"retry_on_oom": 1}, 0),  # it had the whole GPU already
        ({"gpus": 0, "gpu_mem_mib": None}, {"retry_on_oom": 1}, 0),  # a CPU job
    ],
)
def test_no_retry(spec, settings, retries):
    assert decide(_failure(spec, retries=retries), settings) is None


def test_the_spec_allows_more_than_the_team_default():
    retry = decide(_failure({"gpu_mem_mib": 8 * GIB, "retry_on_oom": 2}, retries=1), {"retry_on_oom": 1})
    assert retry is not None and "(retry_on_oom: 2 of 2)" in retry.why


def test_a_spec_changed_for_a_retry_keeps_its_other_fields_and_is_checked():
    text = b"# mine\ncommand: |\n  python train.py\n  echo done\ngpus: 1\ngpu_mem: 8GiB\ngpu_compute: 50%\n"
    new = spec_text_with(text, {"gpu_mem": "12GiB"}, "out of GPU memory", "jobs/j.yaml")
    assert new.startswith(b"# out of GPU memory\n")
    spec = parse_spec_text(new, "jobs/j.yaml")
    assert spec.gpu_mem_mib == 12 * GIB and spec.command == "python train.py\necho done\n"
    whole = parse_spec_text(spec_text_with(text, {"gpu_mem": None, "gpu_compute": None}, "x", "f"), "f")
    assert whole.gpu_mem_mib is None and whole.gpu_compute_pct is None
    with pytest.raises(SpecError, match="gpu_compute"):  # a share of a GPU without gpu_mem is no spec
        spec_text_with(text, {"gpu_mem": None}, "x", "jobs/j.yaml")


def test_a_retry_marker_reads_back_as_written():
    marker = Marker(Phase.RETRY, "j@a@b@1@ff@a1.yaml", why="out of GPU memory", result={"gpu_mem": "12GiB"})
    read = parse_marker(json.dumps(marker.fields()).encode(), marker.claim)
    assert (read.phase, read.why, read.result) == (Phase.RETRY, "out of GPU memory", {"gpu_mem": "12GiB"})


def test_only_what_this_attempt_printed_counts_and_never_gpuqs_own_lines():
    log = (
        "==> gpuq job j · attempt 1 · host a · GPUs 0 · started 12:00\n"
        "==> command: python train.py\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "==> exit 1 · duration 3s\n"
        "==> gpuq: out of GPU memory (PyTorch); gpu_mem 4GiB -> 7GiB (retry_on_oom: 1 of 3)\n"
        "==> gpuq job j · attempt 2 · host a · GPUs 0 · started 12:01\n"
        "==> command: sh -c 'grep \"CUDA out of memory\" old.log; exit 2'\n"
        "FileNotFoundError: data.csv\n"
    )
    assert out_of_memory(attempt_output(log, "j", 2)) is None  # attempt 1's error, and the command line, are not its
    first = log.split("==> gpuq job j · attempt 2")[0]
    assert out_of_memory(attempt_output(first, "j", 1)) == ("PyTorch", 2048)
    assert attempt_output("...the tail of a long run\nCUDA out of memory\n", "j", 5).endswith("CUDA out of memory")


def test_sizes_in_any_unit_and_a_garbled_one_bounded():
    assert out_of_memory("CUDA out of memory. Tried to allocate 1.00 TiB") == ("PyTorch", 2**20)
    assert out_of_memory("CUDA out of memory. Tried to allocate 512.00 MiB") == ("PyTorch", 512)
    assert out_of_memory("CUDA out of memory. Tried to allocate 99999999999999999999999 GiB") == ("PyTorch", 2**30)


def test_a_job_that_must_never_run_twice_is_not_retried_unless_it_asks():
    assert decide(_failure({"gpu_mem_mib": 8 * GIB, "retries": 0}), {"retry_on_oom": 1}) is None
    assert decide(_failure({"gpu_mem_mib": 8 * GIB, "retries": 0, "retry_on_oom": 1}), {"retry_on_oom": 1})
