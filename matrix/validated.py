"""Structures from users parsed in one place, with bounds: JSON and TOML text, results files
(shards, baselines), a resumed run's run.json.

Whatever the file holds, the answer is a value within bounds or one InputError naming the file
and the field: nesting is bounded (a 10^5-deep array would otherwise be a RecursionError
wherever it is walked), files are regular and bounded in size, and a pydantic validation
error is reduced to its first field and message.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from . import userfiles
from .errors import InputError

MAX_NESTING = 64  # results.json is about 8 deep; nothing the tool reads needs more
MAX_JSON_FILE_BYTES = 1 << 30  # a merged nightly of many hosts is megabytes


def nesting(value) -> int:
    """Depth of nested lists/dicts, walked without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            if depth > MAX_NESTING:
                return depth
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_nesting(value, where: str):
    if nesting(value) > MAX_NESTING:
        raise InputError(f"{where}: nested deeper than {MAX_NESTING} levels: refused")
    return value


def json_value(text: str | bytes, where: str):
    """Parsed JSON within the nesting bound; NaN and Infinity are read as numbers (results store
    an infinite drift that way) and judged by the schema that reads them."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise InputError(f"{where}: nested deeper than {MAX_NESTING} levels: refused") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise InputError(f"{where}: not JSON ({userfiles.one_line(error, 200)})") from None
    return check_nesting(value, where)


def json_file(path: Path, what: str):
    """A JSON file the user points at (a results.json, a run.json): regular, bounded, parsed."""
    with userfiles.open_regular(path, what, MAX_JSON_FILE_BYTES) as stream:
        text = stream.read()
    return json_value(text, str(path))


def model(schema, data, where: str):
    """`data` validated by the pydantic `schema`, or one line naming the first bad field."""
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        raise InputError(f"{where}: {first_problem(error)}") from None
    except RecursionError:
        raise InputError(f"{where}: nested deeper than {MAX_NESTING} levels: refused") from None


def first_problem(error: ValidationError) -> str:
    problems = error.errors(include_url=False)
    if not problems:
        return "not valid"
    first = problems[0]
    field = ".".join(str(part) for part in first.get("loc", ())) or "(top level)"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"field {userfiles.one_line(field, 120)}: {userfiles.one_line(first.get('msg', 'invalid'), 200)}{more}"
