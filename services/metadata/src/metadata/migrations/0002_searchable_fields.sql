-- Which fields cross-object search matches (docs/data-model.md, "Search"). Defaults for what
-- exists: the standard objects' name-like, email, phone and link fields; every text, email,
-- phone and link field that a user added. The version bump makes the reconciler send each
-- workspace's definitions to records again, which builds the search indexes.
ALTER TABLE fields ADD COLUMN is_searchable boolean NOT NULL DEFAULT false;

UPDATE fields f SET is_searchable = true
FROM objects o
WHERE o.id = f.object_id AND NOT f.is_system AND f.type IN ('TEXT', 'EMAIL', 'PHONE', 'LINK')
  AND (f.is_custom OR o.is_custom OR (o.name_singular, f.name) IN (
      ('person', 'firstName'), ('person', 'lastName'), ('person', 'email'), ('person', 'phone'),
      ('person', 'jobTitle'), ('company', 'name'), ('company', 'website'),
      ('opportunity', 'name'), ('activity', 'title'), ('task', 'title')));

UPDATE workspaces SET version = version + 1;
