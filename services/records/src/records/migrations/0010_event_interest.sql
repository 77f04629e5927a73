-- Who listens to the record events of a workspace (docs/events.md, "Who listens"). The relay
-- publishes an outbox row only while its workspace has an unexpired row here, read in the same
-- statement as the batch. Holders: 'webhooks' and 'workflows' (no expiry: kept while their
-- process is down, so the events wait in JetStream for their durable consumers) and
-- 'gateway:<instance id>' (a lease renewed while the gateway has open subscriptions there).
CREATE TABLE event_interest (
    workspace_id uuid NOT NULL,
    holder text NOT NULL,
    expires_at timestamptz,            -- NULL: held until released
    declared_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, holder)
);
CREATE INDEX event_interest_holder ON event_interest (holder, workspace_id);
CREATE INDEX event_interest_expiry ON event_interest (expires_at) WHERE expires_at IS NOT NULL;

-- The holders that declared every workspace they listen to at least once. Until both
-- 'webhooks' and 'workflows' have, the relay publishes every event (upgrades, fresh starts).
CREATE TABLE event_interest_synced (
    holder text PRIMARY KEY CHECK (holder IN ('webhooks', 'workflows')),
    synced_at timestamptz NOT NULL DEFAULT now()
);
