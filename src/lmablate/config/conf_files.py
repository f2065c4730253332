"""The files Hydra composes ``params.yaml`` from, checked before Hydra reads them: the defaults
(``conf/config.yaml``) and a profile (``conf/profile/<name>.yaml``). Each fault is one line
naming the file and what is wrong, where Hydra would print a traceback or name another thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from lmablate.core.validation import ConfigError, short_repr

PACKAGE_LINE = "# @package _global_"  # a profile's keys are params.yaml's top-level sections
DEFAULTS_LIST = ["_self_", {"profile": None}]  # conf/config.yaml's defaults: itself, no profile


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (PyYAML keeps the
    last silently, as Hydra's OmegaConf refuses it with a traceback)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (lines {seen[key]} and "
                    f"{key_node.start_mark.line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_conf(path: Path, shown: str) -> tuple[str, Any]:
    """The text and the YAML document of the conf file ``path`` (``shown``: its name in
    messages, relative to the project).

    Raises:
        ConfigError: not UTF-8, not YAML, a key given twice, or a tag other than YAML's own
            (``!!python/...``), naming ``shown`` and the line.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{shown} is not UTF-8 text (byte offset {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{shown} cannot be read ({exc.strerror or exc})") from None
    try:
        return text, yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"{shown} is not valid YAML: {problem}{where}") from None


def check_defaults_file(root: Path, config_dir: str, name: str) -> Mapping[str, Any]:
    """``<config_dir>/<name>.yaml`` of the project at ``root`` read and checked: a mapping of
    sections whose ``defaults`` list is :data:`DEFAULTS_LIST`. Returns the document.

    Raises:
        ConfigError: unreadable (:func:`read_conf`), empty, not a mapping, or another
            defaults list (a file that includes itself or another).
    """
    shown = f"{config_dir}/{name}.yaml"
    _, doc = read_conf(root / config_dir / f"{name}.yaml", shown)
    if doc is None:
        raise ConfigError(f"{shown} is empty; it holds the study's defaults, every key of "
                          "params.yaml (git checkout it to restore it)")
    if not isinstance(doc, dict):
        raise ConfigError(f"{shown} holds a {type(doc).__name__}; expected a mapping of "
                          "params.yaml's sections")
    if doc.get("defaults") != DEFAULTS_LIST:
        raise ConfigError(f"{shown}: defaults is {short_repr(doc.get('defaults'))}; it must "
                          "be [_self_, {profile: null}] (the defaults, then the profile "
                          "chosen with -S profile=<name>)")
    return doc


def check_profile_file(root: Path, config_dir: str, group: str, profile: str) -> None:
    """``<config_dir>/<group>/<profile>.yaml`` read and checked: its first line
    :data:`PACKAGE_LINE`, then a non-empty mapping without a ``defaults`` list.

    Raises:
        ConfigError: unreadable (:func:`read_conf`), without the package line, empty, not a
            mapping, or including other files.
    """
    shown = f"{config_dir}/{group}/{profile}.yaml"
    text, doc = read_conf(root / config_dir / group / f"{profile}.yaml", shown)
    if not text.strip():
        raise ConfigError(f"{shown} is empty; a profile starts with {PACKAGE_LINE!r} and holds "
                          f"the keys it changes, at least study: {{profile: {profile}}}")
    first = text.splitlines()[0].strip()
    if first != PACKAGE_LINE:
        raise ConfigError(f"{shown}: its first line is {short_repr(first)}; a profile starts "
                          f"with {PACKAGE_LINE!r}, so that its keys are params.yaml's sections")
    if doc is None:
        raise ConfigError(f"{shown} changes nothing (only comments); a profile holds the keys "
                          f"it changes, at least study: {{profile: {profile}}}")
    if not isinstance(doc, dict):
        raise ConfigError(f"{shown} holds a {type(doc).__name__}; expected a mapping of the "
                          "sections it changes")
    if "defaults" in doc:
        raise ConfigError(f"{shown}: a profile cannot include files (defaults: "
                          f"{short_repr(doc['defaults'])}); write the keys it changes")


def check_overrides(overrides: Sequence[str]) -> None:
    """Refuse an override that deletes a key (``~key``, Hydra's deletion) or sets no key
    (``=3``): every key of the defaults stays in ``params.yaml``, which DVC's stages read.

    Raises:
        ConfigError: naming the override.
    """
    for override in overrides:
        key = override.split("=", 1)[0].strip()
        if key.startswith("~"):
            raise ConfigError(f"override: {short_repr(override)} deletes {key[1:]}; every key "
                              "of conf/config.yaml stays in params.yaml: set a value instead")
        if not key.lstrip("+"):
            raise ConfigError(f"override: {short_repr(override)} names no key; write "
                              "KEY=VALUE, e.g. train.lr=0.001")


def check_nothing_deleted(defaults: Mapping[str, Any], composed: Any, where: str = "") -> None:
    """Every key of ``defaults`` (``conf/config.yaml``) is still in ``composed`` at every
    depth of mappings (lists and values may change).

    Raises:
        ConfigError: naming the first key that is gone.
    """
    for key, value in defaults.items():
        if key == "defaults" and not where:
            continue
        name = f"{where}{key}"
        if not isinstance(composed, dict) or key not in composed:
            raise ConfigError(f"compose: {name} is gone from params.yaml; every key of "
                              "conf/config.yaml stays (a profile or override sets values, it "
                              "does not delete keys)")
        if isinstance(value, dict):
            check_nothing_deleted(value, composed[key], f"{name}.")
