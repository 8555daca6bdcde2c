"""``manage.py deploy_workflow NAME PATH``: deploy a module and print its version."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import wasmtime
from django.core.management.base import BaseCommand, CommandError, CommandParser

from engine.backend import detect_kind
from engine.errors import InvalidModule
from engine.versions import ChildBinding
from workflows import artifacts
from workflows.api.parsers import max_module_bytes
from workflows.definitions import (
    deploy_definition,
    parse_child_versions,
    parse_plugin_dependencies,
)
from workflows.management.commands._common import (
    VersionOptionMixin,
    add_tenant_argument,
    fail,
    tenant_from,
)
from workflows.services import ServiceError


class Command(VersionOptionMixin, BaseCommand):
    help = "Deploy a workflow module (.wasm, or .wat text) as the next version of NAME."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("path")
        parser.add_argument("--version", type=int, default=None, dest="def_version")
        parser.add_argument("--min-version", type=int, default=0)
        parser.add_argument(
            "--max-history", type=int, default=0, help="events before continue-as-new"
        )
        parser.add_argument(
            "--child-binding",
            default="",
            choices=[b.value for b in ChildBinding if b.value],
            help="how this version's children get their versions (default: the parent's "
            "version, else the newest compatible)",
        )
        parser.add_argument(
            "--child-version",
            action="append",
            default=[],
            metavar="NAME=VERSION",
            help="with --child-binding frozen: pin a child workflow's version (repeatable)",
        )
        parser.add_argument(
            "--signal-caller",
            action="append",
            default=[],
            metavar="WORKFLOW",
            help="a workflow whose runs may signal this version's runs while "
            "CLEAT_REQUIRE_SIGNAL_AUTH is on (repeatable; none: no workflow may)",
        )
        parser.add_argument(
            "--plugin",
            action="append",
            default=[],
            metavar="NAME:CONSTRAINT",
            help="a plugin dependency with its semver constraint, e.g. 'llm:>=1.2.0' "
            "(repeatable), resolved now to the newest configured version that satisfies it",
        )
        add_tenant_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_from(options)
        path = Path(options["path"])
        limit = max_module_bytes()
        try:
            # Never more than the upload limit plus one byte: the path may name a device or
            # a file of any size (/dev/zero would otherwise be read until memory runs out).
            with path.open("rb") as module_file:
                data = module_file.read(limit + 1)
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        if len(data) > limit:
            raise CommandError(
                f"{path} is larger than {limit} bytes, the module size limit "
                "(CLEAT_API_MAX_MODULE_BYTES)"
            )
        if path.suffix == ".wat":
            try:
                data = wasmtime.wat2wasm(data.decode())
            except (wasmtime.WasmtimeError, UnicodeDecodeError) as exc:
                raise CommandError(f"{path} is not valid WAT: {exc}") from None
        try:
            component = detect_kind(data) == "component"
        except InvalidModule:
            component = False  # deploy_definition refuses it, naming why
        if component:
            # A Python workflow's component compiles for seconds: say so, or it looks hung.
            self.stderr.write(
                f"compiling the component ({len(data) / 1e6:.1f} MB) with wasmtime: seconds "
                "the first time these bytes are deployed"
            )
        began = time.monotonic()
        try:
            pins = parse_child_versions(options["child_version"])
            definition = deploy_definition(
                tenant,
                options["name"],
                data,
                version=options["def_version"],
                min_version=options["min_version"],
                max_history_length=options["max_history"],
                child_binding=options["child_binding"],
                child_versions=pins,
                allowed_signal_callers=options["signal_caller"],
                plugin_dependencies=parse_plugin_dependencies(options["plugin"]),
            )
        except ServiceError as exc:
            raise fail(exc) from None
        if component:
            where = (
                "; every worker loads it from the database (CLEAT_SHARE_COMPILED)"
                if artifacts.enabled()
                else ""
            )
            self.stderr.write(f"compiled in {time.monotonic() - began:.1f} s{where}")
        self.stdout.write(str(definition.version))
