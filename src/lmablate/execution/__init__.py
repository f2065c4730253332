"""Where and how a stage's jobs run: threads or processes on one machine, tasks of a Dask
cluster, the study's chains in workspaces; Ctrl-C, child processes and the study's progress."""
