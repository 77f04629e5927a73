-- The W3C trace context (traceparent, tracestate) the event arrived with, so each delivery
-- attempt, made later and maybe by another replica, continues the trace of the change.
ALTER TABLE events ADD COLUMN trace_context jsonb NOT NULL DEFAULT '{}';
