#!/usr/bin/env bash
# Installs Debian's chromium when it is missing: tests/ui/test_web_view.py drives it headless through Playwright
# (executable_path), since Playwright cannot download its own browsers here.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null 2>&1 || { echo "chromium installed but not on PATH" >&2; exit 1; }
echo "installed $(chromium --version 2>&1 | head -1)"
