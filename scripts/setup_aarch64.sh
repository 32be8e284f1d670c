#!/usr/bin/env bash
# Installs what the aarch64 cross build and its emulated tests need, when missing: Debian's cross
# tool chain, qemu-user, and the arm64 builds of the libraries specula links (dpkg multiarch).
# Idempotent; needs root (or sudo).
set -euo pipefail
. "$(dirname "$0")/progress.sh"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi
packages=(g++-aarch64-linux-gnu qemu-user libstdc++6:arm64 libgomp1:arm64 libgtest-dev:arm64 libbenchmark-dev:arm64)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  progress_start setup-aarch64 2 steps --lines
  progress_step 0 "apt-get update"
  $SUDO apt-get update -qq
  progress_step 1 "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  progress_step 2 "installed ${#missing[@]} packages"
fi
