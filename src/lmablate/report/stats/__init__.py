"""The report's statistics: intervals, tests, fits and reference points, computed from the collected runs."""
