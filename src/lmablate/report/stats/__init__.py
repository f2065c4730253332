"""The report's statistics from the collected runs: intervals, tests, fits, reference points."""
