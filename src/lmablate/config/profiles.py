"""Profiles: the study's defaults (``conf/config.yaml``) and the named sets of changes to them
(``conf/profile/<name>.yaml``), composed into ``params.yaml`` by Hydra exactly as DVC does for
``dvc exp run -S profile=<name>`` (``hydra.enabled`` in ``.dvc/config``).

:func:`compose` calls DVC's own composition, so the text it returns is byte for byte what
``dvc exp run`` writes; ``lmablate compose`` writes it after validating it, so a bad profile or
override is one line here rather than a failed experiment in the queue.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import yaml

from lmablate.config.conf_files import (check_defaults_file, check_nothing_deleted,
                                        check_overrides, check_profile_file)
from lmablate.config.study import ConfigError
from lmablate.core.validation import error_line, short_repr
from lmablate.core.fileio import atomic_path

CONFIG_DIR = "conf"  # Hydra's config folder (DVC's hydra.config_dir default)
CONFIG_NAME = "config"  # its primary config, the defaults (DVC's hydra.config_name default)
GROUP = "profile"  # the config group of the profiles: conf/profile/<name>.yaml


def profile_names(root: str | Path = ".") -> list[str]:
    """The profiles of the project at ``root``: the names of ``conf/profile/*.yaml``, sorted."""
    return sorted(p.stem for p in (Path(root) / CONFIG_DIR / GROUP).glob("*.yaml"))


def compose(root: str | Path = ".", profile: str | None = None,
            overrides: Sequence[str] = ()) -> str:
    """The ``params.yaml`` text DVC's ``dvc exp run -S profile=<profile> -S <override>...``
    writes for the project at ``root`` (``profile`` None: the defaults alone).

    ``overrides`` are Hydra overrides (``train.lr=0.001``, ``study.seeds=[0,1]``).

    Raises:
        ConfigError: an unknown profile (naming the profiles there are) or an override Hydra
            cannot parse or apply (its own message, on one line).
    """
    from dvc.utils.hydra import compose_and_dump  # DVC's code path: the same bytes as exp run
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    root = Path(root).resolve()
    if not (root / CONFIG_DIR / f"{CONFIG_NAME}.yaml").is_file():
        raise ConfigError(f"compose: no {CONFIG_DIR}/{CONFIG_NAME}.yaml in {root}: run it in the "
                          "project's folder")
    names = profile_names(root)
    if profile is not None and profile not in names:
        raise ConfigError(f"profile: unknown profile {short_repr(profile)}; choose one of "
                          f"{', '.join(names)} (files of {CONFIG_DIR}/{GROUP}/)")
    defaults = check_defaults_file(root, CONFIG_DIR, CONFIG_NAME)
    if profile is not None:
        check_profile_file(root, CONFIG_DIR, GROUP, profile)
    check_overrides(overrides)
    every = ([f"{GROUP}={profile}"] if profile else []) + list(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "params.yaml"
        try:
            compose_and_dump(out, str(root / CONFIG_DIR), None, CONFIG_NAME, str(root), every)
        except (HydraException, OmegaConfBaseException) as exc:
            first = " ".join(str(exc).split("\n\n")[0].split())
            raise ConfigError(f"override: {first}") from None
        except Exception as exc:  # anything else Hydra or DVC raise: one line, not a traceback
            first = " ".join(str(exc).split("\n\n")[0].split()) or type(exc).__name__
            raise ConfigError(f"compose: {first}") from None
        text = out.read_text(encoding="utf-8")
    check_nothing_deleted(defaults, yaml.safe_load(text))
    return text


def build_parser() -> argparse.ArgumentParser:
    """``lmablate compose``'s own arguments (it runs before any params.yaml is read)."""
    p = argparse.ArgumentParser(prog="lmablate compose", description="Write params.yaml from "
                                "conf/ (a profile and overrides) as dvc exp run -S does, after "
                                "validating it")
    p.add_argument("--profile", help="a profile of conf/profile/ (default: the defaults alone)")
    p.add_argument("-S", "--set-param", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="a Hydra override, as dvc exp run -S (repeatable)")
    p.add_argument("--out", type=Path, default=Path("params.yaml"),
                   help="written (default: params.yaml; - prints it)")
    return p


def main(argv: Sequence[str]) -> int:
    """``lmablate compose [--profile NAME] [-S KEY=VALUE]... [--out FILE]``: the composition
    validated (:func:`lmablate.config.params.parse`) before it is written. Returns the exit
    status."""
    from lmablate.config.params import parse

    args = build_parser().parse_args(list(argv))
    try:
        if str(args.out) != "-" and args.out.is_dir():
            raise ConfigError(f"compose: --out {args.out} is a folder; name the file to write "
                              "(default params.yaml)")
        text = compose(".", args.profile, args.overrides)
        parse(yaml.safe_load(text))
    except ConfigError as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    if str(args.out) == "-":
        sys.stdout.write(text)
    else:
        with atomic_path(args.out) as tmp:
            Path(tmp).write_text(text, encoding="utf-8")
        print(f"lmablate compose: wrote {args.out} ({args.profile or 'the defaults'}"
              f"{''.join(' ' + o for o in args.overrides)})")
    return 0
