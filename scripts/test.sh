#!/usr/bin/env bash
# The test suite: installs what it needs (scripts/setup.sh), then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
