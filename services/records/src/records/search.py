"""Search across objects: one statement, a ranked scan of each readable object's search index.

The query is split into words (terms), folded like the index (lower + unaccent). A record
matches when every term matches its searchable text: a term of three or more characters as a
substring or, typo-tolerant, by trigram word similarity (`<%`, at least SIMILARITY); a shorter
term as the start of a word. Each term scores the similarity plus a boost: 2 when the text starts
with it, 1.5 when a word does, 1 for a substring; the record's score is the mean over the terms.
Results are ordered by score, object name and id, keyset-paged by an opaque cursor.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2
from crmkit.authz import Access
from crmkit.errors import InvalidArgument
from records import search_ddl
from records.context import RequestContext
from records.model import ObjectModel
from records.predicates import owner_predicate
from records.sql import Params, literal, quote

DEFAULT_FIRST = 20
MAX_FIRST = 100
MAX_QUERY = 200
MAX_TERMS = 8
SHORT_TERM = 3  # terms shorter than this match word starts only (no substring trigrams)
SIMILARITY = 0.5  # pg_trgm word similarity a typo-tolerant match needs
MAX_CANDIDATES = 2000  # matches ranked per object and page (docs/api.md, "Search")
FUZZY_CANDIDATES = 100  # the same when typo-tolerant matches are searched for
_SCORE = '"_search score"'  # a column alias no field name can take


@dataclass(frozen=True)
class Term:
    prefix: str  # placeholders of the folded LIKE patterns: text start, word start, substring
    word: str
    substring: str
    folded: str  # placeholder of the folded term
    short: bool


@dataclass(frozen=True)
class Cursor:
    score: float
    object: str
    id: str


def _escape(term: str) -> str:
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def parse_terms(query: str) -> list[str]:
    text = query.strip()
    if not text:
        raise InvalidArgument("query must not be empty", field="query")
    if "\x00" in text:
        raise InvalidArgument("query must not contain NUL characters", field="query")
    if len(text) > MAX_QUERY:
        raise InvalidArgument(f"query must be at most {MAX_QUERY} characters", field="query")
    terms = text.split()
    if len(terms) > MAX_TERMS:
        raise InvalidArgument(f"query must have at most {MAX_TERMS} words", field="query")
    return terms


def page_size(first: int) -> int:
    if first == 0:
        return DEFAULT_FIRST
    if not 1 <= first <= MAX_FIRST:
        raise InvalidArgument(f"first must be between 1 and {MAX_FIRST}", field="first")
    return first


def encode_cursor(score: float, object_name: str, record_id: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([score, object_name, record_id])).decode()


def decode_cursor(text: str) -> Cursor:
    try:
        score, object_name, record_id = orjson.loads(base64.urlsafe_b64decode(text.encode()))
        return Cursor(float(score), str(object_name), str(uuid.UUID(record_id)))
    except (ValueError, TypeError, AttributeError):
        raise InvalidArgument("after: not a search cursor", field="after") from None


def _bind_terms(terms: list[str], params: Params) -> list[Term]:
    fold = search_ddl.FOLD
    bound = []
    for term in terms:
        escaped = _escape(term)
        bound.append(
            Term(
                prefix=f"{fold}({params.add(escaped + '%', 'text')})",
                word=f"{fold}({params.add('% ' + escaped + '%', 'text')})",
                substring=f"{fold}({params.add('%' + escaped + '%', 'text')})",
                folded=f"{fold}({params.add(term, 'text')})",
                short=len(term) < SHORT_TERM,
            )
        )
    return bound


class _Statement:
    def __init__(
        self, ctx: RequestContext, trigram: str, terms: list[Term], size: int, fuzzy: bool
    ) -> None:
        self.ctx = ctx
        self.trigram = quote(trigram)
        self.terms = terms
        self.size = size
        self.fuzzy = fuzzy  # typo-tolerant matches too, not only LIKE ones

    def _similar(self, term: Term, text: str) -> str:
        return f"{term.folded} OPERATOR({self.trigram}.<%) {text}"

    def _matches(self, term: Term, text: str) -> str:
        if term.short:
            return f"({text} LIKE {term.prefix} OR {text} LIKE {term.word})"
        if not self.fuzzy:
            return f"{text} LIKE {term.substring}"
        return f"({text} LIKE {term.substring} OR {self._similar(term, text)})"

    def _score(self, text: str) -> str:
        """Per term: 3 when the text starts with it, 2.5 when a word does, 2 for a substring,
        else its word similarity (below 1). The record's score is its weakest term's, plus a
        thirtieth of the mean, less up to 0.05 for long texts (so within a tier the closer,
        shorter text comes first): a record every term of which LIKE-matches always ranks above
        one that needs a typo-tolerant match, which lets `search` look for those only when the
        LIKE matches do not fill the page."""
        parts = [
            f"CASE WHEN {text} LIKE {t.prefix} THEN 3.0 WHEN {text} LIKE {t.word} THEN 2.5 "
            f"WHEN {text} LIKE {t.substring} THEN 2.0 "
            f"ELSE {self.trigram}.word_similarity({t.folded}, {text}) END"
            for t in self.terms
        ]
        weakest = parts[0] if len(parts) == 1 else f"least({', '.join(parts)})"
        return (
            f"({weakest} + ({' + '.join(parts)}) / {30 * len(parts)} "
            f"- least(length({text}), 1000) / 20000.0)::float8"
        )

    def matched(self, objects: list[ObjectModel], alias: str) -> str:
        """The searchable fields of each result that match, from its record JSON `alias.v`."""
        branches = []
        for obj in objects:
            cases = []
            for item in search_ddl.searchable_fields(obj):
                text = f"{search_ddl.FOLD}({alias}.v ->> {literal(item.key)})"
                hit = " OR ".join(self._matches(term, text) for term in self.terms)
                cases.append(f"CASE WHEN {hit} THEN {literal(item.name)} END")
            branches.append(
                f"WHEN {literal(obj.name_singular)} THEN "
                f"array_remove(ARRAY[{', '.join(cases)}]::text[], NULL)"
            )
        return f"CASE {alias}.o {' '.join(branches)} ELSE '{{}}'::text[] END"

    def object_scan(
        self, obj: ObjectModel, access: Access, after: Cursor | None, params: Params
    ) -> str:
        column = quote(search_ddl.column_name(search_ddl.searchable_fields(obj)))
        where = [
            't."deletedAt" IS NULL',
            *(self._matches(term, f"t.{column}") for term in self.terms),
        ]
        owner = owner_predicate("t", access, params)
        if owner:
            where.append(owner)
        score = self._score(f"c.{column}")
        ranked = [self._after(obj, score, after, params)] if after is not None else []
        name = literal(obj.name_singular)
        candidates = FUZZY_CANDIDATES if self.fuzzy else MAX_CANDIDATES
        # At most MAX_CANDIDATES matches per object are ranked: a word in thousands of records
        # would otherwise cost a heap fetch and a score for each of them.
        return (
            f"SELECT {name} AS o, x.id, x.{_SCORE} AS score, "
            f"({obj.json_expression('x')})::text AS j FROM ("
            f"SELECT c.*, {score} AS {_SCORE} FROM ("
            f"SELECT t.* FROM {obj.table} t WHERE {' AND '.join(where)} "
            f"LIMIT {candidates}) c WHERE {' AND '.join(ranked) or 'TRUE'} "
            f"ORDER BY {_SCORE} DESC, c.id LIMIT {self.size + 1}) x"
        )

    @staticmethod
    def _after(obj: ObjectModel, score: str, after: Cursor, params: Params) -> str:
        """Rows after the cursor in (score DESC, object, id) order, within this object."""
        cut = params.add(after.score, "float8")
        if obj.name_singular < after.object:
            return f"{score} < {cut}"
        if obj.name_singular > after.object:
            return f"{score} <= {cut}"
        return f"({score} < {cut} OR ({score} = {cut} AND c.id > {params.add(after.id, 'uuid')}))"


def _objects(ctx: RequestContext, names: list[str]) -> list[ObjectModel]:
    if not names:
        chosen = [obj for obj in ctx.model.objects.values() if obj.is_active]
    else:
        chosen = []
        for name in names:
            found = ctx.model.object(name)
            if found is None:
                raise InvalidArgument(f"objects: unknown object {name!r}", field="objects")
            if found not in chosen:
                chosen.append(found)
    return sorted(chosen, key=lambda obj: obj.name_singular)


@dataclass(frozen=True)
class Plan:
    sql: str  # empty: no object to search
    params: list[Any]
    size: int
    after: Cursor | None


def plan(
    ctx: RequestContext, trigram: str, request: records_pb2.SearchRequest, *, fuzzy: bool
) -> Plan:
    """The statement answering `request` (checked), and its parameters: LIKE matches only, or
    (`fuzzy`) typo-tolerant ones too."""
    terms = parse_terms(request.query)
    size = page_size(request.first)
    objects = _objects(ctx, list(request.objects))
    after = decode_cursor(request.after) if request.after else None
    params = Params()
    statement = _Statement(ctx, trigram, _bind_terms(terms, params), size, fuzzy)
    scans, searched = [], []
    for obj in objects:
        access = ctx.read_access(obj)
        if access is None or not search_ddl.searchable_fields(obj):
            continue  # objects the caller cannot read are skipped, not refused
        searched.append(obj)
        scans.append(f"({statement.object_scan(obj, access, after, params)})")
    if not scans:
        return Plan("", [], size, after)
    order = 'ORDER BY score DESC, o COLLATE "C", id'
    # Matched fields are worked out for the final page only (from its record JSON).
    sql = (
        f"SELECT o, id::text, score, j, {statement.matched(searched, 'page')} FROM ("
        f"SELECT o, id, score, j, j::json AS v FROM ({' UNION ALL '.join(scans)}) r "
        f"{order} LIMIT {size + 1}) page {order}"
    )
    return Plan(sql, params.values, size, after)


async def execute(connection: Any, sql: str, params: list[Any]) -> list[Any]:
    """Runs a planned search. Sequential scans are off for it: the planner costs the `<%`
    operator like a comparison, so on tables of a few hundred rows it chose to compute a
    trigram similarity per row (20 ms for 800 rows) instead of using the search index (1 ms)."""
    async with connection.transaction(readonly=True):
        await connection.execute(
            f"SET LOCAL pg_trgm.word_similarity_threshold = {SIMILARITY}; "
            "SET LOCAL enable_seqscan = off"
        )
        rows: list[Any] = await connection.fetch(sql, *params)
    return rows


async def find(
    connection: Any, ctx: RequestContext, trigram: str, request: records_pb2.SearchRequest
) -> tuple[list[Any], Plan]:
    """The rows of a page: LIKE matches first; typo-tolerant ones only when those do not fill
    the page (they always rank below, see `_Statement._score`), since finding them costs a
    trigram comparison per candidate."""
    planned = plan(ctx, trigram, request, fuzzy=False)
    if not planned.sql:
        return [], planned
    rows = await execute(connection, planned.sql, planned.params)
    if len(rows) > planned.size:
        return rows, planned
    fuzzy = plan(ctx, trigram, request, fuzzy=True)
    if fuzzy.sql == planned.sql:  # only short words: nothing typo-tolerant to add
        return rows, planned
    return await execute(connection, fuzzy.sql, fuzzy.params), fuzzy


async def search(
    connection: Any, ctx: RequestContext, trigram: str, request: records_pb2.SearchRequest
) -> records_pb2.SearchResponse:
    rows, planned = await find(connection, ctx, trigram, request)
    if not planned.sql:
        return records_pb2.SearchResponse(page_info=common_pb2.PageInfo())
    size, after = planned.size, planned.after
    more = len(rows) > size
    hits = [
        records_pb2.SearchHit(
            object=row[0],
            record_json=row[3].encode(),
            score=row[2],
            matched_fields=list(row[4]),
            cursor=encode_cursor(row[2], row[0], row[1]),
        )
        for row in rows[:size]
    ]
    info = common_pb2.PageInfo(
        has_next_page=more,
        has_previous_page=after is not None,
        start_cursor=hits[0].cursor if hits else "",
        end_cursor=hits[-1].cursor if hits else "",
    )
    return records_pb2.SearchResponse(hits=hits, page_info=info)
