"""Pure logic of the workflows service: templates, trigger rules, schedules, definitions."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from crm.metadata.v1 import metadata_pb2 as md
from crm.workflows.v1 import workflows_pb2 as wf
from crmkit.errors import InvalidArgument
from crmkit.filters import parse_filter
from crmkit.workflow_origin import WorkflowOrigin
from workflows import definitions, schedule, secrets, templates
from workflows.scheduler import latest_due
from workflows.templates import TemplateError
from workflows.triggers import Event, RecordTrigger, filter_matches, wants

RECORD = {
    "id": "r-1",
    "name": 'Big "deal" \\ été 🚀',
    "amount": 1500.5,
    "stage": "QUALIFIED",
    "companyId": "c-1",
    "company": {"id": "c-1", "name": "Acme & Co"},
    "closeDate": None,
}


def test_json_bodies_escape_inside_strings_and_insert_values_outside() -> None:
    body = '{"text": "New deal: {{name}} ({{amount}})", "amount": {{amount}}, "c": {{closeDate}}}'
    rendered = templates.render_json(body, RECORD, "action.body")
    assert orjson.loads(rendered) == {
        "text": 'New deal: Big "deal" \\ été 🚀 (1500.5)',
        "amount": 1500.5,
        "c": None,
    }
    quoted = templates.render_json('{"n": {{name}}}', RECORD, "action.body")
    assert orjson.loads(quoted) == {"n": RECORD["name"]}
    escaped_quote = templates.render_json('{"a": "x\\"{{stage}}"}', RECORD, "action.body")
    assert orjson.loads(escaped_quote) == {"a": 'x"QUALIFIED'}


def test_urls_encode_values_and_dotted_paths_read_relations() -> None:
    url = templates.render_url(
        "https://chat.example.com/in?company={{company.name}}&n={{ name }}", RECORD, "action.url"
    )
    assert url == (
        "https://chat.example.com/in?company=Acme%20%26%20Co"
        "&n=Big%20%22deal%22%20%5C%20%C3%A9t%C3%A9%20%F0%9F%9A%80"
    )
    assert templates.render_text("{{company.name}}/{{closeDate}}", RECORD, "x") == "Acme & Co/"


def test_values_cannot_change_the_shape_of_the_url_or_a_form_body() -> None:
    context = {"a": "..", "b": "x&role=admin", "c": "v1.2"}
    url = templates.render_url(
        "https://exämple.com/api/{{a}}/{{c}}/n?q={{b}}&v={{c}}", context, "f"
    )
    assert url == "https://xn--exmple-cua.com/api/%2E%2E/v1%2E2/n?q=x%26role%3Dadmin&v=v1.2"
    form = templates.render_request(
        "POST",
        "https://x.example.com/",
        {"Content-Type": "application/x-www-form-urlencoded"},
        "note={{b}}&n=1",
        context,
    )
    assert form.body == "note=x%26role%3Dadmin&n=1"
    with pytest.raises(TemplateError, match="control character"):
        templates.render_request("GET", "https://x.example.com/", {"X": "{{a}}"}, "", {"a": "\0"})


def test_secrets_are_masked_by_name_shape_and_marking() -> None:
    mask = secrets.MASK
    run = secrets.mask_run_headers(
        {"X-A": "Bearer abc", "X-B": "QUALIFIED", "X-C": "sk_live_4eC39HqLyjWDarjtT1zdp7dc"},
        {"X-A": "{{a}}", "X-B": "{{b}}", "X-C": "{{c}}"},
    )
    assert run == {"X-A": mask, "X-B": "QUALIFIED", "X-C": mask}
    assert secrets.mask_run_headers({"X-Custom": "hunter2"}, {"X-Custom": "hunter2"}) == {
        "X-Custom": mask
    }
    assert secrets.looks_secret("Basic eDp5")
    assert not secrets.looks_secret("123e4567-e89b-12d3-a456-426614174000")
    url = "https://x.example.com/a?api_token=t0k&q=1&code=c&n=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5#f"
    assert secrets.mask_url(url, ["code"]) == (
        f"https://x.example.com/a?api_token={mask}&q=1&code={mask}&n=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5#f"
    )
    assert secrets.mask_url(url, [], by_shape=True).endswith(f"&n={mask}#f")
    assert secrets.mask_headers({"Content-Type": "text/plain", "X-Any": "x"}) == {
        "Content-Type": "text/plain",
        "X-Any": mask,
    }


def test_an_update_leaving_a_mask_keeps_the_stored_secret_for_the_same_target_only() -> None:
    mask = secrets.MASK
    stored_url = "https://x.example.com/a?key=real&q=1"
    stored = {"Authorization": "Bearer real"}
    url, headers = secrets.keep_stored(
        f"https://x.example.com/b?key={mask}&q=2",
        {"authorization": mask, "X-New": "v"},
        [],
        stored_url,
        stored,
    )
    assert url == "https://x.example.com/b?key=real&q=2"
    assert headers == {"authorization": "Bearer real", "X-New": "v"}
    with pytest.raises(InvalidArgument, match="target changed") as caught:
        secrets.keep_stored(
            "https://evil.example.com/", {"Authorization": mask}, [], stored_url, stored
        )
    assert caught.value.field == "action.url"
    with pytest.raises(InvalidArgument, match="enter its value") as caught:
        secrets.keep_stored("https://x.example.com/", {"X-Other": mask}, [], stored_url, stored)
    assert caught.value.field == "action.headers.X-Other"


def test_missing_variables_and_malformed_templates_are_named() -> None:
    with pytest.raises(TemplateError, match=r"\{\{nope\}\} is not a field") as caught:
        templates.render_json('{"a": "{{nope}}"}', RECORD, "action.body")
    assert caught.value.field == "action.body"
    with pytest.raises(TemplateError, match="malformed"):
        templates.check_syntax("{{ name", "action.body")
    with pytest.raises(TemplateError, match="not valid JSON"):
        templates.check_json_shape('{"a": {{name}', "action.body")
    templates.check_json_shape('{"a": "{{name}}", "b": {{amount}}}', "action.body")


def test_request_rendering_sets_content_type_and_masks_secrets() -> None:
    rendered = templates.render_request(
        "POST",
        "https://x.example.com/{{id}}",
        {"Authorization": "Bearer s3cret", "X-Deal": "{{stage}}"},
        '{"id": "{{id}}"}',
        RECORD,
    )
    assert rendered.url == "https://x.example.com/r-1"
    assert rendered.headers["Content-Type"] == "application/json"
    assert rendered.headers["X-Deal"] == "QUALIFIED"
    configured = {"Authorization": "Bearer s3cret", "X-Deal": "{{stage}}"}
    shown = secrets.mask_run_headers(rendered.headers, configured)
    assert shown == {
        "Authorization": secrets.MASK,
        "X-Deal": "QUALIFIED",
        "Content-Type": "application/json",
    }
    text = templates.render_request("POST", "https://x.example.com/", {}, "Hi {{name}}", RECORD)
    assert text.body == 'Hi Big "deal" \\ été 🚀'
    assert text.headers["Content-Type"].startswith("text/plain")


def _trigger(kind: str, **kw: object) -> RecordTrigger:
    row: dict[str, object] = {
        "id": "wf-1",
        "workspace_id": "ws",
        "trigger_type": kind,
        "object": "opportunity",
        "filter": None,
        "fields": [],
    }
    row.update(kw)
    return RecordTrigger.of(row)


def _event(action: str, **kw: object) -> Event:
    values: dict[str, object] = {
        "id": "e-1",
        "workspace_id": "ws",
        "object": "opportunity",
        "action": action,
        "record": {"stage": "QUALIFIED", "name": "a"},
        "previous_record": {"stage": "PROSPECTING", "name": "a"},
        "changed_fields": frozenset({"stage"}),
        "actor_workflow_id": "",
    }
    values.update(kw)
    return Event(**values)  # type: ignore[arg-type]


def test_trigger_rules() -> None:
    created, updated = _trigger("record_created"), _trigger("record_updated")
    assert wants(created, _event("created"))
    assert not wants(created, _event("updated"))
    assert wants(updated, _event("updated"))
    assert not wants(updated, _event("deleted"))
    assert not wants(updated, _event("updated", object="person"))
    assert not wants(updated, _event("updated", workspace_id="other"))
    # A workflow's own write does not trigger it; another workflow's does.
    assert not wants(updated, _event("updated", actor_workflow_id="wf-1"))
    assert wants(updated, _event("updated", actor_workflow_id="wf-2"))
    watched = _trigger("record_updated", fields=["amount"])
    assert not wants(watched, _event("updated"))
    assert wants(watched, _event("updated", changed_fields=frozenset({"amount", "name"})))
    # Without changed_fields, the before and after states are compared.
    assert wants(
        _trigger("record_updated", fields=["stage"]), _event("updated", changed_fields=frozenset())
    )
    qualified = _trigger("record_updated", filter={"stage": {"eq": "QUALIFIED"}})
    assert filter_matches(qualified, {"stage": "QUALIFIED"})
    assert not filter_matches(qualified, {"stage": "PROSPECTING"})
    assert not filter_matches(qualified, None)


def test_schedules_follow_the_time_zone_and_the_minimum_interval() -> None:
    now = datetime(2026, 3, 28, 10, 0, tzinfo=UTC)
    first = schedule.validate("0 9 * * *", "Europe/Paris", 60, now)
    assert first == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)  # 09:00 CEST, after the DST change
    assert schedule.next_tick("0 9 * * *", "Europe/Paris", first) == datetime(
        2026, 3, 30, 7, 0, tzinfo=UTC
    )
    assert schedule.validate("*/2 * * * * *", "UTC", 1, now) == datetime(
        2026, 3, 28, 10, 0, 2, tzinfo=UTC
    )
    for cron, timezone, field, message in [
        ("*/2 * * * * *", "UTC", "trigger.cron", "smallest interval"),
        ("61 * * * *", "UTC", "trigger.cron", "invalid cron"),
        ("* * *", "UTC", "trigger.cron", "5 fields"),
        ("0 9 * * *", "Mars/Olympus", "trigger.timezone", "unknown time zone"),
        ("", "UTC", "trigger.cron", "required"),
    ]:
        with pytest.raises(InvalidArgument, match=message) as caught:
            schedule.validate(cron, timezone, 60, now)
        assert caught.value.field == field


def test_missed_ticks_fire_once_for_the_latest() -> None:
    due = datetime(2026, 1, 1, 9, 0, tzinfo=UTC)
    now = datetime(2026, 1, 1, 9, 3, 30, tzinfo=UTC)
    assert latest_due("* * * * *", "UTC", due, now) == datetime(2026, 1, 1, 9, 3, tzinfo=UTC)
    assert latest_due("* * * * *", "UTC", due, due) == due


def _schema() -> md.WorkspaceSchema:
    company = md.ObjectMetadata(
        name_singular="company",
        is_active=True,
        fields=[md.FieldMetadata(name="name", type=md.FIELD_TYPE_TEXT, is_active=True)],
    )
    opportunity = md.ObjectMetadata(
        name_singular="opportunity",
        is_active=True,
        fields=[
            md.FieldMetadata(name=name, type=kind, is_active=True)
            for name, kind in [
                ("id", md.FIELD_TYPE_UUID),
                ("name", md.FIELD_TYPE_TEXT),
                ("amount", md.FIELD_TYPE_NUMBER),
                ("stage", md.FIELD_TYPE_SELECT),
            ]
        ]
        + [
            md.FieldMetadata(
                name="company",
                type=md.FIELD_TYPE_RELATION,
                is_active=True,
                relation=md.RelationSettings(
                    kind=md.RELATION_KIND_MANY_TO_ONE, target_object_name="company"
                ),
            )
        ],
    )
    return md.WorkspaceSchema(objects=[company, opportunity])


def _definition(trigger: wf.Trigger, action: wf.HttpAction) -> None:
    definitions.check_against_model(
        definitions.read_trigger(trigger), definitions.read_action(action), _schema()
    )


def test_definitions_are_checked_against_the_data_model() -> None:
    created = wf.Trigger(type=wf.TRIGGER_TYPE_RECORD_CREATED, object="opportunity")
    good = wf.HttpAction(
        url="https://chat.example.com/hooks/{{id}}",
        body='{"text": "New deal: {{name}} ({{amount}}) at {{company.name}}"}',
    )
    _definition(created, good)
    cases: list[tuple[wf.Trigger, wf.HttpAction, str]] = [
        (created, wf.HttpAction(url="https://x.example.com", body='{"a": "{{nope}}"}'),
         "action.body"),
        (created, wf.HttpAction(url="https://x.example.com", body='{"a": "{{company.nope}}"}'),
         "action.body"),
        (created, wf.HttpAction(url="https://{{name}}.example.com/"), "action.url"),
        (created, wf.HttpAction(url="ftp://x.example.com/"), "action.url"),
        (created, wf.HttpAction(url="https://x.example.com", body='{"a": 1'), "action.body"),
        (created, wf.HttpAction(url="https://x.example.com", method="BREW"), "action.method"),
        (created, wf.HttpAction(url="https://x.example.com", headers_json=b'["a"]'),
         "action.headers"),
        (wf.Trigger(type=wf.TRIGGER_TYPE_RECORD_CREATED, object="planet"), good,
         "trigger.object"),
        (wf.Trigger(type=wf.TRIGGER_TYPE_RECORD_CREATED, object="opportunity",
                    filter_json=b'{"stage": {"like": 1}}'), good, "trigger.filter"),
        (wf.Trigger(type=wf.TRIGGER_TYPE_RECORD_CREATED, object="opportunity",
                    filter_json=b'{"nope": {"eq": 1}}'), good, "trigger.filter"),
        (wf.Trigger(type=wf.TRIGGER_TYPE_RECORD_UPDATED, object="opportunity",
                    fields=["nope"]), good, "trigger.fields"),
        (wf.Trigger(type=wf.TRIGGER_TYPE_SCHEDULED, cron="0 9 * * *"), good, "action.url"),
    ]  # fmt: skip
    for trigger, action, field in cases:
        with pytest.raises(InvalidArgument) as caught:
            _definition(trigger, action)
        assert caught.value.field == field, (trigger, action, caught.value)
    scheduled = wf.Trigger(type=wf.TRIGGER_TYPE_SCHEDULED, cron="0 9 * * *")
    _definition(scheduled, wf.HttpAction(url="https://x.example.com", body="at {{scheduledAt}}"))
    assert parse_filter({"stage": {"eq": "QUALIFIED"}}) is not None


def test_workflow_origin_header_is_bound_to_its_workspace() -> None:
    origin = WorkflowOrigin("an app secret of enough length")
    value = origin.header_value("ws-1", "wf-1", "run-1")
    assert origin.workflow_of(value, "ws-1") == "wf-1"
    assert origin.workflow_of(value, "ws-2") is None
    assert origin.workflow_of(value.replace("wf-1", "wf-2"), "ws-1") is None
    assert WorkflowOrigin("another app secret value").workflow_of(value, "ws-1") is None
    assert origin.workflow_of("garbage", "ws-1") is None


def test_read_objects_are_the_trigger_object_and_the_relations_followed() -> None:
    def objects(trigger: wf.Trigger, body: str) -> list[str]:
        return definitions.read_objects(
            definitions.read_trigger(trigger),
            definitions.read_action(wf.HttpAction(url="https://x.example.com", body=body)),
            _schema(),
        )

    created = wf.Trigger(type=wf.TRIGGER_TYPE_RECORD_CREATED, object="opportunity")
    assert objects(created, '{"n": "{{name}}", "c": "{{companyId}}"}') == ["opportunity"]
    assert objects(created, '{"c": "{{company.name}}"}') == ["company", "opportunity"]
    filtered = wf.Trigger(
        type=wf.TRIGGER_TYPE_RECORD_CREATED,
        object="opportunity",
        filter_json=b'{"company.name": {"eq": "Acme"}}',
    )
    assert objects(filtered, "{{name}}") == ["company", "opportunity"]
    scheduled = wf.Trigger(type=wf.TRIGGER_TYPE_SCHEDULED, cron="0 9 * * *")
    assert objects(scheduled, "at {{scheduledAt}}") == []
