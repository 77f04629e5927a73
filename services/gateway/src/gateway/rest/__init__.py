"""REST API: /rest/{object}[/{id}], batch, duplicates, merge, groupBy, restore, open-api."""
