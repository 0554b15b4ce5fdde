#!/usr/bin/env bash
# Install Debian's `chromium` package for the `chromium` test (tests/test_report.py renders the
# HTML report in headless Chromium). Idempotent: with a chromium on PATH it does nothing.
# Where it cannot install (no apt-get, not root and no password-less sudo, no network) it says
# so and exits 0: the chromium test then skips.
set -uo pipefail

for name in chromium chromium-browser google-chrome; do
  if command -v "$name" >/dev/null; then
    echo "install_chromium: $name is already installed ($("$name" --version 2>/dev/null))"
    exit 0
  fi
done
if ! command -v apt-get >/dev/null; then
  echo "install_chromium: no apt-get; the chromium test will be skipped"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  echo "install_chromium: not root and no password-less sudo; the chromium test will be skipped"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq \
  && $SUDO apt-get install -y -qq chromium >/dev/null \
  || { echo "install_chromium: apt-get install chromium failed; the chromium test will be skipped"; exit 0; }
echo "install_chromium: installed $(chromium --version 2>/dev/null)"
