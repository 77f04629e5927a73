"""Search across objects: a ranked scan of each readable object's search index, in one statement.

The query is split into words (terms), folded like the index (lower + unaccent). A record
matches when every term matches its searchable text exactly: a term of three or more characters
as a substring, a shorter one as the start of a word. Only when no record matches every term
exactly is a second statement run that is typo-tolerant: there, each term of three or more
characters that no searched record contains as typed matches by trigram word similarity (`<%`,
at least SIMILARITY) instead, the others as before. Scores are tiered (`_Statement._score`);
results are ordered by score, object name and id, keyset-paged by an opaque cursor. A search
runs on a connection of records' search pool, whose sessions carry its settings
(`SESSION_SETTINGS`), as up to four statements without a transaction around them (they only read):
the query folded, the exact statement and, when needed, the probe for words found as typed
(`unmatched`) and the typo-tolerant statement.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from functools import cached_property
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
TYPO_SCORES_BELOW = 1.5  # every typo-tolerant match scores below this, every exact one above
MAX_CANDIDATES = 2000  # matches ranked per object and page (docs/api.md, "Search")
FUZZY_CANDIDATES = 50  # the same when typo-tolerant matches are searched for
_SCORE = '"_search score"'  # a column alias no field name can take


class Term:
    """A folded word of the query and the placeholders of its LIKE patterns (text start, word
    start, substring) and of the word itself, each bound on first use: a statement binds only
    the values it refers to (a parameter no statement uses would be an error). `typo`: matched
    by similarity, not as typed."""

    def __init__(self, text: str, params: Params, typo: bool = False) -> None:
        self.text = text
        self.params = params
        self.short = len(text) < SHORT_TERM  # matched exactly only, typo-tolerant or not
        self.typo = typo

    @cached_property
    def prefix(self) -> str:
        return self.params.add(_escape(self.text) + "%", "text")

    @cached_property
    def word(self) -> str:
        return self.params.add("% " + _escape(self.text) + "%", "text")

    @cached_property
    def substring(self) -> str:
        return self.params.add("%" + _escape(self.text) + "%", "text")

    @cached_property
    def folded(self) -> str:
        return self.params.add(self.text, "text")


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


class _Statement:
    def __init__(self, trigram: str, terms: list[Term], size: int) -> None:
        self.trigram = quote(trigram)
        self.terms = terms
        self.size = size
        self.fuzzy = any(term.typo for term in terms)  # a typo-tolerant statement

    def _matches(self, term: Term, text: str) -> str:
        """The condition of `term` on `text`: all of them are ANDed plain operators, so one
        scan of the search index (GIN intersects the terms) finds the rows matching them all."""
        if term.typo:
            return f"{term.folded} OPERATOR({self.trigram}.<%) {text}"
        if term.short:
            return f"({text} LIKE {term.prefix} OR {text} LIKE {term.word})"
        return f"{text} LIKE {term.substring}"

    def _term_score(self, term: Term, text: str) -> str:
        """3 when the text starts with the term, 2.5 when a word does, 2 for a substring; a
        term matched by similarity scores its word similarity (below 1)."""
        if term.typo:
            return f"{self.trigram}.word_similarity({term.folded}, {text})"
        return (
            f"CASE WHEN {text} LIKE {term.prefix} THEN 3.0 WHEN {text} LIKE {term.word} THEN 2.5 "
            f"WHEN {text} LIKE {term.substring} THEN 2.0 ELSE 0::real END"
        )

    def _score(self, names: list[str], text: str) -> str:
        """The record's score from its terms' (`names`, columns holding `_term_score`): its
        weakest term's, plus a thirtieth of the mean, less up to 0.05 for long texts (so within
        a tier the closer, shorter text comes first). A record every term of which matches
        exactly scores above TYPO_SCORES_BELOW, one that needs a typo-tolerant match below, which
        lets `find` look for those only when no record matches exactly."""
        weakest = names[0] if len(names) == 1 else f"least({', '.join(names)})"
        return (
            f"({weakest} + ({' + '.join(names)}) / {30 * len(names)} "
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
        names = [f'"_search {index}"' for index in range(len(self.terms))]
        term_scores = ", ".join(
            f"{self._term_score(term, f't.{column}')} AS {name}"
            for term, name in zip(self.terms, names, strict=True)
        )
        score = self._score([f"c.{name}" for name in names], f"c.{column}")
        ranked = [self._after(obj, score, after, params)] if after is not None else []
        name = literal(obj.name_singular)
        candidates = FUZZY_CANDIDATES if self.fuzzy else MAX_CANDIDATES
        # At most `candidates` matches per object are ranked: a word in thousands of records
        # would otherwise cost a heap fetch and a score for each of them. Each term's score is
        # worked out once per candidate (the LIMIT keeps that subquery from being flattened).
        return (
            f"SELECT {name} AS o, x.id, x.{_SCORE} AS score, "
            f"{obj.json_text('x')} AS j FROM ("
            f"SELECT c.*, {score} AS {_SCORE} FROM ("
            f"SELECT t.*, {term_scores} FROM {obj.table} t WHERE {' AND '.join(where)} "
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
class Query:
    """A checked search request: its words as typed, page size, the objects to search (those
    the caller may read that have searchable fields) and the cursor."""

    text: str
    size: int
    objects: list[tuple[ObjectModel, Access]]
    after: Cursor | None


def check(ctx: RequestContext, request: records_pb2.SearchRequest) -> Query:
    """`request` checked (InvalidArgument naming the parameter), before any statement runs."""
    terms = parse_terms(request.query)
    size = page_size(request.first)
    chosen = _objects(ctx, list(request.objects))
    after = decode_cursor(request.after) if request.after else None
    objects = []
    for obj in chosen:
        access = ctx.read_access(obj)
        if access is None or not search_ddl.searchable_fields(obj):
            continue  # objects the caller cannot read are skipped, not refused
        objects.append((obj, access))
    return Query(" ".join(terms), size, objects, after)


@dataclass(frozen=True)
class Plan:
    sql: str
    params: list[Any]


def plan(trigram: str, query: Query, terms: list[str], typos: list[bool] | None = None) -> Plan:
    """The statement answering `query` for its folded `terms` (not empty), and its parameters:
    every term matched as typed, or those flagged in `typos` by similarity."""
    params = Params()
    flags = typos or [False] * len(terms)
    bound = [Term(term, params, typo) for term, typo in zip(terms, flags, strict=True)]
    statement = _Statement(trigram, bound, query.size)
    scans = [
        f"({statement.object_scan(obj, access, query.after, params)})"
        for obj, access in query.objects
    ]
    order = 'ORDER BY score DESC, o COLLATE "C", id'
    searched = [obj for obj, _ in query.objects]
    # Matched fields are worked out for the final page only (from its record JSON).
    sql = (
        f"SELECT o, id::text, score, j, {statement.matched(searched, 'page')} FROM ("
        f"SELECT o, id, score, j, j::json AS v FROM ({' UNION ALL '.join(scans)}) r "
        f"{order} LIMIT {query.size + 1}) page {order}"
    )
    return Plan(sql, params.values)


def unmatched(query: Query, terms: list[str]) -> Plan:
    """A statement answering, for each term of three or more characters, whether no searched
    record (that the caller may read) contains it as typed: those are the ones a typo-tolerant
    search matches by similarity. One probe of each object's search index per term."""
    params = Params()
    probes = []
    for term in terms:
        if len(term) < SHORT_TERM:
            probes.append("FALSE")
            continue
        pattern = params.add("%" + _escape(term) + "%", "text")
        found = []
        for obj, access in query.objects:
            column = quote(search_ddl.column_name(search_ddl.searchable_fields(obj)))
            where = ['t."deletedAt" IS NULL', f"t.{column} LIKE {pattern}"]
            owner = owner_predicate("t", access, params)
            if owner:
                where.append(owner)
            found.append(f"EXISTS (SELECT FROM {obj.table} t WHERE {' AND '.join(where)})")
        probes.append(f"NOT ({' OR '.join(found)})")
    return Plan(f"SELECT ARRAY[{', '.join(probes)}]", params.values)


# The settings every search runs under: the sessions of records' search pool carry them
# (`session_settings`), so a search needs no transaction to set them. Sequential scans are off: the
# planner costs the `<%` operator like a comparison, so on tables of a few hundred rows it chose to
# compute a trigram similarity per row (20 ms for 800 rows) instead of using the search index
# (1 ms). Plans are generic: the statements leave the planner no choice that depends on the words
# (each object's search index, then a bounded sort), and planning them for every search cost more
# than running most of them (about 0.4 ms per object).
SESSION_SETTINGS = {
    "pg_trgm.word_similarity_threshold": str(SIMILARITY),
    "enable_seqscan": "off",
    "plan_cache_mode": "force_generic_plan",
}
# The query folded as the search columns are.
_FOLD = f"SELECT {search_ddl.FOLD}($1::text)"


async def find(
    connection: Any, ctx: RequestContext, trigram: str, request: records_pb2.SearchRequest
) -> tuple[list[Any], Query]:
    """The rows of a page: exact matches; typo-tolerant ones only when no record matches every
    term exactly (they would all rank below, see `_Statement._score`), since finding them costs
    a trigram comparison per candidate. A cursor from a typo-tolerant page goes straight to
    those."""
    query = check(ctx, request)
    if not query.objects:
        return [], query
    typo_page = query.after is not None and query.after.score < TYPO_SCORES_BELOW
    folded: str = await connection.fetchval(_FOLD, query.text)
    terms = folded.split()
    if not terms:  # nothing but characters folding drops (a lone combining accent)
        return [], query
    if not typo_page:
        exact = plan(trigram, query, terms)
        rows: list[Any] = await connection.fetch(exact.sql, *exact.params)
        if rows or query.after is not None:
            return rows, query
    if all(len(term) < SHORT_TERM for term in terms):
        return [], query  # nothing to match with a typo
    if len(terms) == 1:  # the exact statement found it nowhere
        typos = [True]
    else:
        probe = unmatched(query, terms)
        typos = list(await connection.fetchval(probe.sql, *probe.params))
    if not any(typos):
        return [], query
    fuzzy = plan(trigram, query, terms, typos)
    rows = await connection.fetch(fuzzy.sql, *fuzzy.params)
    return rows, query


async def search(
    connection: Any, ctx: RequestContext, trigram: str, request: records_pb2.SearchRequest
) -> records_pb2.SearchResponse:
    rows, query = await find(connection, ctx, trigram, request)
    size, after = query.size, query.after
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
