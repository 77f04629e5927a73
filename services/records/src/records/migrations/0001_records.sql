-- The records service's own tables (workspace data lives in one ws_<id> schema per workspace).

-- The data model applied to each workspace schema: what MigrateSchema last brought it to.
CREATE TABLE workspace_schemas (
    workspace_id uuid PRIMARY KEY,
    version bigint NOT NULL,
    change_id text NOT NULL,
    schema_proto bytea NOT NULL, -- crm.metadata.v1.WorkspaceSchema
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- Every change id applied, so a retried MigrateSchema is answered without running DDL again.
CREATE TABLE schema_changes (
    change_id text PRIMARY KEY,
    workspace_id uuid NOT NULL,
    version bigint NOT NULL,
    statements text[] NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schema_changes_workspace ON schema_changes (workspace_id, applied_at);

-- Record events, written in the same transaction as the change; the relay publishes them.
CREATE TABLE outbox (
    sequence bigserial PRIMARY KEY,
    event_id uuid NOT NULL UNIQUE,
    workspace_id uuid NOT NULL,
    object text NOT NULL,              -- singular object name
    object_metadata_id uuid NOT NULL,
    record_id uuid NOT NULL,
    action text NOT NULL CHECK (action IN ('created', 'updated', 'deleted')),
    cause text NOT NULL CHECK (cause IN ('write', 'restore', 'merge')),
    record json NOT NULL,              -- the record after the change
    previous_record json,              -- before; NULL for created
    changed_fields text[] NOT NULL DEFAULT '{}',
    actor_kind text NOT NULL,
    actor_user_id text NOT NULL DEFAULT '',
    actor_credential_id text NOT NULL DEFAULT '',
    actor_workflow_id text NOT NULL DEFAULT '',
    trace_context jsonb NOT NULL DEFAULT '{}',
    occurred_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (sequence) WHERE published_at IS NULL;
