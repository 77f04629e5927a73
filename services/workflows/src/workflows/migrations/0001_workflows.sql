-- Workflow configurations and their runs.

CREATE TABLE workflows (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    name text NOT NULL,
    status text NOT NULL DEFAULT 'configured' CHECK (status IN ('configured', 'active')),
    trigger_type text NOT NULL
        CHECK (trigger_type IN ('record_created', 'record_updated', 'scheduled')),
    object text NOT NULL DEFAULT '',        -- singular object name (record triggers)
    filter jsonb,                           -- the API filter language; null: every record
    fields text[] NOT NULL DEFAULT '{}',    -- watched fields (record_updated)
    cron text NOT NULL DEFAULT '',
    timezone text NOT NULL DEFAULT 'UTC',
    method text NOT NULL,
    url text NOT NULL,                      -- template
    headers jsonb NOT NULL DEFAULT '{}',    -- name -> template
    body text NOT NULL DEFAULT '',          -- template
    next_run_at timestamptz,                -- scheduled and active: the next tick
    last_run_at timestamptz,                -- when a run was last queued
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX workflows_workspace ON workflows (workspace_id, created_at, id);
CREATE INDEX workflows_record_triggers ON workflows (workspace_id, object)
    WHERE status = 'active' AND trigger_type <> 'scheduled';
CREATE INDEX workflows_due ON workflows (next_run_at)
    WHERE status = 'active' AND trigger_type = 'scheduled';

CREATE TABLE runs (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    workflow_id uuid NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    trigger_key text,                       -- the event id or tick:<time>; null for test runs
    status text NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    is_test boolean NOT NULL DEFAULT false,
    trigger_event jsonb NOT NULL,           -- the record event or the tick that started it
    trace_context jsonb NOT NULL DEFAULT '{}',
    request_method text,                    -- the rendered request of the last attempt,
    request_url text,                       -- secret headers masked
    request_headers jsonb,
    request_body text,
    response_status integer,
    response_excerpt text NOT NULL DEFAULT '',
    duration_ms integer,
    attempts integer NOT NULL DEFAULT 0,
    error text NOT NULL DEFAULT '',
    next_attempt_at timestamptz,            -- queued: when due; running: when its lease ends
    lease uuid,                             -- the claim that may record the current attempt
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at timestamptz,
    finished_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- One run per workflow and event (or tick), however often the event arrives.
CREATE UNIQUE INDEX runs_once ON runs (workflow_id, trigger_key) WHERE trigger_key IS NOT NULL;
CREATE INDEX runs_due ON runs (next_attempt_at) WHERE status IN ('queued', 'running');
CREATE INDEX runs_log ON runs (workflow_id, created_at DESC, id DESC);
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;
