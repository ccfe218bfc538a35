"""The adapters that drive the built-in backends through the conformance suite.

One module per built-in backend, named like the backend's own module; the
backend table (``unifiedamp._registry.BUILTIN``) points at each adapter class,
so ``NumpyGradScaler.conformance_adapter()`` (and the same on a subclass) finds
its adapter without the backend importing the suite.
"""
