#!/usr/bin/env bash
# Installs the Debian packages a make target needs when their commands are missing, so each target works on
# a fresh machine (as root, like the rest of the dev set-up):
#   hack/debian-deps.sh redis-server:redis-server git:git    # CHECK:PACKAGE pairs
#   hack/debian-deps.sh --check redis-server:redis-server    # only list what is missing (exit 1 if any)
# CHECK: a command on PATH, an absolute path that must exist (/usr/lib/cni/bridge), or import.MODULE for a
# module of the system python3 (import.ensurepip: python3-venv). Idempotent: nothing to do, nothing runs.
set -euo pipefail
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
have() {
  case "$1" in
    /*) [ -e "$1" ] ;;
    import.*) python3 -c "import ${1#import.}" >/dev/null 2>&1 ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}
need=()
for pair in "$@"; do
  have "${pair%%:*}" || need+=("${pair#*:}")
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
