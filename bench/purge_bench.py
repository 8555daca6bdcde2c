"""The retention purge at the issue's scale: the big test of
``tests/integration/test_retention.py`` (finished runs purged while a worker runs others;
nothing running touched, no orphan row) with 100,000 runs instead of CI's 10,000, on each
database named, printing how long seeding and purging took.

    .venv/bin/python -m bench.purge_bench                       # sqlite, postgres, mariadb
    .venv/bin/python -m bench.purge_bench --databases sqlite --runs 50000
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

TEST = (
    "tests/integration/test_retention.py::"
    "test_purging_many_finished_runs_beside_a_worker_touches_nothing_running"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--databases", default="sqlite,postgres,mariadb")
    args = parser.parse_args()
    failed = False
    print(f"load average {os.getloadavg()[0]:.1f}; {args.runs} finished runs per database")
    for database in args.databases.split(","):
        env = dict(os.environ, CLEAT_TEST_DB=database, CLEAT_RETENTION_TEST_RUNS=str(args.runs))
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", TEST, "-q", "-s", "-p", "no:cacheprovider"],
            env=env,
            capture_output=True,
            text=True,
        )
        total = time.monotonic() - began
        purged = re.search(r"purged (\d+) runs in ([0-9.]+)s", done.stdout)
        outcome = "passed" if done.returncode == 0 else "FAILED"
        failed |= done.returncode != 0
        figure = f"purge {purged.group(2)}s for {purged.group(1)} runs" if purged else "no figure"
        print(f"{database:9} {outcome:7} {figure}; whole test (seeding included) {total:.0f}s")
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
