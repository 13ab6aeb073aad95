"""The docs a newcomer reads stay true: docs/reference.md's tables are the schema's, README stays
short, every relative link and anchor in README.md and docs/*.md leads somewhere, and
docs/design.md's package graph and package list are the code's."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from gpuq.model.config import KEYS, Config
from gpuq.model.spec import parse_spec_text
from gpuq.model.spec_fields import FIELDS
from gpuq.model.units import parse_duration_s
from tools import doc_tables as reference
from tools import layers

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
REFERENCE = DOCS / "reference.md"
# An extra's page is the README.md in its folder (gpuq/extras/NAME/).
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted((REPO / "gpuq" / "extras").glob("*/README.md"))]
EXTRAS = REPO / "gpuq" / "extras"


def test_the_reference_tables_are_the_schemas() -> None:
    assert reference.differences(REFERENCE.read_text()) == []


def test_the_spec_tables_defaults_are_the_codes() -> None:
    """The spec table's defaults are words for readers ("whole GPU", "config grace_s (10s)"); the
    ones that name a value name the value JobSpec and Config really default to."""
    spec, config = parse_spec_text(b'command: "true"\n', "jobs/x.yaml"), Config()  # every default
    literal = {"gpus": spec.gpus, "env": spec.env, "priority": spec.priority_class, "restart": spec.restart}
    for name, value in literal.items():
        assert FIELDS[name].default == (json.dumps(value) if isinstance(value, dict) else str(value)), name
    from_config = re.compile(r"config (\w+) \((.+)\)")
    for name, field in FIELDS.items():
        if (m := from_config.fullmatch(field.default)) is None:
            continue
        key, said = m.groups()
        attr, parse = KEYS[key]
        actual = getattr(config, attr)
        if said.startswith(("none", "no ")):
            assert actual is None, (name, key, actual)
        else:
            assert actual == parse(parse_duration_s(said) if said[-1].isalpha() else int(said)), (name, said, actual)
    assert {n for n, f in FIELDS.items() if from_config.fullmatch(f.default)} >= {"grace", "time_limit", "retries"}


def test_the_comparison_fails_when_docs_and_schema_differ() -> None:
    text = REFERENCE.read_text()
    # The schema changes: a new field, a changed default, a config key's new comment.
    more = dict(FIELDS, shm=dataclasses.replace(FIELDS["mem"], doc="Shared memory."))
    changed = dict(FIELDS, gpus=dataclasses.replace(FIELDS["gpus"], default="2"))
    config_text = reference.SHIPPED_CONFIG.read_text().replace("# Finished jobs listed", "# Jobs listed")
    for tables in (
        {reference.SPEC_FIELDS: reference.spec_fields_table(more)},
        {reference.SPEC_FIELDS: reference.spec_fields_table(changed)},
        {reference.CONFIG_KEYS: reference.config_keys_table(config_text)},
    ):
        assert reference.differences(text, tables), tables
    # The docs change: a cell edited by hand, or a table's markers lost.
    edited = text.replace("| `gpu_mem` |", "| `gpu_memory` |", 1)
    assert reference.differences(edited) and "gpu_mem" in reference.differences(edited)[0]
    unmarked = text.replace("<!-- generated: config keys -->", "")
    assert any("config keys" in p for p in reference.differences(unmarked))
    # ... and --write puts the schema's tables back.
    assert reference.differences(reference.replace_blocks(edited)) == []


def test_every_config_key_has_a_type_and_a_meaning() -> None:
    table = reference.config_keys_table()
    for key, (_, parse) in reference.config_mod.KEYS.items():
        assert reference.parser_type(parse), f"tools/doc_tables.py: no type text for {key}'s parser"
        row = next(line for line in table.splitlines() if line.startswith(f"| `{key}` |"))
        assert row.split(" | ")[3].strip(" |"), f"config.yaml has no comment for {key}"


def test_the_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move the detail into docs/"


def test_ci_runs_exactly_the_test_command_readme_gives() -> None:
    text = (REPO / "README.md").read_text().split("## First two commands", 1)[1]
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block, "README lost its first-two-commands block"
    tests = [line for line in block.group(1).splitlines() if line.strip()][1]
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == tests, f".ci/run ends with {ci[-1]!r}, README gives {tests!r}"


def _without_code(text: str) -> str:
    """The text with fenced blocks and inline code blanked (links and headings there are not)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "``", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces -> -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = slug(heading)
        name, n = base, 0
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def test_slugs_are_githubs() -> None:
    assert slug("Config reference (`config.yaml`)") == "config-reference-configyaml"
    assert slug("`gpuq status --json`") == "gpuq-status---json"
    assert slug("The job's environment") == "the-jobs-environment"
    assert slug("Placement: spread, then pack") == "placement-spread-then-pack"


def test_every_relative_link_and_anchor_leads_somewhere() -> None:
    assert (DOCS / "design.md").exists() and REFERENCE.exists()
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if dest.is_relative_to(EXTRAS) and not (EXTRAS / dest.relative_to(EXTRAS).parts[0]).exists():
                continue  # into an extra whose folder was deleted (tests/test_extras.py): the feature is gone
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading with that anchor in {dest.relative_to(REPO)}")
    assert broken == []


def test_the_readme_links_to_every_docs_page() -> None:
    readme = (REPO / "README.md").read_text()
    for page in sorted(DOCS.glob("*.md")):
        assert f"(docs/{page.name}" in readme, f"README.md does not link to docs/{page.name}"


def test_design_shows_the_package_graph_the_code_has() -> None:
    design = (DOCS / "design.md").read_text()
    block = design.split("<!-- printed by: python -m tools.layers -->", 1)[1].split("```")[1]
    *packages, size = block.strip().splitlines()  # the graph, then the size of the core and of the extras
    assert re.fullmatch(r"lines: core \d+, extras \d+ \(non-blank lines of Python; .*\)", size), size
    shown = {}
    for line in packages:
        package, deps = re.match(r"(\w+)\s+\(\s*\d+ modules\) -> (.*)$", line).groups()
        shown[package] = set() if deps == "(nothing of gpuq)" else set(deps.split(", "))
    graph = layers.package_graph(layers.edges())
    # The extras' line holds what the extras import together: a deleted extra (tests/test_extras.py)
    # can only take imports away from it.
    assert shown.pop("extras") >= set(graph["extras"]), "docs/design.md: paste `python -m tools.layers` anew"
    core = {p: set(graph[p]) for p in layers.ALLOWED if p != "extras"}
    assert shown == core, "docs/design.md: paste `python -m tools.layers` anew"


def test_design_lists_every_package_and_its_modules() -> None:
    design = (DOCS / "design.md").read_text()
    extras = [
        f"extras.{d.name}" for d in sorted((layers.PACKAGE_DIR / "extras").iterdir()) if (d / "__init__.py").exists()
    ]
    for package in [p for p in layers.ALLOWED if p != "extras"] + extras:  # an extra's row: gpuq.extras.NAME
        row = next((line for line in design.splitlines() if line.startswith(f"| `gpuq.{package}` |")), None)
        assert row, f"docs/design.md lists no package gpuq.{package}"
        listed = set(re.findall(r"`(\w+)`", row.split(" | ")[-1]))
        folder = layers.PACKAGE_DIR.joinpath(*package.split("."))
        present = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        assert listed == present, f"docs/design.md, gpuq.{package}: lists {sorted(listed)}, has {sorted(present)}"
