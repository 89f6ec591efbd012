# Sourced by scripts/setup.sh and scripts/fuzz.sh (not run on its own).
# install_missing LABEL PACKAGE...: installs, with apt-get (through sudo unless root), those of
# the Debian packages that are not installed yet; does nothing, not even `apt-get update`, when
# every one is, so that a set-up machine runs it offline and without sudo.
install_missing() {
  local label=$1 p sudo=""
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "$label: installing ${#missing[@]} Debian packages: ${missing[*]}"
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}
