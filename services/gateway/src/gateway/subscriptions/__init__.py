"""GraphQL subscriptions: record events from NATS JetStream to WebSocket subscribers.

- `events`: a JetStream message → `RecordChange` (the `crm.events.v1.RecordEvent` envelope).
- `feed`: the one JetStream consumer of this gateway process (new events only, resumes after the
  last event seen when NATS comes back).
- `hub`: fan-out by (workspace, object, action) to the subscriptions open on this process, each
  with a bounded queue, so a slow subscriber never slows the others.
- `protocol`: the `graphql-transport-ws` and legacy `graphql-ws` wire formats.
- `session`: one WebSocket connection (init, auth, operations, keep-alive, revalidation).
- `endpoint`: the WebSocket route at /graphql.
- `fields`: `<singular>Created/Updated/Deleted` for every object of a workspace's data model.
- `admission`: where every operation started over a socket is counted (and rate limited).
"""
