"""Where and how a stage's jobs run: threads, processes, a Dask cluster, workspaces, interrupts, the study's progress plan."""
