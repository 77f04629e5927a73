"""The identity service: workspaces, users, sessions, API keys, OAuth, roles."""
