"""Reading the YAML files a user writes (training configs, scenario suites): YAML's safe
loader, refusing a key given twice in one mapping (YAML keeps the last) and a document whose
aliases expand past `MAX_VALUES` values (a few lines of anchors can stand for billions) or
that nests too deeply for YAML's recursive parser."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

MAX_VALUES = 100_000
"""The most values (keys, entries and scalars, aliases counted each time they are used) a
YAML file given to batchpilot may hold: far above any config or suite, far below a bomb."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable: construct_mapping names it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _more_values_than(data: Any, limit: int) -> bool:
    """Whether `data` holds more than `limit` values, shared ones counted at each use."""
    stack, count = [data], 0
    while stack:
        value = stack.pop()
        count += 1
        if count > limit:
            return True
        if isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def load_yaml(path: Path) -> Any:
    """The parsed YAML file at `path`; `ValueError` naming the file if it is not UTF-8 text,
    not valid YAML, nests too deeply, gives a key twice, holds a value PyYAML cannot convert
    (a date like 2001-13-45, an int of thousands of digits) or expands past `MAX_VALUES`
    values."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None
    except RecursionError:  # PyYAML composes and constructs nested nodes recursively
        raise ValueError(f"{path}: not a config: its lists or mappings nest too deeply") from None
    except ValueError as exc:  # a scalar PyYAML's int() or date() refuses
        problem = str(exc)
        if "integer string conversion" in problem:
            problem = f"a number has over {sys.get_int_max_str_digits():,} digits"
        raise ValueError(f"{path}: a value YAML cannot convert ({problem}): a bad value?") from None
    if _more_values_than(data, MAX_VALUES):
        raise ValueError(
            f"{path}: holds more than {MAX_VALUES:,} values once its aliases are expanded "
            "(anchors repeating one another?)"
        )
    return data
