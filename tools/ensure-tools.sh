#!/usr/bin/env bash
# Install the real parts the test suite runs against, when they are missing and we can:
# root on Debian. Anywhere else, say so once; the tests that need them then skip loudly
# (or fail, with LLM_VITALS_REQUIRE_REAL_STACK=1).
set -u
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
# Deduplicate (prometheus gives both prometheus and promtool).
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "tools: installing ${need[*]} from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || echo "tools: apt-get install ${need[*]} failed; the tests that need them will skip" >&2
else
  echo "tools: missing ${need[*]}; install with: apt-get install --no-install-recommends ${need[*]}" >&2
fi
exit 0
