"""How busy a Dask cluster's workers are while a command runs: the busy share of a study.

    python scripts/cluster_busy.py tcp://127.0.0.1:8786 --report dask-report.html -- dvc repro

runs the command after ``--`` with ``LMABLATE_CLUSTER`` set to the scheduler, records Dask's own
task stream meanwhile (``distributed.performance_report`` writes it, with the task timeline, to
the HTML report), and prints the wall time, the tasks by kind (the first word of their keys:
``tune``, ``train``, ``evaluate``) and the busy share: the seconds the workers' threads spent
computing tasks over the threads times the wall time, per worker and overall. Exits with the
command's exit status.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time


def busy_share(stream: list[dict], threads: dict[str, int], start: float,
               stop: float) -> tuple[float, dict[str, float]]:
    """``(overall, per worker)`` busy share of the task-stream records ``stream`` (Dask's
    ``Client.get_task_stream``) between ``start`` and ``stop`` (Unix seconds): computing
    seconds over ``threads`` (per worker) x wall seconds, each compute interval clipped to the
    window. Workers without a record count as idle.

    Raises:
        ValueError: ``stop`` is not after ``start``, or no worker has a thread.
    """
    wall = stop - start
    if wall <= 0 or sum(threads.values()) <= 0:
        raise ValueError(f"no window to measure (wall {wall} s, threads {threads})")
    computing = collections.Counter()
    for record in stream:
        for part in record["startstops"]:
            if part["action"] == "compute":
                computing[record["worker"]] += max(
                    0.0, min(part["stop"], stop) - max(part["start"], start))
    per_worker = {w: computing[w] / (n * wall) for w, n in threads.items()}
    return sum(computing[w] for w in threads) / (sum(threads.values()) * wall), per_worker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scheduler",
                        help="the Dask scheduler's address, e.g. tcp://127.0.0.1:8786")
    parser.add_argument("--report", default="dask-report.html",
                        help="where performance_report writes its HTML (default %(default)s)")
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("no command to run: give it after --")
    args = parser.parse_args(argv[:argv.index("--")])
    command = argv[argv.index("--") + 1:]
    from distributed import Client, performance_report
    with Client(args.scheduler, timeout=60) as client:
        threads = {w: info["nthreads"] for w, info in
                   client.scheduler_info(n_workers=-1)["workers"].items()}
        client.get_task_stream()  # the scheduler records the task stream from here on
        start = time.time()
        try:
            with performance_report(filename=args.report):
                done = subprocess.run(command, env={**os.environ,
                                                    "LMABLATE_CLUSTER": args.scheduler})
        except ModuleNotFoundError as exc:  # the scheduler draws the report with bokeh
            print(f"no HTML report ({exc}: pip install bokeh where the scheduler runs)",
                  file=sys.stderr)
        stop = time.time()
        stream = client.get_task_stream(start=start)
    overall, per_worker = busy_share(stream, threads, start, stop)
    kinds = collections.Counter(str(r["key"]).split("-")[0] for r in stream)
    print(f"wall {stop - start:.1f} s; {len(stream)} tasks "
          f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}) on "
          f"{len(threads)} workers, {sum(threads.values())} threads")
    for worker, share in sorted(per_worker.items()):
        print(f"  {worker}: busy {share:.1%}")
    print(f"busy share {overall:.1%}; task stream and timeline in {args.report}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
