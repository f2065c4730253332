"""One module per DVC stage: I/O, validation and tracking around the library modules."""
