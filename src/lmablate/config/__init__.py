"""The study's configuration: ``params.yaml`` read, validated and frozen into dataclasses, and its profiles."""
