"""Where and how a stage's jobs run: :func:`lmablate.execution.executor.run_jobs`, the one call a
stage makes, inline, in threads or processes on one machine (:mod:`~lmablate.execution.parallel`)
or as tasks of a Dask cluster (:mod:`~lmablate.execution.cluster`); the study's chains in
workspaces (:mod:`~lmablate.execution.workspaces`, whole stages rather than a stage's jobs);
child processes that end with their parent, and the study's progress."""
