#!/usr/bin/env bash
# Installs the Debian packages a make target needs when their commands are missing, so each target works on
# a fresh machine (as root, like the rest of the dev set-up):
#   hack/debian-deps.sh redis-server:redis-server git:git    # COMMAND:PACKAGE pairs
#   hack/debian-deps.sh --check redis-server:redis-server    # only list what is missing (exit 1 if any)
set -euo pipefail
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
need=()
for pair in "$@"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$check" = 1 ]; then
  echo "${need[*]}"
  exit 1
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing Debian packages: ${need[*]} (install them as root: apt-get install ${need[*]})" >&2
  exit 2
fi
echo "installing ${need[*]} (Debian)"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine's package lists may be empty or old: update once, then install.
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
