-- Event ids are random UUIDs generated per row; a unique index on them cost a random btree insert
-- per changed record (the hot path of batch creates) and served no lookup. Consumers dedupe on the
-- id (Nats-Msg-Id), and `sequence` stays the primary key.
ALTER TABLE outbox DROP CONSTRAINT outbox_event_id_key;
