-- Who last saved or activated each workflow (its author: a user, or an API key; at most one is
-- set), and the objects its runs read records of as checked then (trigger object and the
-- relations its filter and templates follow). A run reading records proceeds only while the
-- author may still READ every record of each (docs/auth.md). Workflows saved before this
-- migration have no author: their record-triggered runs fail, saying so, until someone saves
-- or activates them again (nobody vouches for what they send); their read objects are at least
-- the trigger object.
ALTER TABLE workflows
    ADD COLUMN author_user_id uuid,
    ADD COLUMN author_api_key_id uuid,
    ADD COLUMN read_objects text[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT workflows_one_author
        CHECK (author_user_id IS NULL OR author_api_key_id IS NULL);
UPDATE workflows SET read_objects = ARRAY[object] WHERE trigger_type <> 'scheduled';
