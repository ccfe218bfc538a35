"""``python -m unifiedamp.conformance.engines FRAMEWORK [ENGINE SCALER]``."""

from unifiedamp.conformance.engines import main

raise SystemExit(main())
