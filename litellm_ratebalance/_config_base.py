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

    Every line reads ``<root>.<key path>: <what is wrong> (got <value>)`` and says what is valid:

    * range problems: ``must be between LO and HI`` (from the ``Field(ge=..., le=...)`` declarations,
      also for optional fields and list or dict entries);
    * a fixed set of values: ``must be 'a' or 'b'``; booleans: ``must be true or false``;
      numbers: ``must be an integer`` / ``must be a number``; a section: ``must be a mapping with keys ...``;
    * unknown keys list the valid keys at that level;
    * a value that may take several forms (a fraction or ``{type, value}``) gets one line naming the forms,
      or the error of the form it was evidently meant as (a mapping: the mapping's error).

    Messages never echo credentials (see :func:`litellm_ratebalance.errors.redact`).
    """
    lines: list[str] = []
    for error in _without_union_noise(exc.errors(include_url=False)):
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
        kind = error["type"]
        if kind == "extra_forbidden":
            message = "unknown setting"
            model = _model_at(exc, loc[:-1])
            if model is not None:
                message += f"; valid keys here: {', '.join(sorted(model.model_fields))}"
        elif kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            bounds = _bounds_at(exc, loc)
            if bounds is not None:
                low, high, low_open, high_open = bounds
                if not low_open and not high_open:
                    message = f"must be between {low} and {high}"
                else:
                    message = (
                        f"must be {'more than' if low_open else 'at least'} {low} "
                        f"and {'less than' if high_open else 'at most'} {high}"
                    )
        elif kind == "literal_error":
            message = f"must be {error.get('ctx', {}).get('expected', 'one of the listed values')}"
        elif kind == "union_forms":
            message = "must be " + " or ".join(error["forms"])
        elif kind in _TYPE_MESSAGES:
            message = _TYPE_MESSAGES[kind]
        elif kind == "model_type":
            model = _model_at(exc, loc)
            message = "must be a mapping of settings"
            if model is not None:
                message += f" with keys {', '.join(sorted(model.model_fields))}"
        if "input" in error and kind not in ("missing", "model_rule", "value_error") and loc:
            message += f" (got {error['input']!r})"
        # A rejected value may be a URL with a password in it: never echo credentials.
        lines.append(redact(f"{path}: {message}"))
    return ConfigurationError("invalid configuration:\n  " + "\n  ".join(lines))


_TYPE_MESSAGES = {
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer (no fractional part)",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "finite_number": "must be a finite number",
}

_FORM_NAMES = {
    "float": "a number",
    "int": "an integer",
    "str": "a string",
    "bool": "true or false",
    "none": "null",
}


def _union_tag(part: object) -> str | None:
    """The name of a union member in an error location (pydantic puts it there: ``float``,
    ``ReservationSpec``, ``function-after[...]``), else ``None`` for a key or index."""
    if not isinstance(part, str):
        return None
    if part in _FORM_NAMES or part in _MODEL_NAMES or "[" in part:
        return part
    return None


def _without_union_noise(errors: list[Any]) -> list[Any]:
    """Merge the per-member errors pydantic reports for a value that may take several forms.

    The errors of one value come from each member it was tried as. If one member got further into the
    value (a mapping tried as the settings model it evidently is), only that member's errors are kept;
    if none did, one error lists the forms the value may take.
    """
    groups: dict[tuple[str, ...], list[tuple[int, Any]]] = {}
    order: list[Any] = []
    for error in errors:
        loc = list(error["loc"])
        cut = next((i for i, part in enumerate(loc) if _union_tag(part) is not None), None)
        if cut is None:
            order.append(error)
            continue
        key = tuple(str(part) for part in loc[:cut])
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((cut, error))
    merged: list[Any] = []
    for item in order:
        if not isinstance(item, tuple):
            merged.append(item)
            continue
        members = groups[item]
        depth = {str(error["loc"][cut]): len(error["loc"]) - cut for cut, error in members}
        deepest = max(depth.values())
        winners = {tag for tag, d in depth.items() if d == deepest}
        if deepest > 1 and len(winners) == 1:
            # Keep the member that got inside the value, without its tag in the path.
            for cut, error in members:
                if str(error["loc"][cut]) in winners:
                    merged.append({**error, "loc": (*error["loc"][:cut], *error["loc"][cut + 1 :])})
            continue
        forms: list[str] = []
        for cut, error in members:
            tag = str(error["loc"][cut])
            model = _MODEL_NAMES.get(tag)
            form = (
                f"a mapping with keys {', '.join(sorted(model.model_fields))}"
                if model is not None
                else _FORM_NAMES.get(tag, tag)
            )
            if form not in forms:
                forms.append(form)
        first = members[0][1]
        merged.append({"type": "union_forms", "loc": item, "msg": "", "input": first.get("input"), "forms": forms})
    return merged


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


def _bounds_at(exc: ValidationError, loc: list[str]) -> tuple[object, object, bool, bool] | None:
    """(low, high, low is exclusive, high is exclusive) declared for the value at ``loc``."""
    model = _model_at(exc, loc[:-1])
    metadata: list[object] = []
    if model is not None and loc[-1] in model.model_fields:
        field = model.model_fields[loc[-1]]
        metadata = [*field.metadata, *_annotated_metadata(field.annotation)]
    elif len(loc) >= 2:
        # An entry of a dict- or list-valued field: the bounds sit on the value type.
        parent = _model_at(exc, loc[:-2])
        entry_field = parent.model_fields.get(loc[-2]) if parent is not None else None
        if entry_field is not None:
            for container in _members(entry_field.annotation):
                args = tuple(getattr(container, "__args__", ()))
                if args and getattr(container, "__origin__", None) in (dict, list, tuple, set, frozenset):
                    metadata.extend(_annotated_metadata(args[-1]))
    if not metadata:
        return None
    low: object = None
    high: object = None
    low_open = high_open = False
    for meta in metadata:
        if getattr(meta, "ge", None) is not None:
            low, low_open = meta.ge, False  # type: ignore[attr-defined]
        elif getattr(meta, "gt", None) is not None:
            low, low_open = meta.gt, True  # type: ignore[attr-defined]
        if getattr(meta, "le", None) is not None:
            high, high_open = meta.le, False  # type: ignore[attr-defined]
        elif getattr(meta, "lt", None) is not None:
            high, high_open = meta.lt, True  # type: ignore[attr-defined]
    if low is None or high is None:
        return None
    return low, high, low_open, high_open


def _members(annotation: object) -> list[object]:
    """``annotation`` itself, or the members of a union (``X | None``)."""
    if getattr(annotation, "__origin__", None) is not None and type(annotation).__name__ == "_AnnotatedAlias":
        return [annotation]
    args = getattr(annotation, "__args__", None)
    if args is not None and type(annotation).__name__ in ("UnionType", "_UnionGenericAlias"):
        return list(args)
    return [annotation]


def _annotated_metadata(annotation: object) -> list[object]:
    """Constraint objects (Ge/Le ...) of ``Annotated[T, Field(...)]``, looking through ``| None``."""
    found: list[object] = []
    for member in _members(annotation):
        for meta in getattr(member, "__metadata__", ()):
            # Field(...) inside Annotated keeps its bounds in its own .metadata (Ge/Le objects).
            found.extend(getattr(meta, "metadata", [meta]))
    return found


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
    _index_models(model)
    return model


_MODEL_NAMES: dict[str, type[BaseModel]] = {}
"""Every settings model reachable from a registered root, by class name (union tags in error paths)."""


def _index_models(model: type[BaseModel]) -> None:
    if _MODEL_NAMES.get(model.__name__) is model:
        return
    _MODEL_NAMES[model.__name__] = model
    for field in model.model_fields.values():
        for nested in _nested_models(field.annotation):
            _index_models(nested)


def _nested_models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()):
        found.extend(_nested_models(arg))
    return found
