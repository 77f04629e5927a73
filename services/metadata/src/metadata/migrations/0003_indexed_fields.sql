-- Which fields have a btree (docs/data-model.md, "Indexes"). For what exists: id, ownerId,
-- createdAt, updatedAt, many-to-one relations, label fields and unique fields; the standard
-- objects' defaults; and every sortable field a user added (it had a btree before this flag, so
-- no query of an existing workspace gets slower; switch it off per field). The version bump makes
-- the reconciler send each workspace's definitions to records again, which drops the btrees of
-- the standard fields no longer indexed.
ALTER TABLE fields ADD COLUMN is_indexed boolean NOT NULL DEFAULT false;

UPDATE fields f SET is_indexed = true
FROM objects o
WHERE o.id = f.object_id AND (
    (f.is_system AND f.name IN ('id', 'ownerId', 'createdAt', 'updatedAt'))
    OR (f.type = 'RELATION' AND coalesce(f.relation ->> 'kind', 'MANY_TO_ONE') = 'MANY_TO_ONE')
    OR f.name = o.label_identifier_field
    OR (f.is_unique AND NOT f.is_system)
    OR ((f.is_custom OR o.is_custom) AND NOT f.is_system AND f.type IN (
        'UUID', 'TEXT', 'NUMBER', 'DATE', 'DATE_TIME', 'SELECT', 'EMAIL', 'PHONE', 'LINK',
        'CURRENCY'))
    OR (NOT o.is_custom AND (o.name_singular, f.name) IN (
        ('person', 'lastName'), ('person', 'email'), ('company', 'website'),
        ('opportunity', 'amount'), ('opportunity', 'stage'), ('opportunity', 'closeDate'),
        ('activity', 'type'), ('activity', 'dueAt'), ('task', 'dueAt'), ('task', 'status'))));

UPDATE workspaces SET version = version + 1;
