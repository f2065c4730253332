"""``lmablate repro`` (:func:`main`): the study's independent chains of stages (tune -> train ->
evaluate of a dataset x variant; the baseline's retune -> retrain -> reevaluate) at once, each in
a workspace of its own under ``.dvc/tmp/lmablate-workspaces`` that shares the main workspace's
DVC cache, as ``dvc exp run --queue -j N`` runs experiments; then ``dvc repro`` in the main
workspace, which restores their outputs from DVC's run-cache. That holds no stage with a
``persist`` output (train), whose dvc.lock entries :func:`carry_locks` copies instead. Only
``lmablate repro`` imports this module, by name (:data:`lmablate.cli.COMMANDS`): no stage
depends on it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple

from lmablate.core.fileio import absolute_sqlite_url
from lmablate.core.validation import ConfigError
from lmablate.tracking.environment import COMMIT_ENV, git_commit

WORKSPACES = Path(".dvc") / "tmp" / "lmablate-workspaces"  # under the main workspace's root
LOCK = Path(".dvc") / "tmp" / "lmablate-repro.lock"  # held by the one repro of a workspace
STOP_GRACE_SECONDS = 10.0  # a stopped chain's time to save its resume state before SIGKILL


@contextlib.contextmanager
def only_repro(root: Path):
    """Hold ``root``'s repro lock (``fcntl.flock`` on :data:`LOCK`, the holder's pid inside)
    while the body runs: two ``lmablate repro`` in one folder would share their workspaces and
    chain logs.

    Raises:
        ConfigError: another process holds it (named by its pid).
    """
    import fcntl

    path = root / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise ConfigError(f"repro: another lmablate repro (pid {holder}) is running in "
                              f"{root}; wait for it to end or stop it") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            lock.seek(0)
            lock.truncate()
            fcntl.flock(lock, fcntl.LOCK_UN)


def parse_jobs(text: str | None) -> int | None:
    """``--jobs``: how many chains run at once, an integer >= 1; None when not given.

    Raises:
        ConfigError: anything else (the message names the value and what is allowed)."""
    if text is not None and (not re.fullmatch(r"\s*\d+\s*", text) or int(text) < 1):
        raise ConfigError(f"repro: --jobs={text!r} is not allowed; expected an integer >= 1 "
                          "(chains reproduced at once)")
    return None if text is None else int(text)


def store_env(storage_url: str, tracking_uri: str, root: Path) -> dict[str, str]:
    """``LMABLATE_OPTUNA_STORAGE`` and ``MLFLOW_TRACKING_URI`` (which override the params:
    :attr:`lmablate.config.study.TuneConfig.storage_url`,
    :attr:`lmablate.config.study.TrackingConfig.tracking_uri`) for the chains, where a URL is a
    relative SQLite path: the main workspace's file (absolute against ``root``). Other stores are
    the same from every workspace."""
    urls = {"LMABLATE_OPTUNA_STORAGE": storage_url, "MLFLOW_TRACKING_URI": tracking_uri}
    fixed = {name: absolute_sqlite_url(url, root) for name, url in urls.items()}
    return {name: url for name, url in fixed.items() if url}


class Plan(NamedTuple):
    """Where each stage runs: ``upstream`` (shared by chains) in the main workspace first; each
    of ``chains`` (last stage -> its stages, in order) in a workspace of its own; ``final``
    (what nothing depends on: the report) in the main workspace's last ``dvc repro``."""

    upstream: tuple[str, ...]
    chains: dict[str, tuple[str, ...]]
    final: tuple[str, ...]


def plan(deps: Mapping[str, Iterable[str]]) -> Plan:
    """Split a pipeline, ``deps`` (each stage -> the stages it depends on, as from
    :func:`stage_graph`), into independent chains. A chain ends at a stage that only final
    stages depend on, and holds it and what it depends on, transitively, less what another
    chain depends on too (upstream). Stages keep the order of ``deps``, after their deps."""
    deps = {stage: set(d) for stage, d in deps.items()}
    order: list[str] = []
    while len(order) < len(deps):  # a stable topological order
        order.append(next(s for s in deps if s not in order and deps[s] <= set(order)))
    dependents = {s: {t for t in deps if s in deps[t]} for s in deps}
    final = {s for s in deps if not dependents[s]}
    reach: dict[str, set[str]] = {}
    for end in (s for s in order if s not in final and dependents[s] <= final):
        todo, reach[end] = [end], set()
        while todo:
            s = todo.pop()
            if s not in reach[end]:
                reach[end].add(s)
                todo += deps[s]
    shared = {s for s in deps if sum(s in r for r in reach.values()) > 1}
    return Plan(tuple(s for s in order if s in shared),
                {e: tuple(s for s in order if s in r - shared) for e, r in reach.items()},
                tuple(s for s in order if s in final))


def _address(stage, root: Path) -> str:
    """``stage`` as ``dvc repro`` in ``root`` names it: ``name``, ``path:name``, or ``path``."""
    path, name = os.path.relpath(stage.path, root), getattr(stage, "name", None)
    return path if not name else name if path == "dvc.yaml" else f"{path}:{name}"


def stage_graph(root: Path) -> dict[str, tuple[str, ...]]:
    """Each stage of the DVC repository at ``root`` -> the stages it depends on, from DVC's
    graph of the pipeline (``Repo.index.graph``, whose edges run from a stage to those whose
    outputs it reads), in dvc.yaml's order. Raises ConfigError where DVC cannot read it."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            graph = repo.index.graph
            return {_address(s, root): tuple(_address(d, root) for d in graph.successors(s))
                    for s in graph.nodes}
    except DvcException as exc:
        raise ConfigError(f"repro: DVC cannot read the pipeline: {exc}") from None


def workspace_files(root: Path) -> list[str]:
    """The files (paths relative to ``root``) a workspace copies: those git tracks and those it
    would track (untracked, not ignored), as ``dvc exp run --queue`` takes them, so that
    uncommitted edits count.

    Raises:
        ConfigError: ``root`` is not in a git repository, or git is missing."""
    cmd = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        names = subprocess.run(cmd, cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise ConfigError(f"repro: {root} is not in a git repository (git ls-files failed); "
                          "a workspace copies the files git tracks or would track") from None
    return [n for n in dict.fromkeys(names.decode().split("\0"))
            if n and (os.path.isfile(root / n) or os.path.islink(root / n))]


def make_workspace(root: Path, dest: Path, files: Iterable[str], cache_dir: str) -> None:
    """Copy ``files`` of ``root`` and its ``.dvc/config.local`` into folder ``dest``, point its
    DVC cache at ``cache_dir`` and make it a DVC repository without git (``core.no_scm``:
    nothing staged, no .gitignore written). A ``dest`` left by an interrupted run is updated,
    not emptied, so that a stage resumes from its persisted outputs."""
    from dvc.config import Config

    for name in [*files, ".dvc/config.local"]:
        if os.path.lexists(root / name):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(dest / name):
                os.unlink(dest / name)
            shutil.copy2(root / name, dest / name, follow_symlinks=False)
    with Config(dvc_dir=str(dest / ".dvc")).edit("local") as conf:
        conf.setdefault("cache", {})["dir"] = cache_dir
        conf.setdefault("core", {})["no_scm"] = True


def carry_locks(root: Path, workspace: Path, stages: set[str]) -> list[str]:
    """Copy the dvc.lock entries of those of ``stages`` that DVC's run-cache cannot hold (its
    own rule, ``_can_hash``: a ``persist`` output, ``always_changed``, ...) from a chain's
    ``workspace`` into the main workspace's (DVC's ``Lockfile``, under the repository's lock),
    so that ``dvc checkout`` there takes their outputs from the cache. Returns their names."""
    from dvc.dvcfile import Lockfile
    from dvc.repo import Repo
    from dvc.stage.cache import _can_hash

    with Repo(str(workspace)) as chain:
        found = [s for s in chain.index.stages
                 if _address(s, workspace) in stages and not _can_hash(s)]
        if found:
            with Repo(str(root)) as repo, repo.lock:
                for stage in found:
                    lock = (root / os.path.relpath(stage.path, workspace)).with_suffix(".lock")
                    Lockfile(repo, str(lock)).dump(stage)
        return [_address(s, workspace) for s in found]


def stop(procs: Iterable[subprocess.Popen]) -> None:
    """Stop processes that each lead a process group: SIGINT to every group (a stage saves its
    resume state and exits, then DVC), SIGKILL to what is left of them after
    :data:`STOP_GRACE_SECONDS`."""
    procs, deadline = list(procs), time.monotonic() + STOP_GRACE_SECONDS
    for sig in (signal.SIGINT, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()) if sig == signal.SIGINT else None)


def run_chains(chains: Mapping[str, tuple[Path, list[list[str]], Path | None]], jobs: int,
               env: Mapping[str, str], say: Callable[[str], None]) -> str | None:
    """Run chains, name -> (folder, commands run one after the other while they succeed, log
    file or None: output passed through), ``jobs`` at a time, each in a process group of its
    own; ``say`` gets a line as a chain starts and as it ends, with its time (s). Returns the
    first chain that failed, once the others are stopped (:func:`stop`), or None. Ctrl-C stops
    every chain and is raised again."""
    todo, running = list(chains), {}
    try:
        while todo or running:
            while todo and len(running) < jobs:
                name = todo.pop(0)
                cwd, cmds, log = chains[name]
                cmd = " && ".join(shlex.join(c) for c in cmds)
                with open(log or os.devnull, "a") as file:
                    print(f"$ {cmd}", file=file, flush=True)
                    running[name] = time.perf_counter(), subprocess.Popen(
                        cmd, shell=True, cwd=cwd, env=dict(env), stdout=log and file,
                        stderr=log and subprocess.STDOUT, start_new_session=True)
                say(f"{name} started" + (f" (log {log})" if log else ""))
            time.sleep(0.1)
            for name, (started, proc) in list(running.items()):
                if proc.poll() is not None:
                    del running[name]
                    if proc.returncode:
                        stop(p for _, p in running.values())
                        return name
                    say(f"{name} done in {time.perf_counter() - started:.1f} s")
    except KeyboardInterrupt:
        stop(p for _, p in running.values())
        raise
    return None


def main(cfg, args) -> int:
    """``lmablate repro [--jobs N] [--dry]`` in the current folder, the root of a DVC repository
    in git, with study config ``cfg``; returns the exit status (1: a step failed, told in one
    line naming it and its log). N defaults to one chain per core, at most the chains there are.

    Raises:
        ConfigError: a bad ``--jobs``; not the root of a DVC repository in git; another repro
            running in this folder; a cluster address that does not answer (before any
            workspace is made).
        KeyboardInterrupt: Ctrl-C or SIGTERM, once every chain has stopped."""
    jobs, root, out = parse_jobs(args.jobs), Path.cwd(), WORKSPACES
    if not (root / ".dvc").is_dir():
        raise ConfigError(f"repro: {root} is not the root of a DVC repository (no .dvc folder)")
    if args.dry:
        return _repro(cfg, args, jobs, root, out)
    with only_repro(root):
        address = cfg.runtime.cluster_address
        if address is not None:  # before any workspace is made
            from lmablate.execution.scheduler_probe import probe_scheduler
            probe_scheduler(address, cfg.runtime.cluster_timeout, cfg.runtime.cluster_key)
        return _repro(cfg, args, jobs, root, out)


def _repro(cfg, args, jobs: int | None, root: Path, out: Path) -> int:
    """:func:`main` once the folder is checked (and, unless ``--dry``, locked)."""
    from dvc.repo import Repo

    steps = plan(stage_graph(root))
    extra = store_env(cfg.tune.storage_url, cfg.tracking.tracking_uri, root)
    jobs = jobs or max(1, min(len(steps.chains), os.cpu_count() or 1))

    def say(line: str) -> None:
        print(f"lmablate repro: {line}", flush=True)

    say(f"upstream, in the main workspace: {' '.join(steps.upstream) or '(none)'}")
    for name, stages in steps.chains.items():
        say(f"chain {name}: {' -> '.join(stages)}")
    say(f"{len(steps.chains)} chains, {jobs} at a time, in {out}/<chain>"
        + "".join(f"; {k}={v}" for k, v in extra.items()))
    say(f"then dvc repro in the main workspace (left for it: {' '.join(steps.final)})")
    if args.dry:
        return 0
    workspace_files(root)  # git is there, before any work
    env, start = {**os.environ, **extra}, time.perf_counter()
    # the chains' copies have no git: their MLflow runs get the main workspace's commit
    env.setdefault(COMMIT_ENV, git_commit() or "")

    def failed(chains: dict, jobs: int = 1, tell=lambda line: None) -> bool:
        if name := run_chains(chains, jobs, env, tell):
            log = chains[name][2]
            where = f"; its log: {log}" if log else " in the main workspace"
            print(f"lmablate: error: {name} failed{where}", file=sys.stderr)
        return bool(name)

    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C
    try:
        upstream = {"dvc repro": (root, [["dvc", "repro", *steps.upstream]], None)}
        if steps.upstream and failed(upstream):
            return 1
        with Repo(str(root)) as repo:  # what dvc status calls changed; the cache folder
            changed, cache_dir = set(repo.status()), os.path.abspath(repo.cache.local_cache_dir)
        todo = {n: s for n, s in steps.chains.items() if changed.intersection(s)}
        for name in [n for n in steps.chains if n not in todo]:
            say(f"{name} up to date")
        if todo:
            if cfg.tracking.enabled:  # a new experiment's artifacts: the main workspace's mlruns
                # (MLflow takes it from the cwd)
                from lmablate.tracking.mlflow_store import MlflowStore
                MlflowStore(env.get("MLFLOW_TRACKING_URI", cfg.tracking.uri),
                            cfg.tracking.experiment)
            (out / "logs").mkdir(parents=True, exist_ok=True)
            files, chains = workspace_files(root), {}
            for name in todo:
                make_workspace(root, out / name, files, cache_dir)
                (out / "logs" / f"{name}.log").unlink(missing_ok=True)
                chains[f"chain {name}"] = (out / name, [
                    ["dvc", "checkout", "--with-deps", "--allow-missing", name],
                    ["dvc", "repro", name]], out / "logs" / f"{name}.log")
            if failed(chains, jobs, say):
                return 1
            carried = [s for n, stages in todo.items()
                       for s in carry_locks(root, out / n, changed.intersection(stages))]
            if carried and failed({"dvc checkout": (root, [["dvc", "checkout", *carried]], None)}):
                return 1
        if failed({"dvc repro": (root, [["dvc", "repro"]], None)}):
            return 1
        for name in todo:
            shutil.rmtree(out / name)
        say(f"done in {time.perf_counter() - start:.1f} s")
        return 0
    except KeyboardInterrupt:
        say(f"stopped; workspaces and logs kept in {out}")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
