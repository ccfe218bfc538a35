"""``python -m unifiedamp.conformance.engines [-h] FRAMEWORK [ENGINE SCALER]``."""

from unifiedamp.conformance.engines import main

raise SystemExit(main())
