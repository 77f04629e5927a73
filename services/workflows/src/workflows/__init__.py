"""The workflows service: workflow configurations and the runner worker."""
