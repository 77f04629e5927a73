-- Objects and fields of every workspace, and each workspace's metadata version.

-- Versions come from one sequence, so a number is never handed out twice: an attempt that ran
-- its DDL but never committed (a crash) can not collide with the next change's version.
CREATE SEQUENCE version_seq;

CREATE TABLE workspaces (
    workspace_id uuid PRIMARY KEY,
    version bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE objects (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL REFERENCES workspaces (workspace_id) ON DELETE CASCADE,
    position bigint GENERATED ALWAYS AS IDENTITY,
    name_singular text NOT NULL,
    name_plural text NOT NULL,
    label_singular text NOT NULL,
    label_plural text NOT NULL,
    description text NOT NULL DEFAULT '',
    icon text NOT NULL DEFAULT '',
    is_custom boolean NOT NULL,
    is_active boolean NOT NULL DEFAULT true,
    is_system boolean NOT NULL DEFAULT false,
    label_identifier_field text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, name_singular),
    UNIQUE (workspace_id, name_plural)
);
CREATE INDEX objects_workspace ON objects (workspace_id, position);

CREATE TABLE fields (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    object_id uuid NOT NULL REFERENCES objects (id) ON DELETE CASCADE,
    position bigint GENERATED ALWAYS AS IDENTITY,
    name text NOT NULL,
    label text NOT NULL,
    type text NOT NULL,               -- FieldType name without prefix: TEXT, CURRENCY, ...
    description text NOT NULL DEFAULT '',
    icon text NOT NULL DEFAULT '',
    is_nullable boolean NOT NULL DEFAULT true,
    default_value jsonb,              -- NULL: no default
    is_custom boolean NOT NULL,
    is_active boolean NOT NULL DEFAULT true,
    is_system boolean NOT NULL DEFAULT false,
    is_unique boolean NOT NULL DEFAULT false,
    options jsonb NOT NULL DEFAULT '[]',  -- [{value, label, color, position}]
    relation jsonb,                   -- {kind, targetObjectMetadataId, inverseFieldName, onDelete}
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (object_id, name)
);
CREATE INDEX fields_workspace ON fields (workspace_id, position);
CREATE INDEX fields_object ON fields (object_id, position);
