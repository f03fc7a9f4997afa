"""Reading the YAML files a user writes (training configs, scenario suites): YAML's safe
loader, refusing a key given twice in one mapping (YAML keeps the last) and a document whose
aliases or merge keys expand past `MAX_VALUES` values (a few lines of anchors can stand for
billions) or that nests too deeply for YAML's recursive parser."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from batchpilot.envs.json_objects import check_size, number_problem

MAX_VALUES = 100_000
"""The most values (keys, entries and scalars, aliases counted each time they are used) a
YAML file given to batchpilot may hold: far above any config or suite, far below a bomb."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping."""

    merged = 0
    """The pairs merge keys have copied into this document's mappings so far."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.own_keys: dict[int, list[yaml.Node]] = {}
        """Each mapping node's own key nodes (by id), taken before merging rewrites it."""


INT_TAG, FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
BOOL_TAG = "tag:yaml.org,2002:bool"
CORE_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
"""A boolean as YAML 1.2's core schema reads it; YAML 1.1's ``yes``, ``no``, ``on`` and
``off`` stay text (``source: no`` was False), which a switch refuses by name."""
CORE_INT = re.compile(r"^[-+]?[0-9]+$")
"""A whole number as YAML 1.2's core schema reads it: decimal digits (``017`` is 17)."""
CORE_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
"""A float as YAML 1.2's core schema reads it (``1e-4``, ``1.0e300``, ``.5e3``). PyYAML
follows YAML 1.1, which reads ``1e-4`` as text, ``017`` as octal 15, ``1:20`` as 80 and
``1_000`` as 1000: on this loader those are text, which a number field refuses by name."""
_UniqueKeyLoader.yaml_implicit_resolvers = {  # this loader's own table: PyYAML's stays
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (INT_TAG, FLOAT_TAG, BOOL_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _regexp in ((INT_TAG, CORE_INT), (FLOAT_TAG, CORE_FLOAT)):  # int first: "17"
    _UniqueKeyLoader.add_implicit_resolver(_tag, _regexp, list("-+.0123456789"))
_UniqueKeyLoader.add_implicit_resolver(BOOL_TAG, CORE_BOOL, list("tTfF"))


def _core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """A decimal whole number in base 10 (PyYAML's reads a leading 0 as octal); an explicit
    ``!!int`` in another form as PyYAML reads it."""
    text = loader.construct_scalar(node)
    # an explicit !!int (0x..., 1_000) as PyYAML reads it, then range-checked alike
    try:
        value = int(text, 10) if CORE_INT.match(text) else loader.construct_yaml_int(node)
    except ValueError as exc:  # `!!int 1e6`, where rl-zoo3 writes `!!float 1e6` for a count
        line = node.start_mark.line + 1
        if "integer string conversion" in str(exc):
            raise ValueError(
                f"line {line}: a number has over {sys.get_int_max_str_digits():,} digits"
            ) from None
        raise ValueError(
            f"line {line}: {text[:40]!r} is not a whole number (!!int); write a count as "
            "1000000, or !!float 1e6"
        ) from None
    if problem := number_problem(value):  # past a float's range: a float() of it overflows
        raise ValueError(f"line {node.start_mark.line + 1}: {problem}")
    return value


def _core_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    """A number as PyYAML reads it; an explicit ``!!float`` that is none names its line."""
    try:
        return loader.construct_yaml_float(node)
    except ValueError:
        text = loader.construct_scalar(node)[:40]
        raise ValueError(f"line {node.start_mark.line + 1}: {text!r} is not a number") from None


_UniqueKeyLoader.add_constructor(INT_TAG, _core_int)
_UniqueKeyLoader.add_constructor(FLOAT_TAG, _core_float)


class _MergedTooMuch(Exception):
    """Merge keys copied in more than `MAX_VALUES` pairs (each mapping that merges another
    copies its pairs: a chain of a few thousand lines copies millions)."""


MERGE_TAG = "tag:yaml.org,2002:merge"
"""The tag of a merge key (``<<: *anchor``), which takes in another mapping's pairs."""


def _own_keys(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool) -> list[yaml.Node]:
    """The key nodes `node` gives itself (not merged in), each once (a key given twice is
    refused), and likewise for the mappings it merges: all taken before `flatten_mapping`
    rewrites them (it flattens a merged mapping in place, its merged pairs with its own)."""
    own = loader.own_keys.get(id(node))
    if own is None:
        own = loader.own_keys[id(node)] = [k for k, _ in node.value if k.tag != MERGE_TAG]
        for key_node, value in node.value:
            if key_node.tag == MERGE_TAG:
                merged = value.value if isinstance(value, yaml.SequenceNode) else [value]
                for source in merged:
                    if isinstance(source, yaml.MappingNode):
                        _own_keys(loader, source, deep)
        _refuse_duplicates(loader, own, deep)
    return own


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    """The mapping `node`, its merge keys resolved as `SafeLoader` does; a key `node` gives
    twice is refused, one it gives over a merged one overrides it (YAML's rule)."""
    own = _own_keys(loader, node, deep)
    loader.flatten_mapping(node)  # the merged pairs first, then `node`'s own
    loader.merged += len(node.value) - len(own)
    if loader.merged > MAX_VALUES:
        raise _MergedTooMuch
    return loader.construct_mapping(node, deep)


def _refuse_duplicates(loader: _UniqueKeyLoader, key_nodes: list[yaml.Node], deep: bool) -> None:
    """Raise YAML's `ConstructorError` at the second of two equal keys in `key_nodes`."""
    seen: set[Any] = set()
    for key_node in key_nodes:
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


def _syntax_error(path: Path, text: str, exc: yaml.YAMLError) -> str:
    """The YAML error `exc` in `path` (which holds `text`) as one line: ``PATH:LINE:COL: not
    valid YAML (problem)``."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
        line = text.count("\n", 0, exc.position)
        column = exc.position - text.rfind("\n", 0, exc.position) - 1
        problem = f"character #x{exc.character:04x}: {exc.reason}"
    elif isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        line, column = exc.problem_mark.line, exc.problem_mark.column
        problem = ", ".join(part for part in (exc.context, exc.problem) if part)
    else:
        return f"{path}: not valid YAML ({exc})"
    return f"{path}:{line + 1}:{column + 1}: not valid YAML ({problem})"


def load_yaml(path: Path) -> Any:
    """The parsed YAML file at `path`; `ValueError` naming the file if it is not UTF-8 text,
    not valid YAML, nests too deeply, gives a key twice, holds a value PyYAML cannot convert
    (a date like 2001-13-45, an int of thousands of digits) or expands past `MAX_VALUES`
    values, or is over `MAX_FILE_BYTES`."""
    check_size(path, "the YAML file")
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.load(text, Loader=_UniqueKeyLoader)
        expanded = _more_values_than(data, MAX_VALUES)
    except _MergedTooMuch:
        expanded = True
    except yaml.YAMLError as exc:
        raise ValueError(_syntax_error(path, text, exc)) from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None
    except OSError as exc:  # after the caller's checks: a read that fails (EIO, a vanished file)
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except RecursionError:  # PyYAML composes and constructs nested nodes recursively
        raise ValueError(f"{path}: not a config: its lists or mappings nest too deeply") from None
    except ValueError as exc:  # a scalar PyYAML's int() or date() refuses
        problem = str(exc)
        if "integer string conversion" in problem:
            problem = f"a number has over {sys.get_int_max_str_digits():,} digits"
        raise ValueError(f"{path}: a value YAML cannot convert ({problem}): a bad value?") from None
    if expanded:
        raise ValueError(
            f"{path}: holds more than {MAX_VALUES:,} values once its aliases are expanded "
            "(anchors repeating one another, or a list far longer than any config needs?)"
        )
    return data
