"""Records as JSON: the one conversion the CLI's ``--json`` output and the dashboard's API share."""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any
from uuid import UUID


def to_jsonable(value: Any) -> Any:
    """``value`` with dataclasses, enums, datetimes, UUIDs and intervals turned into JSON types."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: to_jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID | timedelta):
        return str(value)
    return value


# How much of a payload, result, checkpoint or progress a display shows: a job may carry megabytes of JSON,
# which a terminal would scroll through for minutes and a page would load for seconds. The CLI's --json and
# the dashboard's API keep the values whole; displays cut them and say so.
CLI_DISPLAY_CHARS = 2_000
WEB_DISPLAY_CHARS = 20_000


def cut_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with a marker that says it was and how large it is."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … (truncated, {len(text.encode()):,} bytes in all)"


def shown_json(value: Any, limit: int, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """``value`` as JSON text for a display, cut to ``limit`` characters (:func:`cut_text`)."""
    text = json.dumps(to_jsonable(value), indent=indent, sort_keys=sort_keys, ensure_ascii=False, default=str)
    return cut_text(text, limit)
