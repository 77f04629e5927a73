-- Trigram matching for text search on indexed text fields (`contains`, `startsWith`, `endsWith`
-- served by GIN indexes, docs/data-model.md "Indexes"). pg_trgm is a trusted extension: the
-- records role needs CREATE on the database, not superuser. Installed in this service's schema,
-- where the workspace DDL names its operator class (records.gin_trgm_ops).
CREATE EXTENSION IF NOT EXISTS pg_trgm WITH SCHEMA records;
