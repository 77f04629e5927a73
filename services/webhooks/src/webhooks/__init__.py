"""The webhooks service: webhook configurations and the deliverer worker."""
