-- Workspaces, their users and roles, and every credential identity issues.
-- Secrets (API keys, personal access tokens, OAuth client secrets, codes, reset tokens) are
-- stored as SHA-256 hashes; passwords as argon2id hashes.

CREATE TABLE workspaces (
    id uuid PRIMARY KEY,
    name text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Built-in roles (builtin = 'admin' | 'member') exist once per workspace; custom roles carry
-- their permissions as [{"object": "<name>|*", "actions": ["READ", ...]}] and flag names.
CREATE TABLE roles (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name text NOT NULL,
    description text NOT NULL DEFAULT '',
    builtin text CHECK (builtin IN ('admin', 'member')),
    permissions jsonb NOT NULL DEFAULT '[]',
    flags text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX roles_workspace_name ON roles (workspace_id, lower(name));
CREATE UNIQUE INDEX roles_workspace_builtin ON roles (workspace_id, builtin) WHERE builtin IS NOT NULL;
CREATE INDEX roles_page ON roles (workspace_id, created_at, id);

-- One account per (workspace, email); the same email may belong to several workspaces.
CREATE TABLE users (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    email text NOT NULL CHECK (email = lower(email)),
    password_hash text NOT NULL,
    first_name text NOT NULL DEFAULT '',
    last_name text NOT NULL DEFAULT '',
    role_id uuid NOT NULL REFERENCES roles (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX users_workspace_email ON users (workspace_id, email);
CREATE INDEX users_email ON users (email);
CREATE INDEX users_role ON users (role_id);
CREATE INDEX users_page ON users (workspace_id, created_at, id);

CREATE TABLE oauth_clients (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    client_id text NOT NULL UNIQUE,
    secret_hash bytea,  -- NULL for public clients (PKCE required)
    name text NOT NULL,
    redirect_uris text[] NOT NULL,
    scopes text[] NOT NULL,
    is_public boolean NOT NULL DEFAULT false,
    created_by uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    deleted_at timestamptz
);
CREATE INDEX oauth_clients_page ON oauth_clients (workspace_id, created_at, id) WHERE deleted_at IS NULL;

-- A grant is a login session or an OAuth authorization: a family of rotating refresh tokens.
-- Access tokens carry its id as `jti`; revoking it revokes every token of the family.
CREATE TABLE grants (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    kind text NOT NULL CHECK (kind IN ('session', 'oauth')),
    oauth_client_id uuid REFERENCES oauth_clients (id) ON DELETE CASCADE,
    scopes text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz,
    revoked_reason text
);
CREATE INDEX grants_active_user ON grants (user_id) WHERE revoked_at IS NULL;
CREATE INDEX grants_active_client ON grants (oauth_client_id) WHERE revoked_at IS NULL;

CREATE TABLE refresh_tokens (
    id uuid PRIMARY KEY,  -- the refresh token's jti
    grant_id uuid NOT NULL REFERENCES grants (id) ON DELETE CASCADE,
    issued_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at timestamptz
);
CREATE INDEX refresh_tokens_grant ON refresh_tokens (grant_id);
CREATE INDEX refresh_tokens_expiry ON refresh_tokens (expires_at);

CREATE TABLE api_keys (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name text NOT NULL,
    secret_hash bytea NOT NULL,
    role_id uuid NOT NULL REFERENCES roles (id),
    expires_at timestamptz,
    created_by uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX api_keys_page ON api_keys (workspace_id, created_at, id) WHERE revoked_at IS NULL;
CREATE INDEX api_keys_role ON api_keys (role_id) WHERE revoked_at IS NULL;

CREATE TABLE personal_access_tokens (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name text NOT NULL,
    secret_hash bytea NOT NULL,
    expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX personal_access_tokens_page
    ON personal_access_tokens (user_id, created_at, id) WHERE revoked_at IS NULL;

-- Single use: used_at is set on exchange; a second exchange revokes the grant it produced.
CREATE TABLE authorization_codes (
    code_hash bytea PRIMARY KEY,
    oauth_client_id uuid NOT NULL REFERENCES oauth_clients (id) ON DELETE CASCADE,
    workspace_id uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    redirect_uri text NOT NULL,
    scopes text[] NOT NULL,
    code_challenge text NOT NULL DEFAULT '',
    code_challenge_method text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at timestamptz,
    grant_id uuid REFERENCES grants (id) ON DELETE SET NULL
);
CREATE INDEX authorization_codes_expiry ON authorization_codes (expires_at);

CREATE TABLE password_reset_tokens (
    token_hash bytea PRIMARY KEY,
    user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at timestamptz
);
CREATE INDEX password_reset_tokens_expiry ON password_reset_tokens (expires_at);

-- Emails waiting for the sender (a background job, several replicas: SKIP LOCKED). A row is
-- deleted once sent, so the reset token it carries does not outlive its delivery.
CREATE TABLE email_outbox (
    id uuid PRIMARY KEY,
    recipient text NOT NULL,
    subject text NOT NULL,
    body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    failed_at timestamptz,
    last_error text
);
CREATE INDEX email_outbox_due ON email_outbox (next_attempt_at) WHERE failed_at IS NULL;
