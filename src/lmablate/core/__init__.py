"""What every step shares: file I/O, bad-input errors, fingerprints, the environment record and progress bars."""
