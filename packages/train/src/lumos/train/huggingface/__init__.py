"""lumos.train.huggingface: Hugging Face integrations.

``lumos.train.huggingface.transformers``: ``ReportCallback`` and ``prepare_trainer``
for a ``transformers.Trainer`` (extra: ``pip install 'lumos-train[transformers]'``).
This package itself defines no names: import the integration's module.

Example:
    >>> from lumos.train.huggingface.transformers import ReportCallback  # doctest: +SKIP
"""
