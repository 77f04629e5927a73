"""Pure logic of the records service: DDL planning, cursors, values, inputs, predicates."""

from __future__ import annotations

import re
import uuid

import orjson
import pytest

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crm.records.v1 import records_pb2
from crmkit.authz import Access
from crmkit.errors import InvalidArgument, PermissionDenied
from records import ddl, inputs, ordering, reads, search_ddl, values, writes
from records.context import RequestContext
from records.model import WorkspaceModel
from records.predicates import PredicateCompiler, like_pattern
from records.sql import Params, quote

WS = "11111111-2222-4333-8444-555555555555"


def field(name: str, field_type: md.FieldType) -> md.FieldMetadata:
    return md.FieldMetadata(
        id=str(uuid.uuid4()), name=name, type=field_type, is_active=True, is_nullable=True
    )


def schema(*, company_name: str = "company", extra: list[md.FieldMetadata] | None = None,
           ids: tuple[str, str] = ("", "")) -> md.WorkspaceSchema:  # fmt: skip
    company_id = ids[0] or "aaaaaaaa-0000-4000-8000-000000000001"
    person_id = ids[1] or "aaaaaaaa-0000-4000-8000-000000000002"
    relation = md.FieldMetadata(
        id="bbbbbbbb-0000-4000-8000-000000000001", name="company", type=md.FIELD_TYPE_RELATION,
        is_active=True, is_nullable=True,
        relation=md.RelationSettings(kind=md.RELATION_KIND_MANY_TO_ONE,
                                     target_object_metadata_id=company_id,
                                     inverse_field_name="people"),
    )  # fmt: skip
    person = md.ObjectMetadata(
        id=person_id, name_singular="person", name_plural="people", is_active=True,
        label_identifier_field="firstName",
        fields=[
            md.FieldMetadata(id="bbbbbbbb-0000-4000-8000-000000000002", name="firstName",
                             type=md.FIELD_TYPE_TEXT, is_active=True, is_nullable=True),
            md.FieldMetadata(id="bbbbbbbb-0000-4000-8000-000000000003", name="salary",
                             type=md.FIELD_TYPE_CURRENCY, is_active=True, is_nullable=True),
            relation, *(extra or []),
        ],
    )  # fmt: skip
    company = md.ObjectMetadata(
        id=company_id, name_singular=company_name, name_plural=company_name + "s", is_active=True,
        fields=[md.FieldMetadata(id="bbbbbbbb-0000-4000-8000-000000000004", name="name",
                                 type=md.FIELD_TYPE_TEXT, is_active=True, is_nullable=False)],
    )  # fmt: skip
    return md.WorkspaceSchema(workspace_id=WS, version=1, objects=[person, company])


def test_plan_creates_schema_tables_indexes_and_foreign_keys() -> None:
    model = WorkspaceModel.from_proto(schema())
    statements = ddl.plan(model.schema, ddl.Catalog(), model)
    assert statements[0].startswith("CREATE SCHEMA")
    text = "\n".join(statements)
    assert 'CREATE TABLE "ws_11111111222243338444555555555555"."person"' in text
    assert '"salaryAmountMicros" BIGINT' in text
    assert '"salaryCurrencyCode" TEXT' in text
    assert '"companyId" UUID' in text
    assert 'FOREIGN KEY("companyId")' in text
    assert text.count("CREATE INDEX") >= 6


def test_plan_is_empty_once_applied_and_detects_renames() -> None:
    model = WorkspaceModel.from_proto(schema())
    catalog = ddl.Catalog()
    ddl.plan(model.schema, catalog, model)  # the planner updates the catalog it is given
    catalog.exists = True
    assert ddl.plan(model.schema, catalog, model) == []
    renamed = WorkspaceModel.from_proto(schema(company_name="organization"))
    statements = ddl.plan(renamed.schema, catalog, renamed)
    assert statements == [
        'ALTER TABLE "ws_11111111222243338444555555555555"."company" RENAME TO "organization"'
    ]


def test_plan_moves_a_leftover_column_aside_instead_of_reusing_it() -> None:
    leftover = field("nickname", md.FIELD_TYPE_NUMBER)
    model = WorkspaceModel.from_proto(schema(extra=[leftover]))
    catalog = ddl.Catalog()
    ddl.plan(model.schema, catalog, model)
    catalog.exists = True
    again = WorkspaceModel.from_proto(schema(extra=[field("nickname", md.FIELD_TYPE_TEXT)]))
    statements = ddl.plan(again.schema, catalog, again)
    assert 'RENAME COLUMN "nickname" TO "_orphan_nickname_' in statements[0]
    assert 'ADD COLUMN "nickname" TEXT' in statements[1]


def test_unsafe_identifiers_are_refused() -> None:
    with pytest.raises(ValueError, match="unsafe"):
        quote('x"; DROP TABLE y; --')


def test_cursor_round_trip_and_signature_check() -> None:
    obj = WorkspaceModel.from_proto(schema()).object("person")
    assert obj is not None
    order = ordering.build_order(
        obj, [common_pb2.OrderBy(field="firstName", direction=common_pb2.SORT_DIRECTION_DESC)]
    )
    assert [k.column for k in order.keys] == ["firstName", "id"]
    assert order.keys[-1].descending
    cursor = ordering.encode_cursor(order, ["Ada", uuid.UUID(WS)])
    assert ordering.decode_cursor(order, cursor, "after") == ["Ada", WS]
    other = ordering.build_order(obj, [])
    with pytest.raises(InvalidArgument) as caught:
        ordering.decode_cursor(other, cursor, "after")
    assert caught.value.field == "after"


def test_keyset_predicate_treats_nulls_as_largest() -> None:
    obj = WorkspaceModel.from_proto(schema()).object("person")
    assert obj is not None
    order = ordering.build_order(obj, [common_pb2.OrderBy(field="firstName")])
    params = Params()
    sql = ordering.keyset_predicate(order, "t", ["Ada", WS], params)
    assert 'left(t."firstName", 256) IS NULL' in sql
    assert params.values == ["Ada", WS]
    after_null = ordering.keyset_predicate(order, "t", [None, WS], Params())
    assert after_null == '((left(t."firstName", 256) IS NULL AND t."id" > $1::uuid))'


def test_values_are_canonical() -> None:
    assert values.parse_timestamp("2026-01-02T03:04:05.678901+01:00", "x") == (
        "2026-01-02T02:04:05.678Z"
    )
    assert values.parse_timestamp("2026-01-02", "x") == "2026-01-02T00:00:00.000Z"
    assert values.parse_date("2026-01-02T23:30:00-02:00", "x", lenient=True) == "2026-01-03"
    assert values.parse_currency({"amountMicros": 10.0, "currencyCode": "EUR"}, "a") == (10, "EUR")
    assert values.parse_number("42", "n", lenient=True) == 42
    with pytest.raises(InvalidArgument) as caught:
        values.parse_currency({"amountMicros": 1, "currencyCode": "euro"}, "amount")
    assert caught.value.field == "amount.currencyCode"
    with pytest.raises(InvalidArgument):
        values.parse_number(float("nan"), "n")
    with pytest.raises(InvalidArgument):
        values.check_text("a\x00b", "t")


def test_record_ids_are_time_ordered_uuid7() -> None:
    ids = inputs.RecordIds()
    made = [ids.new() for _ in range(5000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    assert all(uuid.UUID(value).version == 7 for value in made[:10])


def test_prepare_create_applies_defaults_owner_and_required() -> None:
    obj = WorkspaceModel.from_proto(schema()).object("company")
    assert obj is not None
    owner = "cccccccc-0000-4000-8000-000000000001"
    prepared = inputs.prepare_create(
        obj, {"name": "Acme"}, "", Access(False, owner), inputs.RecordIds()
    )
    assert prepared.columns["ownerId"] == owner
    with pytest.raises(InvalidArgument) as caught:
        inputs.prepare_batch(obj, [{"name": "a"}, {}], Access(False, ""), inputs.RecordIds())
    assert caught.value.field == "[1].name"
    with pytest.raises(PermissionDenied):
        inputs.prepare_create(obj, {"name": "a", "ownerId": WS}, "", Access(True, owner),
                              inputs.RecordIds())  # fmt: skip


def test_relation_writes() -> None:
    obj = WorkspaceModel.from_proto(schema()).object("person")
    assert obj is not None
    target = "cccccccc-0000-4000-8000-000000000002"
    access = Access(False, "")
    connect = inputs.prepare_update(obj, {"company": {"connect": target}}, access)
    assert connect.columns == {"companyId": target}
    assert inputs.prepare_update(obj, {"company": {"disconnect": True}}, access).columns == {
        "companyId": None
    }
    with pytest.raises(InvalidArgument) as caught:
        inputs.prepare_update(obj, {"company": target}, access)
    assert caught.value.field == "company"


def test_like_patterns_escape_wildcards() -> None:
    assert like_pattern("50%_off\\", True, True) == "%50\\%\\_off\\\\%"


def test_filter_compiles_to_bound_parameters() -> None:
    model = WorkspaceModel.from_proto(schema())
    obj = model.object("person")
    assert obj is not None
    params = Params()
    node = common_pb2.Filter(
        condition=common_pb2.Condition(
            field="company.name", operator=common_pb2.FILTER_OPERATOR_CONTAINS,
            value_json=orjson.dumps("ac'me"),
        )
    )  # fmt: skip
    sql = PredicateCompiler(model, params, lambda _: Access(False, "")).compile(node, obj, "t")
    assert "ac'me" not in sql
    assert params.values == ["%ac'me%"]
    assert sql.startswith("(EXISTS (SELECT 1 FROM")


def test_unbounded_text_gets_a_prefix_btree_and_a_unique_index_over_md5() -> None:
    code = field("code", md.FIELD_TYPE_TEXT)
    code.is_unique = code.is_indexed = True
    proto = schema(extra=[code])
    proto.objects[0].fields[1].is_indexed = True  # salary
    model = WorkspaceModel.from_proto(proto)
    text = "\n".join(ddl.plan(model.schema, ddl.Catalog(), model))
    assert '(left("firstName", 256), "id")' in text
    assert '(left("code", 256), "id")' in text
    assert '(md5("code")) WHERE "deletedAt" IS NULL' in text
    assert "USING hash" not in text
    assert '("salaryAmountMicros", "id")' in text  # bounded types keep their (column, id) btree


def test_plan_replaces_the_index_shapes_of_earlier_versions_on_unbounded_text() -> None:
    model = WorkspaceModel.from_proto(schema())
    person = model.objects["aaaaaaaa-0000-4000-8000-000000000002"]
    first_name = person.field("firstName")
    assert first_name is not None
    catalog = ddl.Catalog()
    ddl.plan(model.schema, catalog, model)
    catalog.exists = True
    keyed = ddl.index_name("tx", person.id, first_name.id)
    earlier = [ddl.index_name(prefix, person.id, first_name.id) for prefix in ("ix", "hx")]
    catalog.indexes.discard(keyed)
    catalog.indexes.update(earlier)
    statements = ddl.plan(model.schema, catalog, model)
    assert statements[:2] == [
        f'DROP INDEX IF EXISTS "{model.schema}"."{name}"' for name in reversed(earlier)
    ]
    assert f'"{keyed}" ON "{model.schema}"."person" (left("firstName", 256), "id")' in statements[2]
    assert len(statements) == 3


def test_raw_json_depth_is_checked_without_recursion() -> None:
    deep: object = 1
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidArgument) as caught:
        values.check_json(deep, "profile")
    assert caught.value.field == "profile"
    shallow: object = {"a": "b"}
    for _ in range(63):
        shallow = [shallow]
    assert values.check_json(shallow, "profile") == shallow


def test_btrees_follow_the_indexed_flag_and_no_field_gets_a_trigram_gin() -> None:
    mail, notes = field("mail", md.FIELD_TYPE_EMAIL), field("notes", md.FIELD_TYPE_TEXT)
    flag = field("flag", md.FIELD_TYPE_BOOLEAN)
    mail.is_indexed = flag.is_indexed = True
    model = WorkspaceModel.from_proto(schema(extra=[mail, notes, flag]))
    person = model.objects["aaaaaaaa-0000-4000-8000-000000000002"]
    text = "\n".join(ddl.plan(model.schema, ddl.Catalog(), model))
    assert "USING gin" not in text
    assert '(left("mail", 256), "id")' in text
    assert '(left("firstName", 256), "id")' in text  # the label field, whatever its flag
    assert '("companyId", "id")' in text  # a many-to-one relation, whatever its flag
    assert '"notes"' not in text.split("CREATE INDEX", 1)[1]
    assert '"flag", "id"' not in text  # a btree on a boolean does not pay
    catalog = ddl.Catalog()
    ddl.plan(model.schema, catalog, model)
    catalog.exists = True
    earlier = [ddl.index_name(prefix, person.id, mail.id) for prefix in ("tg", "ix")]
    earlier.append(ddl.index_name("tx", person.id, notes.id))
    catalog.indexes.update(earlier)
    assert sorted(ddl.plan(model.schema, catalog, model)) == sorted(
        f'DROP INDEX IF EXISTS "{model.schema}"."{name}"' for name in earlier
    )


def test_the_search_column_is_filled_by_the_writes_and_follows_renames() -> None:
    proto = schema()
    proto.objects[0].fields[0].is_searchable = True  # firstName
    model = WorkspaceModel.from_proto(proto)
    person = model.object("person")
    assert person is not None
    catalog = ddl.Catalog()
    ddl.plan(model.schema, catalog, model)
    fields = search_ddl.searchable_fields(person)
    column, function = search_ddl.column_name(fields), search_ddl.function_name(person, fields)
    on_insert, on_update = search_ddl.trigger_names(person, fields)
    index = search_ddl.index_name(person, fields)
    planned = search_ddl.plan(model.schema, catalog, model, "public")
    starts = [
        f'ALTER TABLE {person.table} ADD COLUMN "{column}" text GENERATED ALWAYS AS (',
        f'ALTER TABLE {person.table} ALTER COLUMN "{column}" DROP EXPRESSION',
        f'CREATE OR REPLACE FUNCTION "{model.schema}"."{function}"() RETURNS trigger',
        f'CREATE TRIGGER "{on_insert}" BEFORE INSERT ON {person.table} FOR EACH ROW '
        f'WHEN (NEW."{column}" IS NULL) EXECUTE FUNCTION "{model.schema}"."{function}"()',
        f'CREATE TRIGGER "{on_update}" BEFORE UPDATE ON {person.table} FOR EACH ROW '
        f'EXECUTE FUNCTION "{model.schema}"."{function}"()',
        f'CREATE INDEX IF NOT EXISTS "{index}" ON {person.table} USING gin',
    ]
    assert len(planned) == len(starts)
    for statement, start in zip(planned, starts, strict=True):
        assert statement.startswith(start), statement
    # The body is a string literal: its empty strings are doubled quotes.
    body = f'NEW."{column}" := records.search_fold(coalesce(NEW."firstName", ' + "''''))"
    assert body in planned[2]
    # A create computes the column in its own SELECT list, from the recordset.
    sql, _ = writes.create_statement(common_pb2.Principal(), person, [], ())
    assert f'"{column}", "createdAt", "updatedAt") SELECT ' in sql
    assert "records.search_fold(coalesce(x.\"firstName\", ''))" in sql
    assert search_ddl.insert_value(person, ["lastName"], "x") is None  # the trigger then

    # As the database then holds it: nothing to do; a generated column of earlier versions is
    # made a plain one (its values kept).
    table = catalog.tables["person"]
    table.columns[column] = ddl.CatalogColumn(column, "text", generated=True)
    table.triggers |= {on_insert, on_update}
    catalog.indexes.add(index)
    assert search_ddl.plan(model.schema, catalog, model, "public") == [
        f'ALTER TABLE {person.table} ALTER COLUMN "{column}" DROP EXPRESSION'
    ]
    table.columns[column].generated = False
    assert search_ddl.plan(model.schema, catalog, model, "public") == []

    # The field renamed: the same column, a new function and triggers for the new name.
    proto.objects[0].fields[0].name = "givenName"
    renamed = WorkspaceModel.from_proto(proto)
    ddl.plan(renamed.schema, catalog, renamed)
    person = renamed.object("person")
    assert person is not None
    fields = search_ddl.searchable_fields(person)
    assert search_ddl.column_name(fields) == column
    assert search_ddl.function_name(person, fields) != function
    assert search_ddl.plan(renamed.schema, catalog, renamed, "public") == [
        f'DROP TRIGGER IF EXISTS "{on_insert}" ON {person.table}',
        f'DROP TRIGGER IF EXISTS "{on_update}" ON {person.table}',
        f'DROP FUNCTION IF EXISTS "{model.schema}"."{function}"()',
        *search_ddl.trigger_statements(person, fields),
    ]


def test_fragment_filters_on_searchable_fields_are_prefiltered_by_the_search_column() -> None:
    notes = field("notes", md.FIELD_TYPE_TEXT)
    proto = schema(extra=[notes])
    proto.objects[0].fields[0].is_searchable = True  # firstName
    model = WorkspaceModel.from_proto(proto)
    obj = model.object("person")
    assert obj is not None

    def compiled(
        name: str, operator: common_pb2.FilterOperator, value: str
    ) -> tuple[str, list[object]]:
        params = Params()
        node = common_pb2.Filter(
            condition=common_pb2.Condition(
                field=name, operator=operator, value_json=orjson.dumps(value)
            )
        )
        access = Access(False, "")
        return PredicateCompiler(model, params, lambda _: access).compile(node, obj, "t"), [
            *params.values
        ]

    sql, values_ = compiled("firstName", common_pb2.FILTER_OPERATOR_CONTAINS, "50%_x" + "y" * 300)
    assert sql.startswith('(t."_search_')
    assert " LIKE '%' || replace(" in sql
    assert "records.search_fold($1::text)" in sql
    assert '"firstName" ILIKE $2::text' in sql
    assert values_ == ["50%_x" + "y" * 251, "%50\\%\\_x" + "y" * 300 + "%"]
    short, _ = compiled("firstName", common_pb2.FILTER_OPERATOR_STARTS_WITH, "ab")
    assert short == '(t."firstName" LIKE $1::text)'
    unsearchable, _ = compiled("notes", common_pb2.FILTER_OPERATOR_ENDS_WITH, "abc")
    assert unsearchable == '(t."notes" LIKE $1::text)'
    # A character unaccent folds apart from its other case: ILIKE may match the other form.
    excepted, _ = compiled("firstName", common_pb2.FILTER_OPERATOR_CONTAINS, "x\u01a6y")
    assert excepted == '(t."firstName" ILIKE $1::text)'
    cased, _ = compiled("firstName", common_pb2.FILTER_OPERATOR_STARTS_WITH, "x\u01a6y")
    assert cased.startswith('(t."_search_')


@pytest.mark.parametrize(
    ("own_records_only", "filtered", "scope", "unfiltered"),
    [
        (False, False, 0, True),
        (False, False, records_pb2.DELETED_SCOPE_INCLUDE, True),
        (False, False, records_pb2.DELETED_SCOPE_ONLY, False),
        (False, True, 0, False),
        (True, False, 0, False),
    ],
)
def test_only_a_where_without_filter_or_owner_scope_is_unfiltered(
    own_records_only: bool, filtered: bool, scope: int, unfiltered: bool
) -> None:
    model = WorkspaceModel.from_proto(schema())
    context = RequestContext(common_pb2.Principal(), model)
    company = model.object("company")
    assert company is not None
    node = common_pb2.Filter(
        condition=common_pb2.Condition(
            field="name", operator=common_pb2.FILTER_OPERATOR_EQ, value_json=b'"Acme"'
        )
    )
    where = reads.where_clause(
        context,
        company,
        "t",
        Access(own_records_only, str(uuid.uuid4())),
        Params(),
        node=node if filtered else None,
        scope=scope,
    )
    assert reads.is_unfiltered(where, "t") is unfiltered


def test_a_create_statement_is_built_once_and_bound_to_each_caller() -> None:
    obj = WorkspaceModel.from_proto(schema()).object("company")
    assert obj is not None
    rows = [inputs.prepare_create(obj, {"name": "Acme"}, "", Access(False, ""), inputs.RecordIds())]
    alice = common_pb2.Principal(
        workspace_id=WS, user_id="alice", kind=common_pb2.PRINCIPAL_KIND_USER
    )
    key = common_pb2.Principal(
        workspace_id=WS, credential_id="key-1", kind=common_pb2.PRINCIPAL_KIND_API_KEY
    )
    first_sql, first = writes.create_statement(alice, obj, rows, ())
    second_sql, second = writes.create_statement(key, obj, rows, ())
    assert second_sql is first_sql  # the text kept on the model
    # rows, then who (workspace, kind, user, credential, workflow), then the trace context
    assert first.values[1:6] == [WS, "user", "alice", "", ""]
    assert second.values[1:6] == [WS, "api_key", "", "key-1", ""]
    assert len(first.values) == 7
    assert max(int(n) for n in re.findall(r"\$(\d+)", first_sql)) == 7
    quiet_sql, quiet = writes.create_statement(alice, obj, rows, (), events=False)
    assert "records.outbox" not in quiet_sql
    assert "records.record_history" in quiet_sql
    assert len(quiet.values) == 6  # no trace context: no event is written
    # Creates of several requests in one statement (records.create_groups): each record's
    # event gets its own request's trace, bound as one map by record id.
    pair = [
        *rows,
        inputs.prepare_create(obj, {"name": "Beta"}, "", Access(False, ""), inputs.RecordIds()),
    ]
    traces = {str(row.columns["id"]): {"traceparent": f"00-{n}"} for n, row in enumerate(pair)}
    grouped_sql, grouped = writes.create_statement(alice, obj, pair, (), traces=traces)
    assert grouped_sql is not first_sql
    assert grouped.values[0] == [row.columns for row in pair]
    assert grouped.values[1:6] == first.values[1:6]
    assert grouped.values[6] == traces
    assert "($7::jsonb -> s.id::text)::jsonb" in grouped_sql
    assert writes.create_statement(key, obj, pair, (), traces=traces)[0] is grouped_sql
