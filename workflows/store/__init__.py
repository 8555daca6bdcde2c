"""The Django store: the engine's storage protocols on the ORM, the run lifecycle (claim,
finalize, heartbeat, reap), and per-dialect SQL where the ORM cannot say it."""
