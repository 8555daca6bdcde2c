"""The first run of a freshly deployed Python workflow, on a worker that has never seen it.

    .venv/bin/python -m bench.deploy_bench                    # SQLite in a temporary folder
    .venv/bin/python -m bench.deploy_bench --database-url postgres://postgres@127.0.0.1/cleat_bench

The Python workload of ``bench.python_bench`` (10 durable calls to ``bench.echo``) is deployed
with ``manage.py deploy_workflow``, which compiles it and stores the compiled artifact in the
database (``workflows/artifacts.py``). Then a worker process with an empty disk cache of its
own (another machine, or a new container) starts a run and executes it with
``runworker --burst``: once with the shared artifacts (``CLEAT_SHARE_COMPILED`` on, the
default) and once without (the worker compiles the ~19 MB component itself). The figures are
taken inside the worker process, after Django's set-up: from the run's start to its end, and
how long the module's load took.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.python_bench import build_steps_component

ROOT = Path(__file__).resolve().parent.parent
GOAL_FIRST_RUN_S = 1.0

# Runs in the worker process: start a run, execute it with a burst worker, report.
WORKER_SCRIPT = """
import json, os, sys, time
sys.path.insert(0, {root!r})
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleat_project.settings")
import django
django.setup()
from workflows import client
from workflows.executor import get_runtime
from workflows.worker import Worker, WorkerOptions
runtime = get_runtime()
t0 = time.perf_counter()
run = client.start("steps", 10)
Worker(WorkerOptions(worker_id="bench-first-run", burst=True, concurrency=1)).run()
t1 = time.perf_counter()
modules = runtime.modules
print(json.dumps({{
    "status": client.get(run.id).status,
    "first_run_s": t1 - t0,
    "shared_hits": modules.shared_hits,
    "compiled": modules.misses,
}}))
"""


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="", help="default: SQLite in a temporary folder")
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    wasm, built = build_steps_component()
    how = "from the build cache" if built["cached"] else f"built in {built['seconds']:.0f} s"
    print(f"component: {len(wasm) / 1e6:.1f} MB, {how}")
    with tempfile.TemporaryDirectory(prefix="cleat-deploy-bench-") as tmp:
        folder = Path(tmp)
        module = folder / "steps.wasm"
        module.write_bytes(wasm)
        env = dict(
            os.environ,
            DEBUG="1",
            SECRET_KEY="deploy-bench-secret",
            DATABASE_URL=args.database_url or f"sqlite:///{folder / 'bench.sqlite3'}",
            CLEAT_SERVICES=json.dumps({"bench": "bench.store_bench.echo"}),
            CLEAT_MODULE_CACHE_DIR=str(folder / "web-cache"),
        )
        manage = [sys.executable, "manage.py"]
        run([*manage, "migrate", "--verbosity", "0"], env)
        began = time.monotonic()
        run([*manage, "deploy_workflow", "steps", str(module)], env)
        print(f"deploy (compiles, stores the artifact): {time.monotonic() - began:.1f} s")
        script = WORKER_SCRIPT.format(root=str(ROOT))
        for share in ("1", "0"):
            worker_env = dict(
                env,
                CLEAT_SHARE_COMPILED=share,
                CLEAT_MODULE_CACHE_DIR=str(folder / f"worker-cache-{share}"),
            )
            out = run([sys.executable, "-c", script], worker_env).stdout.strip().splitlines()[-1]
            got = json.loads(out)
            label = "shared artifact" if share == "1" else "compiled by the worker"
            verdict = ""
            if share == "1":
                met = got["first_run_s"] <= GOAL_FIRST_RUN_S
                verdict = f"(goal <= {GOAL_FIRST_RUN_S:.0f} s: {'met' if met else 'MISSED'})"
            print(
                f"first run on a new worker, {label}: {got['first_run_s']:.2f} s, "
                f"status {got['status']}, artifacts read {got['shared_hits']}, "
                f"compiles {got['compiled']} {verdict}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
