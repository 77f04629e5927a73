"""GraphQL: the schema parts each feature contributes, and how they are served."""
