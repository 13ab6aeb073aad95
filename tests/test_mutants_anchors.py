"""`python -m tools.mutants` is run by hand, not in the suite (minutes); its mutants are text
anchors in the code. A change that moves an anchor left the tool dead until someone ran it
(the one-link mutant's, for a day): each anchor must occur exactly once where it points."""

from __future__ import annotations

import pytest

from tools.mutants import CHECKOUT, MUTANTS


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_mutant_s_anchor_occurs_once_in_its_file(name: str) -> None:
    mutant = MUTANTS[name]
    assert (CHECKOUT / mutant.file).read_text().count(mutant.old) == 1, f"{name}: move its anchor with the code"
    for test in mutant.tests:
        assert (CHECKOUT / test.split("::")[0]).is_file(), f"{name}: {test} is no test file"
