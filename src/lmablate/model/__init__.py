"""The model every ablation trains: a small GPT (:mod:`~lmablate.model.gpt`) whose norm, FFN,
position scheme and block placement are chosen by name from registries, and each variant's
config at a given width with the causality pre-flight (:mod:`~lmablate.model.variants`).

A new position scheme is a :class:`~lmablate.model.gpt.Position` subclass in
:mod:`~lmablate.model.gpt`, registered in ``POSITIONS`` and allowed in
:data:`~lmablate.config.study.POSITION_CHOICES`; its hooks let it share the one attention path,
and the pre-flight checks that it cannot see the future."""
