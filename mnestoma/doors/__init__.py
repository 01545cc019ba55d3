"""The doors a caller opens: the sync facade ``Mnestoma``, the async ``AsyncMnestoma`` and
what they share, one transaction per call."""
