"""The ``runtime`` section of ``params.yaml``: where and how concurrently the stages compute.

Never part of a fingerprint and no stage's DVC param: these settings change how fast results
come, never what they are (``tests/test_parallel.py``, ``tests/test_cluster.py``).
:mod:`lmablate.config.study` re-exports :class:`RuntimeConfig` with the other sections.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from lmablate.core.validation import (Rule, check_fields, choice, fail, integer, number, optional,
                                 param)

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")
PARALLEL_CHOICES = ("threads", "processes")
MAX_WORKERS = 1024
MAX_CLUSTER_TIMEOUT = 3600.0  # seconds

# A Dask scheduler address: the protocols distributed's TCP, TLS and websocket comms accept.
CLUSTER_PATTERN = re.compile(r"(tcp|tls|ws|wss)://[A-Za-z0-9.\-]+:[0-9]{1,5}|"
                             r"(tcp|tls|ws|wss)://\[[0-9A-Fa-f:]+\]:[0-9]{1,5}")
CLUSTER_TEXT = ("a Dask scheduler address <protocol>://<host>:<port> "
                "with protocol tcp, tls, ws or wss (e.g. tcp://127.0.0.1:8786)")


def _check_cluster(key: str, value: Any) -> None:
    if not isinstance(value, str) or (value and not CLUSTER_PATTERN.fullmatch(value)):
        # the environment variable may be empty (no cluster); the params key is null then
        fail(key, value, CLUSTER_TEXT)
    if value and not 1 <= int(value.rpartition(":")[2]) <= 65535:
        fail(key, value, f"{CLUSTER_TEXT}; a port from 1 to 65535")


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how concurrently the stages compute: never part of a fingerprint.

    ``workers`` concurrent seeds / Optuna trials on a CPU (0 = auto, see
    :mod:`lmablate.execution.parallel`; each computes with one intra-op thread, as more would change
    the last bits of results), ``parallel`` whether workers are threads of the stage or spawned
    processes. ``tests/test_parallel.py`` shows these give bit-identical results. ``device`` picks
    the hardware (``auto``: CUDA, then MPS, then CPU); the kind of device a run resolved to
    and its numerics (:func:`lmablate.train.numerics.numerics_kind`: the type with its CPU kernels
    or GPU and a measured fingerprint of them) are recorded with its result and enter its
    fingerprint, since bf16 autocast on CUDA computes other numbers than fp32 on a CPU, and
    AVX512 other bits than AVX2. ``cluster`` names a Dask scheduler
    whose workers compute the stages' jobs (:mod:`lmablate.execution.cluster`).
    """

    device: str = param("auto", "where the stages compute (auto: cuda, then mps, then cpu)",
                        choice(DEVICE_CHOICES), result=False)
    workers: int = param(0, "seeds / Optuna trials computed at once on a CPU (0: about one per "
                         "core)", integer(0, MAX_WORKERS), result=False)
    parallel: str = param("threads", "workers are threads of the stage or spawned processes",
                          choice(PARALLEL_CHOICES), result=False)
    cluster: str | None = param(None, "a Dask scheduler address (tcp://host:8786) that computes "
                                "the stages' seeds, evaluations and trials; null: this machine "
                                "(env LMABLATE_CLUSTER overrides it)",
                                optional(Rule(CLUSTER_TEXT, _check_cluster)), result=False)
    cluster_timeout: float = param(15.0, "seconds the cluster's scheduler has to answer (a "
                                   "dead address fails in about this long)",
                                   number(MAX_CLUSTER_TIMEOUT), result=False)

    def __post_init__(self) -> None:
        check_fields(self, "runtime")

    @property
    def cluster_address(self) -> str | None:
        """``cluster``, or the environment variable ``LMABLATE_CLUSTER`` when it is set (checked
        by the same rule; empty: no cluster). None: the stages compute on this machine.

        Raises:
            ConfigError: ``LMABLATE_CLUSTER`` is not a scheduler address.
        """
        value = os.environ.get("LMABLATE_CLUSTER")
        if value is None:
            return self.cluster
        _check_cluster("LMABLATE_CLUSTER (env)", value)
        return value or None

    @property
    def cluster_key(self) -> str:
        """Where :attr:`cluster_address` comes from, as messages name it: ``runtime.cluster``
        or ``LMABLATE_CLUSTER (env)``."""
        return ("runtime.cluster" if os.environ.get("LMABLATE_CLUSTER") is None
                else "LMABLATE_CLUSTER (env)")
