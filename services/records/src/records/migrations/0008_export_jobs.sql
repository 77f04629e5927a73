-- Export jobs (docs/api.md, "Export jobs"): a saved export request. Nothing is materialized:
-- a download streams the saved request from a snapshot taken when the download starts.
-- (Numbered 0007 to stay clear of the 0005/0006 migrations of branches developed alongside.)
CREATE TABLE export_jobs (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    object text NOT NULL,            -- singular name when created (the request names it too)
    format smallint NOT NULL,        -- crm.records.v1.ExportFormat
    request bytea NOT NULL,          -- the serialized ExportRecordsRequest
    created_by text NOT NULL,        -- user or API key id of the creator
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX export_jobs_workspace ON export_jobs (workspace_id, created_at);
