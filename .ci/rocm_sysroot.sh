#!/usr/bin/env bash
# Creates (or reuses) a Debian sid sysroot holding the ROCm compile toolchain: hipcc/clang,
# the HIP runtime, rocBLAS and hipBLASLt headers and libraries, CMake, ninja, Python and pybind11.
# The ROCm build check (.ci/rocm_check.sh) compiles and links inside it with chroot; no AMD GPU
# is needed or used.
#
#   .ci/rocm_sysroot.sh [DIR]        DIR defaults to ${TE_ROCM_SYSROOT:-/var/cache/te-rocm-sysroot}
#
# Environment: TE_DEBIAN_MIRROR (default http://deb.debian.org/debian), TE_ROCM_SYSROOT.
# Needs root (debootstrap, chroot, mount). Bookworm's own glibc is too old for sid's ROCm
# binaries, hence the chroot rather than installing the packages on the host.
#
# Idempotent: a sysroot whose stamp matches this recipe is reused as is; a missing, partial or
# outdated one is deleted and rebuilt. The GPU kernel data of rocBLAS/hipBLASLt (GiBs of code
# objects that only matter at run time on a real GPU) is never unpacked.
set -euo pipefail

SYSROOT=${1:-${TE_ROCM_SYSROOT:-/var/cache/te-rocm-sysroot}}
MIRROR=${TE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
STAMP_FILE=.te-rocm-sysroot-stamp

# What goes in. Changing this list (or RECIPE_VERSION) changes the stamp and forces a rebuild.
RECIPE_VERSION=1
# hipcc depends on the device libraries of its own LLVM (rocm-device-libs-NN), so no LLVM version
# is named here; libhipblaslt-dev lacks its dependency on libhipblas-common-dev, hence listed.
PACKAGES=(
  hipcc libamdhip64-dev
  librocblas-dev libhipblaslt-dev libhipblas-common-dev
  cmake ninja-build python3-dev python3-pybind11 pybind11-dev
  binutils
)
# Paths dpkg skips while unpacking: rocBLAS/hipBLASLt GPU kernel libraries (Tensile code objects
# and their catalogues), documentation and translations. Headers, CMake configs and the .so files
# the link needs are kept.
DPKG_EXCLUDES=(
  "/usr/lib/x86_64-linux-gnu/rocblas/*/library/*"
  "/usr/lib/x86_64-linux-gnu/hipblaslt/*/library/*"
  "/usr/lib/x86_64-linux-gnu/rocblas/library/*"
  "/usr/lib/x86_64-linux-gnu/hipblaslt/library/*"
  "/usr/share/doc/*"
  "/usr/share/man/*"
  "/usr/share/locale/*"
  "/usr/share/info/*"
)

log() { printf '[rocm_sysroot %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot and mount need it)"
case "$SYSROOT" in
  /|/usr|/var|/var/cache|/tmp|/home|/root|"") die "refusing to use '$SYSROOT' as the sysroot";;
  /*) ;;
  *) SYSROOT=$(realpath -m "$SYSROOT");;
esac

recipe_key() {
  printf 'recipe=%s\nmirror-suite=sid\npackages=%s\nexcludes=%s\n' \
    "$RECIPE_VERSION" "${PACKAGES[*]}" "${DPKG_EXCLUDES[*]}" | sha256sum | cut -c1-16
}
KEY=$(recipe_key)

# Unmounts everything mounted at or below the sysroot (deepest first). Deleting a sysroot with a
# bind-mounted checkout still inside would delete the checkout, so this runs before any rm.
unmount_all() {
  local root=$1 m
  [ -d "$root" ] || return 0
  while read -r m; do
    [ -n "$m" ] && umount -l "$m" 2>/dev/null || true
  done < <(awk -v r="$root" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/self/mounts | sort -r)
  if awk -v r="$root" '$2 == r || index($2, r "/") == 1 {found=1} END {exit !found}' /proc/self/mounts; then
    die "mounts remain under $root; not deleting it"
  fi
}

sysroot_ok() {
  [ -f "$SYSROOT/$STAMP_FILE" ] || return 1
  grep -qx "key=$KEY" "$SYSROOT/$STAMP_FILE" || return 1
  local f
  for f in usr/bin/hipcc usr/bin/cmake usr/bin/ninja usr/bin/python3 \
           usr/include/hip/hip_runtime.h usr/include/rocblas/rocblas.h \
           usr/include/hipblaslt/hipblaslt.h; do
    [ -e "$SYSROOT/$f" ] || return 1
  done
}

# The same lock guards use (build_tools/rocm_sysroot.py holds it while it has mounts inside).
exec 9>>"${SYSROOT%/}.lock"
flock -w 1800 9 || die "another run holds ${SYSROOT%/}.lock"

if sysroot_ok; then
  log "reusing $SYSROOT (stamp key $KEY)"
  sed 's/^/  /' "$SYSROOT/$STAMP_FILE" >&2
  exit 0
fi

START=$(date +%s)
[ ! -e "$SYSROOT" ] || log "sysroot at $SYSROOT is partial or from another recipe: rebuilding"

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap from the host's apt"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

trap 'unmount_all "$SYSROOT"' EXIT

# The dpkg excludes must exist before anything is unpacked by dpkg, so the file is written into
# the target before debootstrap runs (debootstrap leaves an existing dpkg.cfg.d file alone).
bootstrap_base() {
  unmount_all "$SYSROOT"
  rm -rf --one-file-system "$SYSROOT"
  mkdir -p "$SYSROOT/etc/dpkg/dpkg.cfg.d"
  {
    echo "# written by .ci/rocm_sysroot.sh: files the ROCm compile+link check never reads"
    for p in "${DPKG_EXCLUDES[@]}"; do echo "path-exclude=$p"; done
    echo "path-include=/usr/share/doc/*/copyright"
  } > "$SYSROOT/etc/dpkg/dpkg.cfg.d/te-minimal"
  debootstrap --variant=minbase sid "$SYSROOT" "$MIRROR" >"$SYSROOT.debootstrap.log" 2>&1
}

log "debootstrap sid into $SYSROOT from $MIRROR"
T0=$(date +%s)
# One retry: a mirror hiccup should not fail CI.
bootstrap_base || { log "debootstrap failed; retrying once"; sleep 5; bootstrap_base; } \
  || { tail -30 "$SYSROOT.debootstrap.log" >&2; die "debootstrap failed (log: $SYSROOT.debootstrap.log)"; }
log "base system in $(( $(date +%s) - T0 )) s"

cp -L /etc/resolv.conf "$SYSROOT/etc/resolv.conf"
mountpoint -q "$SYSROOT/proc" || mount -t proc proc "$SYSROOT/proc"
cat > "$SYSROOT/etc/apt/apt.conf.d/90te" <<'EOF'
Acquire::Check-Valid-Until "false";
Acquire::Retries "3";
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Dpkg::Use-Pty "false";
EOF

in_root() { chroot "$SYSROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
              DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }

log "installing: ${PACKAGES[*]}"
T0=$(date +%s)
in_root apt-get update -qq
in_root apt-get install -y -qq "${PACKAGES[@]}" >"$SYSROOT.apt.log" 2>&1 \
  || { tail -30 "$SYSROOT.apt.log" >&2; die "apt-get install failed (log: $SYSROOT.apt.log)"; }
in_root apt-get clean
rm -rf "$SYSROOT"/var/lib/apt/lists/*
log "toolchain installed in $(( $(date +%s) - T0 )) s"

# Belt and braces: a package that moved its kernel data somewhere the excludes do not cover
# would silently bloat the sysroot; report it instead.
big=$(find "$SYSROOT/usr/lib" -type f \( -name '*.co' -o -name '*.hsaco' -o -name '*.dat' \) \
      -size +1M 2>/dev/null | head -5 || true)
[ -z "$big" ] || log "note: GPU kernel files still present (extend DPKG_EXCLUDES): $big"

{
  echo "key=$KEY"
  echo "created=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  in_root dpkg-query -W -f='${Package}=${Version}\n' hipcc libamdhip64-dev librocblas-dev \
    libhipblaslt-dev 'rocm-device-libs-*' 'clang-[0-9]*' cmake python3 2>/dev/null \
    | grep -v '=$' | sort || true
} > "$SYSROOT/$STAMP_FILE.tmp"
mv "$SYSROOT/$STAMP_FILE.tmp" "$SYSROOT/$STAMP_FILE"

log "sysroot ready: $(du -sh --one-file-system "$SYSROOT" | cut -f1) in $(( $(date +%s) - START )) s"
sed 's/^/  /' "$SYSROOT/$STAMP_FILE" >&2
