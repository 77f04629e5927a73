-- Write-only secrets (see workflows.secrets): `url` and `headers` hold the action as it is read,
-- secrets as ***; `secrets` the real URL and headers, sealed with a key derived from APP_SECRET.
-- Rows saved before this migration have no `secrets` yet: the service seals them when it starts.
ALTER TABLE workflows ADD COLUMN secret_params text[] NOT NULL DEFAULT '{}';
ALTER TABLE workflows ADD COLUMN secrets bytea;
