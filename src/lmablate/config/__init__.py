"""The study's configuration: ``params.yaml`` read strictly (:mod:`~lmablate.config.params`),
each section a validated, frozen dataclass, and the profiles composed over the defaults.

A new key goes into its section's dataclass as a :func:`~lmablate.core.validation.param` with
its rule and description; the params reference page is generated from it."""
