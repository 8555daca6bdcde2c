"""Forms of the definitions pages: deploy a module, point a tag, set routing weights.

They validate what was typed; the deploy itself (wasmtime's validation included), the tags
and the routing rules are changed by ``workflows.services`` / ``workflows.definitions``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django import forms

from workflows.models import ChildBinding, name_validator

MAX_MODULE_BYTES = 64 * 1024 * 1024


class DeployForm(forms.Form):
    name = forms.CharField(
        max_length=128,
        validators=[name_validator],
        help_text="The workflow's name; deploying a name again adds its next version.",
    )
    wasm = forms.FileField(
        label="Module (.wasm)",
        help_text="A WebAssembly core module or component built for guest ABI v1.",
    )
    version = forms.IntegerField(
        required=False, min_value=1, help_text="Leave empty for the next version."
    )
    min_version = forms.IntegerField(
        required=False,
        min_value=0,
        initial=0,
        help_text="Oldest version whose histories this code can still replay.",
    )
    retry_max_attempts = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1000,
        help_text="Attempts for a retryable failure before dead-lettering (default 3).",
    )
    child_binding = forms.ChoiceField(
        required=False,
        choices=ChildBinding.choices,
        help_text="How this version's children get their versions.",
    )
    child_versions = forms.CharField(
        required=False,
        help_text="With child binding frozen: the pinned versions, e.g. payment=3, email=1.",
    )
    plugin_dependencies = forms.JSONField(
        required=False,
        help_text='Semver constraints on plugins, e.g. {"llm": ">=1.2.0"}; resolved now to '
        "the newest configured versions that satisfy them.",
    )
    allowed_signal_callers = forms.CharField(
        required=False,
        help_text="With signal authorization on: the workflows whose runs may signal this "
        "version's runs, comma-separated (empty: none may).",
    )

    def clean_wasm(self) -> Any:
        upload = self.cleaned_data["wasm"]
        if upload.size > MAX_MODULE_BYTES:
            raise forms.ValidationError(
                f"the module is {upload.size} bytes; at most {MAX_MODULE_BYTES} are accepted"
            )
        self.cleaned_data["wasm_bytes"] = upload.read()
        return upload


class TagForm(forms.Form):
    tag = forms.CharField(max_length=64, validators=[name_validator], help_text="e.g. stable")
    version = forms.TypedChoiceField(coerce=int, choices=())

    def __init__(self, *args: Any, versions: Sequence[int] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].choices = [(v, f"v{v}") for v in versions]  # type: ignore[attr-defined]


class RoutingForm(forms.Form):
    """One weight per routable (non-deprecated) version; an empty field leaves the version out,
    0 keeps it with no share."""

    def __init__(
        self,
        *args: Any,
        versions: Sequence[int] = (),
        weights: Mapping[int, float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        for version in versions:
            self.fields[f"weight_{version}"] = forms.FloatField(
                label=f"v{version}",
                required=False,
                min_value=0,
                initial=(weights or {}).get(version),
            )

    def rules(self) -> list[tuple[int, float]]:
        rules = []
        for name, value in self.cleaned_data.items():
            if name.startswith("weight_") and value is not None:
                rules.append((int(name.removeprefix("weight_")), float(value)))
        return sorted(rules)
