"""A workspace's data model as the gateway sees it (from MetadataService/GetWorkspaceSchema),
cached per workspace and metadata version, with what is derived from it (GraphQL schema, OpenAPI)
cached per content fingerprint."""
