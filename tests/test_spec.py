"""Spec parsing and validation: every refusal names the file, the field and the fix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.model.errors import SpecError
from gpuq.model.spec import FIELDS, JobSpec, parse_spec_text, validate_spec
from gpuq.model.units import format_limit, format_mib, parse_size_mib, parse_slurm_time_s


def parse(text: str | bytes) -> JobSpec:
    return parse_spec_text(text.encode() if isinstance(text, str) else text, "jobs/x.yaml")


def test_the_readme_example():
    spec = parse("command: python train.py --lr 3e-4\ngpus: 1\ngpu_mem: 20GiB\n")
    assert spec.command == "python train.py --lr 3e-4"
    assert (spec.gpus, spec.gpu_mem_mib, spec.exclusive) == (1, 20480, False)
    assert (spec.priority_class, spec.priority) == ("normal", 0)


def test_defaults_and_list_command():
    spec = parse("command: [python, train.py]\n")
    assert spec.command == ("python", "train.py")
    assert spec.gpus == 1 and spec.gpu_mem_mib is None and spec.exclusive
    assert spec.command_text() == "python train.py"


@pytest.mark.parametrize(
    "size,mib",
    [
        ("20GiB", 20480),
        ("20G", 20480),
        ("20480MiB", 20480),
        ("1.5GiB", 1536),
        ("1TiB", 1024**2),
        ("20GB", 20480),
        ("20gb", 20480),
        ("20g", 20480),
        ("1tb", 1024**2),
        ("8000K", 8),  # sbatch's --mem 8000K: 7.8 MiB, never rounded down
        ("2048k", 2),
    ],
)
def test_sizes(size, mib):
    assert parse_size_mib(size) == mib


@pytest.mark.parametrize("size", ["20 gigs", "20", "GiB", "-1GiB", "", "20XB"])
def test_bad_sizes(size):
    with pytest.raises(ValueError):
        parse_size_mib(size)


def test_format_mib():
    assert format_mib(20480) == "20GiB" and format_mib(1536) == "1.5GiB" and format_mib(700) == "700MiB"


@pytest.mark.parametrize(
    "text,field,fix",
    [
        ("gpus: 1\n", "command", "command: python train.py"),
        ("command: ''\n", "command", "write the command"),
        ("command: [5]\n", "command", "command: python train.py"),
        ("command: true\n", "command", 'quote it: `command: "true"`'),
        ("command: x\ngpus: two\n", "gpus", "gpus: 1"),
        ("command: x\ngpus: -1\n", "gpus", "0 to 64"),
        ("command: x\ngpus: 1.5\n", "gpus", "gpus: 1"),
        ("command: x\ngpus: true\n", "gpus", "gpus: 1"),
        ("command: x\ngpu_mem: 20 gigs\n", "gpu_mem", "20GiB"),
        ("command: x\ngpu_mem: 20\n", "gpu_mem", "20GiB"),
        ("command: x\npriority: urgent\n", "priority", "high, normal, low"),
        ("command: x\nworkdir: relative/dir\n", "workdir", "full path"),
        ("command: x\nenv: {A: 1}\n", "env", "quote it"),
        ("command: x\nenv: [A]\n", "env", "NAME: value"),
        ("command: x\nhosts: 3\n", "hosts", "hosts: [box-a"),
        ("command: x\ngpu_memory: 2GiB\n", "gpu_memory", "gpu_mem"),
        ("command: x\ncommand: y\n", "command", "keep one"),
    ],
)
def test_invalid_fields_name_field_and_fix(text, field, fix):
    with pytest.raises(SpecError) as err:
        parse(text)
    assert err.value.field == field
    assert fix in str(err.value)
    assert str(err.value).startswith("jobs/x.yaml")


@pytest.mark.parametrize(
    "text,problem",
    [
        ("command: [unclosed\n", "not valid YAML"),
        ("a: &x [1, 2]\nb: *x\n", "aliases"),
        ("command: !!python/object/apply:os.system [ls]\n", "uses a YAML tag gpuq never constructs"),
        ("- just\n- a list\n", "mapping"),
        ("", "mapping"),
        (b"command: \xff\xfe\n", "UTF-8"),
        ("command: x\x00\n", "NUL"),
        ("x: " + "[" * 100 + "]" * 100 + "\n", "nesting"),
    ],
)
def test_whole_file_problems(text, problem):
    with pytest.raises(SpecError) as err:
        parse(text)
    assert problem in str(err.value)


def test_good_variants_crlf_bom_comments():
    assert parse("\ufeff# a comment\r\ncommand: echo hi\r\ngpus: 0 # cpu\r\n").gpus == 0


def test_schema_is_documented_in_readme():
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "docs" / "reference.md").read_text()
    for name in FIELDS:
        assert f"`{name}`" in readme, f"docs/reference.md's spec reference lacks {name}"


def test_round_trip_through_json():
    spec = parse("command: [a, b]\ngpus: 2\ngpu_mem: 3GiB\npriority: 5\nenv: {A: b}\nhosts: [h]\n")
    assert JobSpec.from_json(spec.to_json()) == spec


# The two fuzz tests that draw nested values take seconds of CPU each (hypothesis drawing 300
# examples): slow, so the fast set stays a quick loop; the full suite runs them.
@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda children: st.lists(children) | st.dictionaries(st.text(), children),
        max_leaves=20,
    )
)
def test_fuzz_validate_raises_only_spec_error(data):
    try:
        validate_spec({"command": "x", **data} if isinstance(data, dict) else data, "f.yaml")
    except SpecError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_fuzz_parser_raises_only_spec_error(blob):
    try:
        parse(blob)
    except SpecError:
        pass


_ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=10,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(FIELDS)), _ANY, max_size=len(FIELDS)))
def test_fuzz_known_fields_with_any_values_through_yaml(data):
    import yaml

    try:
        parse(yaml.safe_dump(data).encode())
    except SpecError:
        pass


def test_a_key_that_is_a_mapping_or_a_list_is_a_spec_error():
    """Found by the fuzz test below (hypothesis): `{{}}` made the loader raise TypeError."""
    for blob in (b"{{}}", b"[a]: 1\n", b"{? [1, 2] : x}"):
        with pytest.raises(SpecError, match="not a name"):
            parse_spec_text(blob, "jobs/x.yaml")


def test_the_shared_cache_form_gives_back_the_same_spec():
    from gpuq.model.spec import JobSpec, parse_spec_text

    for text in (
        b"command: python train.py\ngpus: 1\ngpu_mem: 70GiB\n",
        b"command: [a, '{lr}']\ngpus: 2\nenv: {A: b}\nhosts: [x]\nafter: [q]\nsweep: {lr: [1, 2]}\n",
        b"command: x\nvenv: /shared/envs/p\nsetup: ['a']\npriority: low\n",
    ):
        spec = parse_spec_text(text, "f")
        assert JobSpec.from_cache(spec.to_cache()) == spec == JobSpec.from_json(spec.to_json())


def test_a_huge_array_range_is_refused_before_it_is_built():
    from gpuq.model.groups import GroupError, parse_array

    with pytest.raises(GroupError, match="makes 100000000000 jobs or more; at most"):
        parse_array("0-99999999999")  # built first, it was a MemoryError (50 million: 1.9 GB)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 5400),  # minutes, as sbatch reads a bare number
        ("30:00", 1800),  # minutes:seconds
        ("1:30", 120),  # seconds rounded up to a whole minute, as sbatch does
        ("0:0:1", 60),
        ("1:30:00", 5400),  # hours:minutes:seconds
        ("2-12", 216000),  # days-hours
        ("1-00:30", 88200),  # days-hours:minutes
        ("1-00:30:15", 88260),  # days-hours:minutes:seconds, rounded up to a minute
        ("90m", 5400),  # gpuq's own units too
        ("1.5h", 5400),
    ],
)
def test_a_time_limit_on_the_command_line_is_read_as_sbatch_reads_it(text, seconds):
    assert parse_slurm_time_s(text) == seconds
    assert parse_slurm_time_s(format_limit(seconds)) == seconds  # what submit writes into the spec


@pytest.mark.parametrize("text", ["1:2:3:4", "1.5", "2-", "-5", "1-2-3", "90 minutes", "\u0663", "0:0", "0-0"])
def test_a_time_sbatch_would_not_read_is_refused_with_the_forms_it_takes(text):
    with pytest.raises(ValueError, match="not a time|no time"):
        parse_slurm_time_s(text)


@pytest.mark.parametrize("text", ["0", "UNLIMITED", "infinite"])
def test_sbatchs_no_limit_is_refused_saying_what_to_do_instead(text):
    with pytest.raises(ValueError, match="is not one gpuq has; leave the option out for the queue's default"):
        parse_slurm_time_s(text)


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("1:30", 120),  # never YAML 1.1's base-60 integer 90: sbatch's MM:SS, rounded up to a minute
        ("1:30:00", 5400),  # sbatch's HH:MM:SS
        ("'01:30'", 120),
        ("'2-12'", 216000),
        ("90", 90),  # a number in a spec is seconds, as it always was
        ("90m", 5400),
    ],
)
def test_a_spec_reads_sbatch_times_the_same_way(value, seconds):
    spec = parse_spec_text(f"command: x\ntime_limit: {value}\n".encode(), "jobs/t.yaml")
    assert spec.time_limit_s == seconds


def test_no_spec_field_is_read_as_a_base_60_number():
    """YAML 1.1 reads 1:30 as 90: a spec's grace: 1:30 is sbatch's 1:30, and gpus: 1:30 no number."""
    spec = parse_spec_text(b"command: x\ngrace: 1:30\ngpus: 1\n", "jobs/t.yaml")
    assert spec.grace_s == 120
    with pytest.raises(SpecError, match="gpus"):
        parse_spec_text(b"command: x\ngpus: 1:30\n", "jobs/t.yaml")


@pytest.mark.parametrize("spec", [{"priority": "low"}, {"preemptible": True}], ids=["low", "preemptible"])
def test_an_opportunistic_jobs_grace_is_at_most_ten_minutes(spec):
    """A member: a low job with `grace: 1d` that ignored SIGTERM, told to yield, held two GPUs
    for a day for the job that needed them. A person writing such a spec is refused; one
    already in the queue (accepted before, or put back after a preemption) and config grace_s
    are held to ten minutes. Ordinary jobs may still take a day."""
    from gpuq.model.spec import stop_grace_s

    assert validate_spec({"command": "x", "grace": "10m", **spec}, "jobs/ok.yaml", new=True).grace_s == 600
    with pytest.raises(SpecError) as refused:
        validate_spec({"command": "x", "grace": "1d", **spec}, "jobs/huge.yaml", new=True)
    assert str(refused.value) == (
        "jobs/huge.yaml: field 'grace': 1d is longer than an opportunistic job may take to yield (10m): the job "
        "that needs its GPU would wait that long. Fix: give `grace: 10m` or less, or make it an ordinary job."
    )
    assert validate_spec({"command": "x", "grace": "1d", **spec}, "jobs/huge.yaml").grace_s == 600
    assert validate_spec({"command": "x", "grace": "1d"}, "jobs/ok.yaml", new=True).grace_s == 86400
    assert stop_grace_s(None, True, 3600.0) == 600 and stop_grace_s(None, False, 3600.0) == 3600


def test_the_note_of_a_command_not_found_gives_the_path_the_job_had_even_an_empty_one():
    """`env: {PATH: ""}` exits 127, and the note said the default PATH (a review)."""
    from gpuq.run.launch import shell_exit_note

    empty = parse_spec_text(b"command: [prog]\nenv: {PATH: ''}\n", "f.yaml")
    assert "the job's PATH was (empty) and" in (shell_exit_note(127, empty, None) or "")
    own = parse_spec_text(b"command: [prog]\nenv: {PATH: /opt/bin}\n", "f.yaml")
    assert "the job's PATH was /opt/bin and" in (shell_exit_note(127, own, None) or "")
