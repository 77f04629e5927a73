-- Wake the outbox relay when rows are committed: one notification per statement (and Postgres
-- folds identical notifications of one transaction), delivered only if the transaction commits.
-- The relay also polls, so a missed notification delays events by at most a second.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('records_outbox', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
