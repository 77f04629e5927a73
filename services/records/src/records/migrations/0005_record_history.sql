-- Record history (docs/data-model.md, "Record history"): one row per change of a record, written
-- by the same statement as the change and its outbox row. One table for every workspace: reads
-- are by record (the index below), and RECORD_HISTORY_RETENTION_DAYS prunes by age.
CREATE TABLE record_history (
    id bigserial PRIMARY KEY,            -- newest first = id descending; the cursor
    workspace_id uuid NOT NULL,
    object_metadata_id uuid NOT NULL,    -- the object (survives renames)
    record_id uuid NOT NULL,
    action text NOT NULL CHECK (action IN ('created', 'updated', 'deleted', 'restored', 'merged')),
    related_record_id uuid,              -- merged: the other side of the merge
    changes jsonb,                       -- {"<field key>": [old, new]}; NULL when not an update
    actor_kind text NOT NULL,
    actor_user_id text NOT NULL DEFAULT '',
    actor_credential_id text NOT NULL DEFAULT '',
    actor_workflow_id text NOT NULL DEFAULT '',
    occurred_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX record_history_record ON record_history (record_id, id);
-- Rows arrive in time order: a BRIN index finds the old ones for pruning at almost no cost per
-- insert (a b-tree would add one more index insert per changed record); filled block ranges are
-- summarized as they fill, so a prune that finds nothing old reads no heap.
CREATE INDEX record_history_age ON record_history USING brin (occurred_at)
    WITH (autosummarize = on);
