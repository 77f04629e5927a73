"""Starts the whole stack on one machine: infrastructure, migrations and every service.

Used by `make run`, by the integration tests (a pytest session fixture) and by `make bench`.
"""
