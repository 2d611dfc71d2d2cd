#!/usr/bin/env bash
# Installs Prometheus from Debian's packages when it is missing: tests/ui start it on a free port to scrape a
# local cluster. The distribution's service is never started (policy-rc.d forbids it during the install).
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then exit 0; fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  created_policy=1
fi
trap '[ "$created_policy" = 1 ] && $SUDO rm -f "$policy"' EXIT
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null 2>&1 || { echo "prometheus installed but not on PATH" >&2; exit 1; }
echo "installed $(prometheus --version 2>&1 | head -1)"
