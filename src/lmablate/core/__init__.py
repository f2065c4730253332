"""What every step shares: file I/O (atomic writes), the bad-input errors and rules, the
fingerprints that key results, the environment recorded with them, and progress bars."""
