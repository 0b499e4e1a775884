#!/usr/bin/env bash
# Install headless Chromium (Debian package `chromium`) for tests/test_report.py's browser test.
# Called by .ci/run and by the README's test command, so both run the same tests. Without root or
# sudo it cannot install: outside CI it says so and the test is skipped with that reason (shown in
# pytest's summary: -rs is in pytest's addopts); in CI (CI=true) it fails.
set -uo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi
log="$(mktemp)"
if [ "$SUDO" != none ] && $SUDO apt-get update -qq >"$log" 2>&1 \
        && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >>"$log" 2>&1; then
    echo "install_browser.sh: installed chromium" >&2
    rm -f "$log"
    exit 0
fi
tail -5 "$log" >&2; rm -f "$log"
msg="chromium could not be installed (no root/sudo or no apt): the report's browser test will be skipped"
if [ "${CI:-}" = "true" ] || [ "${CI:-}" = "1" ]; then
    echo "install_browser.sh: error: $msg, and CI must run it" >&2
    exit 1
fi
echo "install_browser.sh: warning: $msg" >&2
exit 0
