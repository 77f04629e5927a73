-- What the relay left out of an event for size (docs/events.md): the deliverer reads the record
-- again by id, and says what it could not send (X-Service-Payload-Truncated).
ALTER TABLE events
    ADD COLUMN record_omitted boolean NOT NULL DEFAULT false,
    ADD COLUMN previous_record_omitted boolean NOT NULL DEFAULT false;

-- A claim counts its attempt before sending (attempts + 1, claimed_at), so an attempt whose
-- deliverer died mid-send is still in the log; first attempts and retries are claimed apart,
-- so a backlog of fresh deliveries never hides a due retry.
ALTER TABLE deliveries ADD COLUMN claimed_at timestamptz;
CREATE INDEX deliveries_first_due ON deliveries (next_attempt_at)
    WHERE status = 'pending' AND attempts = 0;
CREATE INDEX deliveries_retry_due ON deliveries (next_attempt_at)
    WHERE status = 'pending' AND attempts > 0;
DROP INDEX deliveries_due;
