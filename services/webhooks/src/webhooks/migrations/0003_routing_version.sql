-- A counter bumped in the same transaction as every change to webhooks (create, update, delete),
-- so a deliverer that caches which workspaces have webhooks can tell, in the statement it runs
-- for each batch of events anyway, whether its cache is still what is committed.
CREATE TABLE routing_version (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    version bigint NOT NULL
);
INSERT INTO routing_version (version) VALUES (1);

CREATE FUNCTION bump_routing_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE webhooks.routing_version SET version = version + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER webhooks_routing_version AFTER INSERT OR UPDATE OR DELETE ON webhooks
    FOR EACH STATEMENT EXECUTE FUNCTION bump_routing_version();
