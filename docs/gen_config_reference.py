"""The configuration reference page, generated from the pydantic models and the component registries (the
same source `fedhet list` and config validation use, so the page cannot drift from the code).

A MkDocs hook (``hooks:`` in mkdocs.yml) adds the page as ``reference/config.md`` at build time; run as a
script, it prints the page: ``python docs/gen_config_reference.py > config.md``.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

PAGE = "reference/config.md"

INTRO = """# Configuration reference

Every key a run config accepts: in a YAML file (`fedhet run CONFIG.yaml`), with `--set key=value` on the
command line, or in a dict / `fedhet.Config` from Python. All keys are optional; the defaults are below.
A *component* key (`algorithm`, `dataset`, `partition`, `model`, `availability`, `attack`, and the entries of
`metrics`) is a name, or a mapping of the name and its parameters: `partition: {name: dirichlet, alpha: 0.1}`;
the sections after the run keys list every component and its parameters.

This page is generated from the code (`docs/gen_config_reference.py`), as `fedhet list` is.
"""


def type_name(annotation: Any) -> str:
    """A readable type: ``int``, ``list[float]``, ``"a" | "b"``, ``str | None``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{name}[{inner}]" if inner else name
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _bounds(metadata: list[Any]) -> list[str]:
    out = []
    for item in metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(item, attr, None)
            if isinstance(item, annotated_types.BaseMetadata) and value is not None:
                out.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value:,}")
        if isinstance(item, annotated_types.MinLen) and item.min_length:
            out.append(f"length ≥ {item.min_length}")
        if isinstance(item, annotated_types.MaxLen):
            out.append(f"length ≤ {item.max_length}")
    return out


def value_range(field: FieldInfo) -> str:
    """The field's bounds (``≥ 1``, ``> 0, < 1``), also those of Annotated list items."""
    bounds = _bounds(list(field.metadata))
    for arg in typing.get_args(field.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            inner = [m for a in typing.get_args(arg)[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
            bounds += [f"items {b}" for b in _bounds(inner)]
    return ", ".join(bounds)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "**required**"
    if isinstance(value, BaseModel):
        return "see the next rows"
    return f"`{json.dumps(to_jsonable_python(value), ensure_ascii=False)}`"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def field_rows(model: type[BaseModel], prefix: str = "", links: dict[str, str] | None = None) -> list[str]:
    """One table row per key of `model`; a nested model's ``prefix.key`` rows follow its own row."""
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = field.annotation
        description = field.description or ""
        kind = f"`{cell(type_name(annotation))}`"
        if links and name in links:
            kind = "component"
            description = f"{description} {links[name]}".strip()
        rows.append(f"| `{key}` | {kind} | {cell(default_text(field))} | {value_range(field)} | {cell(description)} |")
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows += field_rows(annotation, prefix=f"{key}.")
    return rows


HEADER = ["| key | type | default | range | description |", "|---|---|---|---|---|"]


def groups() -> list[tuple[str, str, Any]]:
    """(title, config key, registry) for every kind of component, as `fedhet list` shows them."""
    from fedhet.catalog import (
        ATTACKS,
        AVAILABILITY,
        DATASETS,
        METRIC_PLUGINS,
        MODELS,
        PARTITIONERS,
        SHIFTS,
        STRATEGIES,
    )

    return [
        ("Algorithms", "algorithm", STRATEGIES),
        ("Datasets", "dataset", DATASETS),
        ("Partitioners", "partition", PARTITIONERS),
        ("Shifts", "shift", SHIFTS),
        ("Models", "model", MODELS),
        ("Availability", "availability", AVAILABILITY),
        ("Attacks", "attack", ATTACKS),
        ("Metric plugins", "metrics", METRIC_PLUGINS),
    ]


def anchor(key: str, name: str) -> str:
    return f"{key}-{name}".replace("_", "-")


def component_section(key: str, cls: Any) -> list[str]:
    lines = [f"### `{cls.name}` {{#{anchor(key, cls.name)}}}", ""]
    doc = inspect.getdoc(cls) or cls.description
    lines += [cls.description, "", doc, ""] if doc != cls.description else [doc, ""]
    if cls.model_fields:
        lines += [*HEADER, *field_rows(cls), ""]
    else:
        lines += ["No parameters.", ""]
    return lines


def render() -> str:
    from fedhet.experiments.config import RunConfig
    from fedhet.metrics import METRICS

    links = {key: f"(see [{title}](#{title.lower().replace(' ', '-')}))" for title, key, _ in groups()}
    lines = [INTRO, "## Run keys", "", *HEADER, *field_rows(RunConfig, links=links), ""]
    for title, key, registry in groups():
        where = f"entries of `{key}`" if key == "metrics" else f"`{key}:`"
        lines += [f"## {title}", "", f"The {where} names (`fedhet list`):", ""]
        lines += [f"- [`{c.name}`](#{anchor(key, c.name)}): {c.description}" for c in registry]
        lines.append("")
        for cls in registry:
            lines += component_section(key, cls)
    lines += ["## Metrics", "", "The columns of `metrics.csv` (`fedhet list metrics`):", ""]
    lines += [f"- `{name}`: {cell(text)}" for name, text in METRICS.items()]
    return "\n".join(lines) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated page to the site."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    print(render(), end="")
