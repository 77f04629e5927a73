"""Pure logic of search: the statements it builds (records/search.py) for exact and
typo-tolerant matching; the searches themselves are in tests/integration/test_search.py."""

from __future__ import annotations

import re

import pytest

from crm.metadata.v1 import metadata_pb2 as md
from crmkit.authz import Access
from crmkit.errors import InvalidArgument
from records import search
from records.model import WorkspaceModel

WS = "11111111-2222-4333-8444-555555555555"
OWNER = "99999999-2222-4333-8444-555555555555"


def _model() -> WorkspaceModel:
    def text(index: int, name: str) -> md.FieldMetadata:
        return md.FieldMetadata(
            id=f"bbbbbbbb-0000-4000-8000-00000000000{index}", name=name,
            type=md.FIELD_TYPE_TEXT, is_active=True, is_nullable=True, is_searchable=True,
        )  # fmt: skip

    person = md.ObjectMetadata(
        id="aaaaaaaa-0000-4000-8000-000000000001", name_singular="person", name_plural="people",
        is_active=True, fields=[text(1, "firstName"), text(2, "lastName")],
    )  # fmt: skip
    company = md.ObjectMetadata(
        id="aaaaaaaa-0000-4000-8000-000000000002", name_singular="company",
        name_plural="companies", is_active=True, fields=[text(3, "name")],
    )  # fmt: skip
    return WorkspaceModel.from_proto(
        md.WorkspaceSchema(workspace_id=WS, version=1, objects=[person, company])
    )


def _query(*, own: bool = False, after: search.Cursor | None = None) -> search.Query:
    model = _model()
    access = Access(own_records_only=own, owner_id=OWNER if own else "")
    found = [model.object(name) for name in ("company", "person")]
    objects = [(obj, access) for obj in found if obj is not None]
    return search.Query("", 20, objects, after)


def _bound(plan: search.Plan) -> None:
    """Every parameter is referred to (an unused one is an error in PostgreSQL), once bound."""
    used = {int(number) for number in re.findall(r"\$(\d+)", plan.sql)}
    assert used == set(range(1, len(plan.params) + 1))


def test_exact_statements_match_as_typed_and_bind_patterns_escaped() -> None:
    planned = search.plan("records", _query(), ["dup_nt", "ab"])
    _bound(planned)
    assert "<%" not in planned.sql
    assert "word_similarity" not in planned.sql
    # A term of three or more characters anywhere, a shorter one at a word start; the
    # wildcards typed are literal.
    assert "%dup\\_nt%" in planned.params
    assert {"ab%", "% ab%"} <= set(planned.params)
    assert f"LIMIT {search.MAX_CANDIDATES}" in planned.sql


def test_typo_statements_match_only_the_flagged_terms_by_similarity() -> None:
    planned = search.plan("records", _query(), ["jean", "dupomt"], [False, True])
    _bound(planned)
    assert planned.sql.count('OPERATOR("records".<%)') >= 2  # a condition per object
    assert "dupomt" in planned.params
    assert "jean" not in planned.params
    assert "%jean%" in planned.params
    assert "%dupomt%" not in planned.params
    assert f"LIMIT {search.FUZZY_CANDIDATES}" in planned.sql


def test_statements_follow_the_cursor_and_the_owner() -> None:
    after = search.Cursor(0.7, "company", "01234567-0000-4000-8000-000000000000")
    planned = search.plan("records", _query(own=True, after=after), ["dupomt"], [True])
    _bound(planned)
    assert OWNER in planned.params
    assert 0.7 in planned.params
    assert '"ownerId" =' in planned.sql


def test_the_probe_asks_about_every_term_of_three_or_more_characters() -> None:
    probe = search.unmatched(_query(own=True), ["ab", "jean", "dupomt"])
    _bound(probe)
    assert probe.sql.startswith("SELECT ARRAY[FALSE, NOT (EXISTS")
    assert probe.sql.count("EXISTS") == 4  # two terms, two objects
    assert "%jean%" in probe.params
    assert "%dupomt%" in probe.params
    assert OWNER in probe.params


def test_every_typo_match_scores_below_every_exact_one() -> None:
    # The scores' bounds (records/search.py, _Statement._score): a typo-tolerant match's
    # weakest term is a similarity (at most 1), an exact match's at least 2.
    for count in range(1, search.MAX_TERMS + 1):
        best_typo = 1 + (1 + 3 * (count - 1)) / (30 * count)
        worst_exact = 2 + 2 / 30 - 1000 / 20000
        assert best_typo < search.TYPO_SCORES_BELOW < worst_exact


def test_bad_requests_are_refused_naming_the_parameter() -> None:
    for query in ("", "   ", "x" * 201, "a\x00b", " ".join("w" * 9)):
        with pytest.raises(InvalidArgument) as raised:
            search.parse_terms(query)
        assert raised.value.field == "query"
    with pytest.raises(InvalidArgument):
        search.decode_cursor("not a cursor")
    cursor = search.encode_cursor(2.5, "person", "01234567-0000-4000-8000-000000000000")
    assert search.decode_cursor(cursor) == search.Cursor(
        2.5, "person", "01234567-0000-4000-8000-000000000000"
    )
