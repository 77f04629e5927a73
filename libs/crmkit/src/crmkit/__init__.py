"""The runtime kit every CRM process shares: settings, logs, traces, metrics, gRPC, DB, NATS."""
