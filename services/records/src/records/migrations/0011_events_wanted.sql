-- Whether a write in `workspace` records its events in the outbox (docs/events.md, "Who
-- listens"); when it does, the relay is woken (NOTIFY records_outbox, delivered at commit).
-- A write whose session sets records.skip_unheard_events = 'on' (the records service with
-- RECORD_EVENTS_PUBLISH=interested) writes no outbox row while nobody listens to its workspace:
-- the relay would mark such a row published without publishing it, and the row, its NOTIFY
-- and the relay's read cost about as much as the write itself. Any other session writes every
-- event.
--
-- A write holds the workspace's lock shared from here to its commit; DeclareEventInterest takes
-- it exclusively before it adds an interest, so a declaration waits for the writes that may not
-- have seen it, and its holder's change (a new webhook) commits after their events. The interest
-- is read by a query of its own: in READ COMMITTED, a volatile function's query takes a new
-- snapshot, taken after the lock was granted, so it sees a declaration that committed while
-- this write waited.
CREATE FUNCTION events_wanted(workspace uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('records.skip_unheard_events', true) IS NOT DISTINCT FROM 'on' THEN
        PERFORM pg_advisory_xact_lock_shared(hashtext('records.event_writes'),
                                             hashtext(workspace::text));
        IF (SELECT count(*) FROM records.event_interest_synced
            WHERE holder IN ('webhooks', 'workflows')) = 2
           AND NOT EXISTS (SELECT 1 FROM records.event_interest i
                           WHERE i.workspace_id = workspace
                           AND (i.expires_at IS NULL OR i.expires_at > now())) THEN
            RETURN false;
        END IF;
    END IF;
    -- Postgres folds the notifications of a transaction into one.
    PERFORM pg_notify('records_outbox', '');
    RETURN true;
END
$$;

-- The relay was woken by a statement trigger on the outbox, which fired for an INSERT of no row
-- too: every write of a workspace nobody listens to would still wake it.
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();
