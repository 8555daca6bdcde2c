"""The store benchmark's workload on DBOS Transact, for comparison (see ``bench/README.md``).

The same shape as cleat's: each workflow makes N steps that return at once; the workflows
are enqueued beforehand, then worker processes dequeue and run them. Driven by
``bench/store_bench.py``; each mode is one process::

    python -m bench.dbos_workload setup  --url URL --workflows 1000 --steps 10 --concurrency 8
    python -m bench.dbos_workload worker --url URL --workflows 1000 --executor w0 --concurrency 8

``setup`` creates DBOS's system database (its own migrations), registers the queue, and
enqueues the workflows without running any (it listens to no queue). ``worker`` launches
DBOS listening on the queue and exits once every workflow of the run has succeeded.
Requires ``pip install -r bench/requirements.txt``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from dbos import DBOS, DBOSConfig

QUEUE = "bench"
APP_VERSION = "bench"


@DBOS.step()
def echo_step() -> dict[str, Any]:
    return {}


@DBOS.workflow()
def steps_workflow(steps: int) -> bool:
    for _ in range(steps):
        echo_step()
    return True


def _config(url: str, name: str, pool: int) -> DBOSConfig:
    return {
        "name": "cleat-bench",
        "system_database_url": url,
        "application_version": APP_VERSION,
        "executor_id": name,
        "sys_db_pool_size": pool,
        "log_level": "WARNING",
        "run_admin_server": False,  # type: ignore[typeddict-unknown-key]
    }


def _launch(url: str, name: str, pool: int, listen: list[str] | None) -> None:
    config = _config(url, name, pool)
    try:
        DBOS(config=config)
    except Exception:  # an older/newer DBOS without one of the optional keys
        config.pop("run_admin_server", None)  # type: ignore[typeddict-item]
        DBOS(config=config)
    if listen is not None:
        DBOS.listen_queues(listen)
    DBOS.launch()


def _register_queue(concurrency: int, poll_s: float) -> Any:
    return DBOS.register_queue(
        QUEUE,
        worker_concurrency=concurrency,
        polling_interval_sec=poll_s,
        on_conflict="always_update",
    )


def _succeeded(url: str) -> int:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
        ).fetchone()
        return int(row[0]) if row else 0


def setup(args: argparse.Namespace) -> None:
    _launch(args.url, "setup", 4, listen=[])
    queue = _register_queue(args.concurrency, args.poll)
    for _ in range(args.workflows):
        queue.enqueue(steps_workflow, args.steps)
    DBOS.destroy()
    print(f"enqueued {args.workflows}")


def worker(args: argparse.Namespace) -> None:
    _launch(args.url, args.executor, max(4, args.concurrency + 4), listen=[QUEUE])
    _register_queue(args.concurrency, args.poll)
    deadline = time.monotonic() + args.timeout
    done = 0
    while time.monotonic() < deadline:
        done = _succeeded(args.url)
        if done >= args.workflows:
            break
        time.sleep(0.05)
    DBOS.destroy(workflow_completion_timeout_sec=5)
    print(f"succeeded {done}")
    sys.exit(0 if done >= args.workflows else 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["setup", "worker"])
    parser.add_argument("--url", required=True, help="postgresql:// URL of DBOS's database")
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8, help="worker_concurrency")
    parser.add_argument("--poll", type=float, default=0.05, help="queue polling interval (s)")
    parser.add_argument("--executor", default="w0")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    {"setup": setup, "worker": worker}[args.mode](args)


if __name__ == "__main__":
    main()
