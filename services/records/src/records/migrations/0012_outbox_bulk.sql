-- Rows written by a bulk write (an import): the relay publishes consecutive ones of one
-- statement together, several events to a message (docs/events.md, "Bulk writes").
ALTER TABLE outbox ADD COLUMN bulk boolean NOT NULL DEFAULT false;
