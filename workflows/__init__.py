"""The workflows app: definitions, instances, history, store, worker, services, API, admin."""
