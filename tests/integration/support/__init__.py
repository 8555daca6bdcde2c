"""Helpers for the integration tests that run real worker processes: an idempotent HTTP
ledger service (``ledger``) and a ``manage.py runworker`` subprocess runner (``processes``)."""
