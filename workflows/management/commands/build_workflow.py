"""``manage.py build_workflow app.py -o app.wasm``: build a Python workflow module into a
WebAssembly component (componentize-py), cached by the hash of its sources, the SDK, the WIT
world and the componentize-py version. ``deploy_workflow NAME app.wasm`` deploys the result."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

# The checkout's SDK, found from this app (a project that embeds cleat has its own BASE_DIR).
SDK_PYTHON = Path(__file__).resolve().parents[3] / "sdk" / "python"


def _build_module() -> Any:
    """``cleat_workflow.build`` from the repository's SDK (it is not an installed package)."""
    if str(SDK_PYTHON) not in sys.path:
        sys.path.insert(0, str(SDK_PYTHON))
    from cleat_workflow import build

    return build


class Command(BaseCommand):
    help = "Build a Python workflow module (@workflow functions) into a .wasm component."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("app", help="the workflow module, e.g. app.py")
        parser.add_argument(
            "-o", "--output", help="where to write the component (default: APP with .wasm)"
        )
        parser.add_argument(
            "--python-path",
            action="append",
            default=[],
            help="another directory of pure-Python modules the app imports (repeatable)",
        )
        parser.add_argument(
            "--force", action="store_true", help="build even if the cache has this build"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        build = _build_module()
        app = Path(options["app"])
        output = Path(options["output"]) if options["output"] else app.with_suffix(".wasm")
        try:
            result = build.build_component(
                app,
                output,
                python_path=options["python_path"],
                force=options["force"],
                # componentize-py takes a while: say so, on stderr (stdout is the result).
                progress=lambda line: self.stderr.write(line),
            )
        except build.BuildError as exc:
            raise CommandError(str(exc)) from None
        how = "from the build cache" if result.cached else f"built in {result.seconds:.0f} s"
        size = result.path.stat().st_size
        self.stdout.write(f"{result.path} ({size / 1e6:.1f} MB, {how}, key {result.key[:12]})")
