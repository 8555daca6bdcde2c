"""``manage.py build_workflow app.py -o app.wasm``: build a Python workflow module into a
WebAssembly component (componentize-py), cached by the hash of its sources, the SDK, the WIT
world and the componentize-py version. ``deploy_workflow NAME app.wasm`` deploys the result.

A Rust (``.rs`` or ``Cargo.toml``), C, Zig or AssemblyScript (``.ts``) source is built into a
core module instead, by ``workflows.guest_build``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows import guest_build

# The checkout's SDK, found from this app (a project that embeds cleat has its own BASE_DIR).
SDK_PYTHON = Path(__file__).resolve().parents[3] / "sdk" / "python"


def _build_module() -> Any:
    """``cleat_workflow.build`` from the repository's SDK (it is not an installed package)."""
    if str(SDK_PYTHON) not in sys.path:
        sys.path.insert(0, str(SDK_PYTHON))
    from cleat_workflow import build

    return build


class Command(BaseCommand):
    help = (
        "Build a workflow into a .wasm module: Python (@workflow functions) into a component; "
        "Rust (.rs, Cargo.toml), C, Zig or AssemblyScript (.ts) into a core module."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "app",
            help="the workflow source: app.py, saga.rs, Cargo.toml, saga.c, saga.zig, saga.ts",
        )
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
        app = Path(options["app"])
        output = Path(options["output"]) if options["output"] else app.with_suffix(".wasm")
        if guest_build.language_of(app) is not None:
            self._build_guest(app, output, options["force"])
            return
        build = _build_module()
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

    def _build_guest(self, source: Path, output: Path, force: bool) -> None:
        """A Rust, C, Zig or AssemblyScript workflow: a core module, with a line per stage."""

        def progress(line: str) -> None:
            self.stdout.write(f"  {line}")
            self.stdout.flush()

        try:
            result = guest_build.build(source, output, force=force, progress=progress)
        except guest_build.BuildError as exc:
            raise CommandError(f"{source}: {exc}") from None
        how = "from the build cache" if result.cached else f"built in {result.seconds:.1f} s"
        size = result.path.stat().st_size
        self.stdout.write(f"{result.path} ({size / 1e3:.1f} kB, {how}, key {result.key[:12]})")
