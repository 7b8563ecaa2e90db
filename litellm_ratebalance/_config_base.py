"""Base model and helpers shared by every settings model of the package."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from litellm_ratebalance.errors import ConfigurationError, redact

__all__ = ["SettingsModel", "configuration_error"]


class SettingsModel(BaseModel):
    """Frozen, typo-proof settings: unknown keys are errors (they are usually misspellings)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def configuration_error(exc: ValidationError, root: str) -> ConfigurationError:
    """Turn a pydantic error into one ConfigurationError naming each key path under ``root``.

    Range problems read ``must be between LO and HI`` when the field declares both bounds (see the
    ``Field(ge=..., le=...)`` declarations); unknown keys list the valid ones.
    """
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        loc = [str(part) for part in error["loc"]]
        message = error["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if not loc and ": " in message and " " not in message.split(": ", 1)[0]:
            # A model-level rule names its own key path ("ratebalance.limiter.lendable: ...").
            head, message = message.split(": ", 1)
            loc = head.split(".")
            error = {**error, "type": "model_rule"}
        path = ".".join([root, *loc]) if root else ".".join(loc)
        if error["type"] == "extra_forbidden":
            message = "unknown setting"
            model = _model_at(exc, loc[:-1])
            if model is not None:
                message += f"; valid keys here: {', '.join(sorted(model.model_fields))}"
        elif error["type"] in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            bounds = _bounds_at(exc, loc)
            if bounds is not None:
                message = f"must be between {bounds[0]} and {bounds[1]}"
        if "input" in error and error["type"] not in ("missing", "model_rule", "value_error") and loc:
            message += f" (got {error['input']!r})"
        # A rejected value may be a URL with a password in it: never echo credentials.
        lines.append(redact(f"{path}: {message}"))
    return ConfigurationError("invalid configuration:\n  " + "\n  ".join(lines))


def _model_at(exc: ValidationError, loc: list[str]) -> type[BaseModel] | None:
    """The settings model class found by walking ``loc`` from the failed model's fields."""
    title = exc.title
    model = _REGISTRY.get(title)
    for part in loc:
        if model is None:
            return None
        field = model.model_fields.get(part)
        if field is None:
            # A dict entry (e.g. a feature name): keep the value model of the dict.
            continue
        model = _model_of(field.annotation)
    return model


def _bounds_at(exc: ValidationError, loc: list[str]) -> tuple[object, object] | None:
    model = _model_at(exc, loc[:-1])
    metadata: list[object] = []
    if model is not None and loc[-1] in model.model_fields:
        metadata = list(model.model_fields[loc[-1]].metadata)
    elif len(loc) >= 2:
        # An entry of a dict-valued field: the bounds sit on the dict's value type.
        parent = _model_at(exc, loc[:-2])
        field = parent.model_fields.get(loc[-2]) if parent is not None else None
        args: tuple[Any, ...] = tuple(getattr(field.annotation, "__args__", ())) if field is not None else ()
        if len(args) == 2:
            for meta in getattr(args[-1], "__metadata__", ()):
                # Field(...) inside Annotated keeps its bounds in its own .metadata (Ge/Le objects).
                metadata.extend(getattr(meta, "metadata", [meta]))
    if not metadata:
        return None
    low: object = None
    high: object = None
    for meta in metadata:
        low = getattr(meta, "ge", getattr(meta, "gt", low))
        high = getattr(meta, "le", getattr(meta, "lt", high))
    if low is None or high is None:
        return None
    return low, high


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


_REGISTRY: dict[str, type[BaseModel]] = {}


def register(model: type[BaseModel]) -> type[BaseModel]:
    """Make a root model findable by the error formatter (pydantic reports the root's title)."""
    _REGISTRY[model.__name__] = model
    return model
