"""``python -m infergate.dashboards generate [--check] | push ... | snapshot ...``"""

from __future__ import annotations

import sys

from infergate.dashboards.cli import main

if __name__ == "__main__":
    sys.exit(main())
