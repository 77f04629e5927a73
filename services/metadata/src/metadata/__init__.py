"""The metadata service: objects and fields of each workspace."""
