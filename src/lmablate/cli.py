"""Command line: one subcommand per DVC stage, each a thin wrapper over one stage module.

Every path comes from the command line (mirroring ``dvc.yaml``), declared here as read or
written, so that ``tests/test_dvc_deps.py`` can check ``dvc.yaml`` against what each command
really reads, writes and imports. The config is loaded and validated once, before any work.
Expected failures (bad params, bad input files, a model that fails its pre-flight check,
divergence) print one line ``lmablate: error: ...`` and exit 2; an error of the operating
system met during the work (a full disk) prints one line naming the path and exits 1.

Stage modules are imported by name (:data:`STAGES`) only when their command runs, and each
one's ``main(cfg, args)`` takes it from there: a command then imports exactly this module's and
its stage's closure of project modules, which is what ``dvc.yaml`` lists as deps. Commands that
are no stage (:data:`COMMANDS`) are imported by name too, so that no stage depends on them.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
import time
import threading
from dataclasses import dataclass
from pathlib import Path

from lmablate.config.params import defaults_taken, parse, read
from lmablate.config.study import ConfigError
from lmablate.core.fileio import check_sqlite_store, check_writable, os_error_line
from lmablate.core.gc_pause import gc_paused
from lmablate.core.installed import check_installed_lock
from lmablate.core.validation import OutputError, error_line
from lmablate.execution.lifetime import die_with_parent, parent_is_dvc
from lmablate.execution.study_plan import clock_for, spent_flops


@dataclass(frozen=True)
class Stage:
    """A subcommand: the stage module whose ``main(cfg, args)`` it runs, and its path options
    (``--<name>``, read as ``args.<name>`` with underscores) split into the paths it reads and
    those it writes."""

    module: str
    help: str
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    # the written paths that are folders (the others are files)
    folders: tuple[str, ...] = ()
    variant: bool = False
    dataset: bool = True
    # ``--replicate R``: replicate R of the study (``study.replicates``), on its own tuning,
    # sampler and final seeds (StudyConfig.for_replicate); MLflow runs are tagged with R
    replicate: bool = False
    # records MLflow runs: the command starts MLflow in a sidecar process first thing
    # (lmablate.tracking.sidecar.start_sidecar), so that it is ready by the time the stage has
    # imported torch and read its inputs
    tracks: bool = False


STAGES: dict[str, Stage] = {
    "check": Stage("lmablate.stages.check", "params, stores and output folders checked before "
                   "any other stage runs (dvc.yaml: every stage depends on its file)",
                   writes=("out", "components"), folders=("components",), dataset=False),
    "generate": Stage("lmablate.stages.generate",
                      "write a dataset's raw text (corpus.txt, test.txt)", writes=("out",),
                      folders=("out",)),
    "tokenize": Stage("lmablate.stages.tokenize",
                      "character vocabulary and train/val/test token arrays",
                      reads=("raw",), writes=("out",), folders=("out",)),
    "tune": Stage("lmablate.stages.tune", "Optuna search over lr and d_model",
                  reads=("tokens",), writes=("best", "trials"), variant=True, replicate=True,
                  tracks=True),
    "train": Stage("lmablate.stages.train", "train on every seed with the tuned values",
                   reads=("tokens", "best"),
                   writes=("checkpoints", "history", "grad-stats"), folders=("checkpoints",),
                   variant=True,
                   replicate=True, tracks=True),
    "evaluate": Stage("lmablate.stages.evaluate", "test metrics of every seed",
                      reads=("tokens", "raw", "checkpoints"), writes=("metrics", "examples"),
                      variant=True, replicate=True, tracks=True),
    "report": Stage("lmablate.stages.report", "tables, statistics and figures of the study",
                    reads=("runs", "tokens"), writes=("out",), folders=("out",), dataset=False,
                    tracks=True),
}


# Commands that are no DVC stage -> the module whose ``main(cfg, args)`` runs it and returns the
# exit status. ``repro``: the study's independent chains of stages at once, each in a workspace of
# its own, then ``dvc repro`` (lmablate.execution.workspaces).
COMMANDS: dict[str, str] = {"repro": "lmablate.execution.workspaces"}


def _count(text: str) -> int:
    """An integer >= 0 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``lmablate`` parser: ``--params``, one subparser per entry of :data:`STAGES` and one
    per entry of :data:`COMMANDS`."""
    p = argparse.ArgumentParser(prog="lmablate", description=__doc__.splitlines()[0])
    p.add_argument("--params", type=Path, default=Path("params.yaml"),
                   help="study parameters (default: params.yaml)")
    sub = p.add_subparsers(dest="command", required=True)
    for name, stage in STAGES.items():
        s = sub.add_parser(name, help=stage.help)
        if stage.dataset:
            s.add_argument("dataset")
        if stage.variant:
            s.add_argument("variant")
        if stage.replicate:
            s.add_argument("--replicate", type=_count, default=0, metavar="N",
                           help="replicate N of the study, 0 .. study.replicates - 1, on "
                                "its own tuning, sampler and final seeds (default 0)")
        for opt in stage.reads:
            s.add_argument(f"--{opt}", type=Path, required=True, help="read")
        for opt in stage.writes:
            s.add_argument(f"--{opt}", type=Path, required=True, help="written")
    s = sub.add_parser("repro", help="dvc repro with the independent chains of stages (tune -> "
                       "train -> evaluate of a dataset x variant) run at once in workspaces "
                       "that share the DVC cache")
    s.add_argument("--jobs", metavar="N", help="chains at once (default: one per core, at most "
                   "the chains there are)")
    s.add_argument("--dry", action="store_true", help="print the chains; run nothing")
    # parsed by lmablate.config.profiles (main() hands it over first); listed here for --help
    sub.add_parser("compose", add_help=False, help="write params.yaml from conf/ and a profile, "
                   "as dvc exp run -S profile=<name> does (lmablate compose --help)")
    return p


def check_preconditions(cfg, args: argparse.Namespace, stage: Stage) -> None:
    """What a stage needs before any work, cheaply and before MLflow starts: the dataset and
    variant on the command line exist in the config, and every path it writes is of its kind
    (a folder where a folder is written, no folder where a file is) and writable
    (:func:`lmablate.core.fileio.check_writable`), and so are its SQLite stores
    (:func:`lmablate.core.fileio.check_sqlite_store`). The device is checked by each stage before
    its first run (:func:`lmablate.train.device.resolve_device`), as it needs torch.

    Raises:
        RuntimeError: an installed package is not the version ``requirements.lock`` pins
            (:func:`lmablate.core.installed.check_installed_lock`).
        ConfigError: an unknown dataset or variant, a ``--replicate`` that is not one of
            ``study.replicates``.
        OutputError: an output path of the wrong kind or that cannot be written.
    """
    # the versions that compute are those the results will record (requirements.lock's)
    check_installed_lock()
    if stage.dataset:
        cfg.dataset(args.dataset)
    if stage.variant:
        cfg.check_variant(args.variant)
    if stage.replicate:
        cfg.for_replicate(args.replicate)  # one of the study's replicates, its seeds in range
    for opt in stage.writes:
        path = getattr(args, opt.replace("-", "_"))
        if opt in stage.folders and path.exists() and not path.is_dir():
            raise OutputError(f"cannot write --{opt} {path}: it is a file; --{opt} names the "
                              "folder the stage writes")
        if opt not in stage.folders and path.is_dir():
            raise OutputError(f"cannot write --{opt} {path}: it is a folder; --{opt} names the "
                              "file the stage writes")
        check_writable(path)
    if args.command == "tune":
        check_sqlite_store(cfg.tune.storage_url, "tune.storage (LMABLATE_OPTUNA_STORAGE)")
    if stage.tracks and cfg.tracking.enabled:
        check_sqlite_store(cfg.tracking.tracking_uri, "tracking.uri (MLFLOW_TRACKING_URI)")


def import_stage(name: str):
    """Import stage module ``name`` with the cyclic garbage collector paused
    (:func:`lmablate.core.gc_pause.gc_paused`): importing torch (and Optuna) allocates some
    10^6 objects that all live to the end. Returns the module."""
    with gc_paused():
        return importlib.import_module(name)


def exit_now(status: int) -> None:
    """End the process with ``status`` without the interpreter's teardown.

    Tearing down the modules and objects of torch and MLflow takes 0.7-1.5 s on a 2-core
    machine (every stage process pays it, once per stage of a study: ``dvc stage list``) and
    does nothing a stage needs: its files are written and closed, MLflow's runs are ended and
    committed. What does matter still runs: the ``atexit`` handlers (MLflow, logging,
    multiprocessing, weakref finalizers) and the flush of stdout and stderr. If a non-daemon
    thread is still running, the normal exit (which waits for it) is kept."""
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive()
           for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 1
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lmablate`` console script; returns the exit status.

    Run as a command (``argv`` None: the console script, ``python -m lmablate.cli``), the
    process ends here through :func:`exit_now`; called with ``argv`` (tests), it returns."""
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["compose"]:  # writes params.yaml, so it must not need a valid one first
        status = importlib.import_module("lmablate.config.profiles").main(given[1:])
        if argv is None:
            exit_now(status)
        return status
    args = build_parser().parse_args(argv)
    status = 0
    if argv is None and parent_is_dvc():
        # a stage of dvc repro ends with it: killed, dvc records nothing this one would write
        die_with_parent(os.getppid())
    try:
        raw = read(args.params)
        cfg = parse(raw)
        # a short profile is allowed, but what it leaves out is said, not taken silently
        for key, value in defaults_taken(raw):
            print(f"lmablate: {args.params} gives no {key}; taking the default {value}",
                  file=sys.stderr)
        if args.command in COMMANDS:  # no stage: its module's main gives the exit status
            status = import_stage(COMMANDS[args.command]).main(cfg, args)
            if argv is None:
                exit_now(status)
            return status
        stage = STAGES[args.command]
        check_preconditions(cfg, args, stage)
        if stage.tracks and cfg.tracking.enabled and argv is None:
            from lmablate.tracking.sidecar import start_sidecar
            start_sidecar(cfg.tracking)
        clock = clock_for(cfg, args.command, getattr(args, "dataset", None),
                          getattr(args, "variant", None), getattr(args, "replicate", 0))
        if clock is not None and clock.line:  # where dvc repro is, and about how long is left
            print(clock.line, flush=True)
        start = time.perf_counter()
        summary = import_stage(stage.module).main(cfg, args)
        if clock is not None:
            clock.done(spent_flops(args.trials) if args.command == "tune" else None)
        # one line per stage, what it did and how long it took: bars are erased when done
        what = " ".join(str(getattr(args, k)) for k in ("dataset", "variant")
                        if getattr(args, k, None))
        if getattr(args, "replicate", 0):
            what += f" (replicate {args.replicate})"
        print(f"lmablate {args.command}{' ' + what if what else ''}: done in "
              f"{time.perf_counter() - start:.1f} s" + (f"; {summary}" if summary else ""),
              flush=True)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(error_line(exc), file=sys.stderr)
        status = 2
    except OSError as exc:  # a full disk, a read-only folder found mid-run: one line, no traceback
        print(f"lmablate: error: {os_error_line(exc)}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:  # Ctrl-C: the jobs stopped at a step, their resume states kept
        print("lmablate: interrupted; run the same command (or dvc repro) again to resume",
              file=sys.stderr)
        status = 130
    if argv is None:
        exit_now(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
