-- Import jobs (docs/api.md, "Import"). The upload is stored whole before the job is queued
-- (import_chunks, in the upload's transaction), then applied in batches; each batch commits its
-- records, its rejections and the job's counters together, so `rows_read` is exactly where a
-- restarted worker resumes: no row written twice, none skipped.
CREATE TABLE import_jobs (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    object text NOT NULL,
    format text NOT NULL,                 -- csv | ndjson
    state text NOT NULL,                  -- queued | running | succeeded | failed | cancelled
    options jsonb NOT NULL,               -- {upsert, events, columns}
    principal bytea NOT NULL,             -- the uploader's principal: rows are written as them
    size_bytes bigint NOT NULL,
    rows_read bigint NOT NULL DEFAULT 0,
    rows_written bigint NOT NULL DEFAULT 0,
    rows_rejected bigint NOT NULL DEFAULT 0,
    error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX import_jobs_workspace ON import_jobs (workspace_id, id DESC);
CREATE INDEX import_jobs_pending ON import_jobs (created_at) WHERE state IN ('queued', 'running');

CREATE TABLE import_chunks (
    job_id uuid NOT NULL REFERENCES import_jobs (id) ON DELETE CASCADE,
    seq integer NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (job_id, seq)
);

-- The first reason each rejected row was refused for (its line in the file).
CREATE TABLE import_rejections (
    job_id uuid NOT NULL REFERENCES import_jobs (id) ON DELETE CASCADE,
    line bigint NOT NULL,
    field text,
    reason text NOT NULL,
    PRIMARY KEY (job_id, line)
);

-- Upsert imports: the match values already seen in the file, so a repeat is rejected wherever
-- it is (not only within one batch) in constant memory.
CREATE TABLE import_keys (
    job_id uuid NOT NULL REFERENCES import_jobs (id) ON DELETE CASCADE,
    key_hash bytea NOT NULL,
    line bigint NOT NULL,
    PRIMARY KEY (job_id, key_hash)
);
