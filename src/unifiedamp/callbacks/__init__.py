"""Loggers of the scale and of skipped steps for trainers: ``unifiedamp.callbacks.lightning``
(a Lightning ``Callback``) and ``unifiedamp.callbacks.keras`` (a Keras ``Callback``). Each
module imports its framework; this package imports none."""
