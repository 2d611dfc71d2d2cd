#!/usr/bin/env bash
# Installs a Java 17 runtime from Debian's packages when `java` is missing: PySpark (the tidelog[spark] extra,
# which the tests and the Spark benchmark use) starts a JVM. Headless: no GUI libraries are needed.
set -euo pipefail
if command -v java >/dev/null 2>&1; then exit 0; fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# The JRE's post-install step creates man-page links under /usr/share/man/man1, which slim images remove.
$SUDO mkdir -p /usr/share/man/man1
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null
command -v java >/dev/null 2>&1 || { echo "openjdk-17-jre-headless installed but 'java' is not on PATH" >&2; exit 1; }
echo "installed $(java -version 2>&1 | head -1)"
