-- Idempotency keys (docs/api.md, "Idempotent writes"): one row per workspace, credential and
-- key, inserted in the same transaction as the write it guards and holding that write's response
-- (the serialized gRPC response message), so a retry is answered from here and never writes
-- twice, even after a crash between the commit and the answer.
CREATE TABLE idempotency_keys (
    workspace_id uuid NOT NULL,
    credential_id text NOT NULL,
    key text NOT NULL,
    request_hash bytea NOT NULL,  -- sha256 of the gRPC method and the gateway's request hash
    response bytea,               -- set before the transaction commits
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, credential_id, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);
