"""Reading a user's YAML job file safely: PyYAML's safe loader, plus what it lets through.

- a key given twice is an error (PyYAML keeps the last one, silently);
- aliases may not expand into more than MAX_NODES values (an alias bomb is a few hundred
  bytes that expand to gigabytes when the job is written out);
- nesting deeper than MAX_DEPTH is refused before it is built (PyYAML composes recursively,
  and deep input otherwise ends in a RecursionError).
"""

from __future__ import annotations

from typing import Any

from trainctl.errors import SpecError
from trainctl.spec.limits import MAX_DEPTH

MAX_NODES = 100_000


def load_yaml(text: str, field: str, name: str) -> Any:
    """The document in `text` (None if empty); SpecError naming `field` and the file `name`."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        if key in seen:
                            line = key_node.start_mark.line + 1
                            raise SpecError(
                                field,
                                f"{name} line {line}: key {key!r} is given twice "
                                f"(first on line {seen[key]})",
                            )
                        seen[key] = key_node.start_mark.line + 1
                    except TypeError:  # an unhashable key: the constructor names it
                        pass
            return super().construct_mapping(node, deep=deep)

    loader = Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise SpecError(field, f"{name} is nested too deeply") from None
        if node is None:
            return None
        _check_shape(node, field, name)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise SpecError(field, f"{name} is not valid YAML: {str(exc).splitlines()[0]}") from None
    finally:
        loader.dispose()


def _check_shape(root: Any, field: str, name: str) -> None:
    """Depth and expanded size of the node graph, without recursion: aliases share nodes,
    so each node's expanded size is computed once (post-order) and reused."""
    import yaml

    expanded: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(root, 0, False)]
    while stack:
        node, depth, children_done = stack.pop()
        key = id(node)
        if children_done:
            in_progress.discard(key)
            expanded[key] = 1 + sum(expanded[id(c)] for c in _children(node, yaml))
            if expanded[key] > MAX_NODES:
                raise SpecError(
                    field,
                    f"{name} expands to more than {MAX_NODES:,} values (aliases repeating "
                    "aliases); write the values out",
                )
            continue
        if key in expanded:
            continue
        if key in in_progress:
            line = node.start_mark.line + 1
            raise SpecError(field, f"{name} line {line}: an alias refers to itself")
        if depth > MAX_DEPTH:
            line = node.start_mark.line + 1
            raise SpecError(field, f"{name} line {line}: nested more than {MAX_DEPTH} levels deep")
        in_progress.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in _children(node, yaml))


def _children(node: Any, yaml: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []
