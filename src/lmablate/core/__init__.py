"""What every step shares: file I/O (atomic writes), the bad-input errors and rules, the
fingerprints that key results, the tracker protocols, Ctrl-C as a request to stop, the garbage
collector paused around slow imports, progress bars, and the installed packages checked
against requirements.lock."""
