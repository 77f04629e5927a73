-- Webhook configurations, the events they matched, deliveries and every attempt.

CREATE TABLE webhooks (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    target_url text NOT NULL CHECK (length(target_url) <= 2048),
    target_origin text NOT NULL,          -- scheme://host:port: the unit of per-target concurrency
    operations text[] NOT NULL,           -- {object|*}.{created|updated|deleted|*}
    description text NOT NULL DEFAULT '',
    is_active boolean NOT NULL DEFAULT true,
    secret_sealed bytea NOT NULL,         -- AES-GCM (nonce || ciphertext), see webhooks/sealing.py
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX webhooks_workspace ON webhooks (workspace_id, created_at, id);

-- Record events that matched at least one webhook, kept for (re)delivery. An event and its
-- deliveries are deleted together after WEBHOOK_DELIVERY_RETENTION once none is pending.
CREATE TABLE events (
    id uuid PRIMARY KEY,                  -- the record event id (JetStream Nats-Msg-Id)
    workspace_id uuid NOT NULL,
    object text NOT NULL,
    action text NOT NULL,
    record_id uuid NOT NULL,
    record json,                          -- null when the relay had to leave it out (size)
    previous_record json,
    occurred_at timestamptz NOT NULL,
    sequence bigint NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_received ON events (received_at);

CREATE TABLE deliveries (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    webhook_id uuid NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_id uuid NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    operation text NOT NULL,              -- <object>.<action> of the event
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,          -- when pending: due time; a claim moves it to its lease end
    lease uuid,                           -- the claim that may record the current attempt
    last_status_code integer,
    last_error text NOT NULL DEFAULT '',
    redelivery_of uuid,                   -- set on deliveries made by redeliverWebhookEvent
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
);
-- One delivery per (webhook, event) from the event stream, however often the event arrives.
CREATE UNIQUE INDEX deliveries_once ON deliveries (webhook_id, event_id) WHERE redelivery_of IS NULL;
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX deliveries_log ON deliveries (webhook_id, created_at DESC, id DESC);
CREATE INDEX deliveries_event ON deliveries (event_id);

CREATE TABLE delivery_attempts (
    delivery_id uuid NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    attempt integer NOT NULL,             -- 1-based
    attempted_at timestamptz NOT NULL,
    status_code integer,                  -- null when no response came
    latency_ms integer NOT NULL,
    error text NOT NULL DEFAULT '',
    PRIMARY KEY (delivery_id, attempt)
);
