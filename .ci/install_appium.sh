#!/usr/bin/env bash
# Install an Appium server and its fake driver into .ci/node/ (git-ignored) for the `android`
# tests (tests/test_android.py). Idempotent: a second run with both present does nothing.
# Without node/npm it says so and exits 0: the android tests then skip.
set -uo pipefail
cd "$(dirname "$0")"

APPIUM_VERSION="${APPIUM_VERSION:-3}"
FAKE_DRIVER_VERSION="${FAKE_DRIVER_VERSION:-6}"
PREFIX="$PWD/node"
export APPIUM_HOME="$PREFIX/appium-home"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "install_appium: node/npm not found; the android tests will be skipped"
  exit 0
fi
if [ -x "$PREFIX/node_modules/.bin/appium" ] \
   && "$PREFIX/node_modules/.bin/appium" driver list --installed 2>&1 | grep -q "fake"; then
  echo "install_appium: appium and the fake driver are already in $PREFIX"
  exit 0
fi
mkdir -p "$PREFIX" "$APPIUM_HOME"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error \
  "appium@$APPIUM_VERSION" || { echo "install_appium: npm install appium failed"; exit 0; }
"$PREFIX/node_modules/.bin/appium" driver install --source=npm \
  "@appium/fake-driver@$FAKE_DRIVER_VERSION" \
  || { echo "install_appium: installing the fake driver failed"; exit 0; }
echo "install_appium: appium and the fake driver installed in $PREFIX"
