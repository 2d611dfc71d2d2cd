#!/usr/bin/env bash
# Usage: scripts/install-debian.sh COMMAND PACKAGE...
# Installs Debian PACKAGEs when COMMAND is not on PATH (make system-deps runs it for etcd, Java, Prometheus,
# Chromium and iproute2, none of which PyPI ships). Services a package would start are not started: policy-rc.d
# forbids it during the install, since the tests start etcd and Prometheus themselves on free ports.
set -euo pipefail
command_name=$1
shift
if command -v "$command_name" >/dev/null 2>&1; then exit 0; fi
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
# The JRE's post-install step creates man-page links under /usr/share/man/man1, which slim images remove.
$SUDO mkdir -p /usr/share/man/man1
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
command -v "$command_name" >/dev/null 2>&1 || { echo "$* installed but '$command_name' is not on PATH" >&2; exit 1; }
echo "installed $*"
