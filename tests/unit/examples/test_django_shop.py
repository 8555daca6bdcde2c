"""docs/embedding.md, executed: its ```` ```sh embedding ```` block runs in one bash process
in examples/django_shop (an existing Django project that added cleat): migrate, build and
deploy the checkout workflow, run the worker, then the project's own test suite
(``manage.py test shop``), in which a view starts a checkout run, the worker carries it and a
signal from another view completes it.

The example uses its own settings and SQLite files (in the test's temporary directory), not
the suite's database, so it runs once, here, rather than in every database pass; the
workflow comes from the build cache (``cleat_workflow.build``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "embedding.md"
BLOCK = re.compile(r"^```sh embedding\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_the_documented_embedding_runs_and_the_shop_checkout_completes(tmp_path: Path) -> None:
    blocks = BLOCK.findall(DOC.read_text(encoding="utf-8"))
    assert len(blocks) == 1, "docs/embedding.md lost its embedding block"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        SHOP_DB=str(tmp_path / "shop.sqlite3"),
        SHOP_TEST_DB=str(tmp_path / "test-shop.sqlite3"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + blocks[0]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    assert "Traceback" not in done.stderr, report
    assert done.stdout.count("Applying workflows.") >= 5, report
    assert re.search(r"^1$", done.stdout, re.MULTILINE), report  # the deployed version
    assert "Ran 4 tests" in done.stderr, report
    assert re.search(r"^OK$", done.stderr, re.MULTILINE), report
