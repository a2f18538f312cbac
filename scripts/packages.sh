# Sourced by the scripts: ensure_packages P... installs the Debian packages that are missing.
ensure_packages() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then echo "need root to apt-get install ${missing[*]}" >&2; return 1; fi
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}
