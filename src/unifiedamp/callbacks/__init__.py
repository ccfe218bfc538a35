"""Trainer integrations: ``unifiedamp.callbacks.lightning`` (a Lightning ``Callback`` that
logs the scale), ``unifiedamp.callbacks.keras`` (the same for Keras) and
``unifiedamp.callbacks.accelerate`` (``use_scaler``, which hands the torch scaler to a Hugging
Face ``Accelerator``). Each module imports its framework; this package imports none."""
