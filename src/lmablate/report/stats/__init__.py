"""The report's statistics, computed from the collected runs: intervals over seeds, paired
tests, fits against compute, reference points."""
