"""The API rate limit: a sliding window per credential, kept in Redis (docs/api.md, Limits)."""
