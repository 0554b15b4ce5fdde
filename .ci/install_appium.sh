#!/usr/bin/env bash
# Install an Appium server and its fake driver into .ci/node/ (git-ignored) for the `android`
# tests (tests/envs/test_android.py). Idempotent: a second run with both present does nothing.
# Under CI=true any failure (no node/npm, a failed npm install) exits non-zero and stops
# .ci/run: CI must run the android tests. Elsewhere it says so and exits 0, and the android
# tests skip, naming what is missing.
set -uo pipefail
cd "$(dirname "$0")"

APPIUM_VERSION="${APPIUM_VERSION:-3}"
FAKE_DRIVER_VERSION="${FAKE_DRIVER_VERSION:-6}"
PREFIX="$PWD/node"
export APPIUM_HOME="$PREFIX/appium-home"

give_up() {  # a failure: fatal under CI, a skip of the android tests elsewhere
  case "${CI:-}" in
    1|true|TRUE|True|yes|on)
      echo "install_appium: $1; CI=true, so this fails the run" >&2
      exit 1 ;;
  esac
  echo "install_appium: $1; the android tests will be skipped"
  exit 0
}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  give_up "node/npm not found"
fi
has_fake() {
  [ -x "$PREFIX/node_modules/.bin/appium" ] \
    && "$PREFIX/node_modules/.bin/appium" driver list --installed 2>&1 | grep -q "fake"
}
if has_fake; then
  echo "install_appium: appium and the fake driver are already in $PREFIX"
  exit 0
fi
mkdir -p "$PREFIX" "$APPIUM_HOME"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error \
  "appium@$APPIUM_VERSION" || give_up "npm install appium failed"
"$PREFIX/node_modules/.bin/appium" driver install --source=npm \
  "@appium/fake-driver@$FAKE_DRIVER_VERSION" || give_up "installing the fake driver failed"
has_fake || give_up "the fake driver is not listed after its install"
echo "install_appium: appium and the fake driver installed in $PREFIX"
