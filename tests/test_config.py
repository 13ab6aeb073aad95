from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import remove_local_dir
from gpuq.model import config as config_mod
from gpuq.model.config import Config, ConfigError, validate
from gpuq.single_instance import default_local_dir, this_host

REPO = Path(__file__).resolve().parent.parent


def test_shipped_config_is_the_defaults_and_documents_every_key():
    text = (REPO / "config.yaml").read_text()
    assert config_mod.load(REPO / "config.yaml") == Config()
    for key in config_mod.documented_keys():
        assert f"\n{key}:" in text, f"config.yaml does not document {key}"
    readme = (REPO / "docs" / "reference.md").read_text()
    for key in config_mod.documented_keys():
        assert f"`{key}`" in readme, f"docs/reference.md's config reference lacks {key}"


def test_values_and_placeholders(tmp_path):
    cfg = validate(
        {"poll_interval": 0.5, "gpu_mem_reserve": "1GiB", "gpus": {"a": [0, 1]}, "local_dir": "/var/tmp/gpuq-{host}"},
        "c.yaml",
    )
    assert cfg.gpu_mem_reserve_mib == 1024 and cfg.offered_gpus("a") == [0, 1]
    assert cfg.offered_gpus("b") is None
    from gpuq.spool.layout import Layout

    assert str(Layout(tmp_path).local_dir("box", cfg.local_dir)) == "/var/tmp/gpuq-box"


@pytest.mark.parametrize(
    "data,needle",
    [
        ({"poll_intervall": 1}, "unknown key 'poll_intervall'"),
        ({"poll_interval": -1}, "positive"),
        ({"gpu_mem_reserve": 256}, "unit"),
        ({"gpus": {"a": "all"}}, "lists of GPU indices"),
        ({"local_dir": "relative"}, "absolute path"),
        ([1, 2], "mapping"),
    ],
)
def test_bad_config_names_key_and_fix(data, needle):
    with pytest.raises(ConfigError) as err:
        validate(data, "config.yaml")
    assert needle in str(err.value) and "config.yaml" in str(err.value)


@pytest.mark.slow
def test_worker_refuses_bad_config_clearly(tmp_path):
    import subprocess
    import sys

    (tmp_path / "jobs").mkdir()
    (tmp_path / "config.yaml").write_text("max_jobs_per_gpu: lots\n")
    try:  # as cron starts it: no --host, and the config (unread yet) names no local_dir
        proc = subprocess.run(
            [sys.executable, str(REPO / "worker.py"), "--root", str(tmp_path), "--once"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        remove_local_dir(default_local_dir(str(tmp_path.resolve()), this_host()))
    assert proc.returncode == 2
    assert "max_jobs_per_gpu" in proc.stderr and "config.yaml" in proc.stderr


def test_package_version_matches_pyproject():
    import tomllib

    import gpuq

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == gpuq.__version__
    assert project["name"] != "gpuq"  # taken on PyPI by an unrelated project


def test_a_key_written_twice_is_named(tmp_path):
    """A review: "config.yaml: key appears twice" left the reader to find which of 80 lines."""
    from gpuq.model.config import load

    path = tmp_path / "config.yaml"
    path.write_text("poll_interval: 1\nmetrics_dir: /x\npoll_interval: 2\n")
    with pytest.raises(ConfigError, match=r"config.yaml: key 'poll_interval': key appears twice\. Fix: keep one"):
        load(path)


def test_the_worker_says_its_usage_under_the_name_it_was_started_by(monkeypatch, capsys):
    from gpuq import worker_main

    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/gpuq-worker", "--help"])
    with pytest.raises(SystemExit):
        worker_main.parse_args(["--help"])
    assert capsys.readouterr().out.startswith("usage: gpuq-worker ")


def test_a_root_workers_local_dir_falls_back_to_a_directory_only_root_can_change(monkeypatch):
    """Without a /run only root can change, it was /var/tmp/gpuq-0: /var/tmp is anyone's, and
    a member who made gpuq-0 there first kept the worker from starting (an attack review).
    /var/lib, root's alone, comes before it."""
    from gpuq import single_instance

    for roots_alone, expected in (
        ({"/run", "/var/lib"}, "/run/gpuq/"),
        ({"/var/lib"}, "/var/lib/gpuq/"),
        (set(), "/var/tmp/gpuq-0/"),
    ):
        monkeypatch.setattr(single_instance, "_only_root_can_change", lambda d, alone=roots_alone: d in alone)
        assert single_instance.default_local_dir("/q", "a", root_started=True).startswith(expected)
