#!/usr/bin/env bash
# Builds Debian's own Abseil and gRPC, the exact source versions the installed packages come from
# (same SONAMEs, same Abseil inline namespace), with -fsanitize=thread into PREFIX/lib:
#
#   scripts/tsan-deps.sh PREFIX
#
# Why: gRPC orders its completion queues, closures and call state with absl::Mutex (futex-based)
# and its own atomics. Uninstrumented, TSan sees none of that ordering and reports a race in every
# gRPC reactor (a callback's tag destroyed on the thread that runs OnDone, a status handed from
# the poller to a callback). With these first on LD_LIBRARY_PATH, the code Ferry runs inside gRPC's
# callback API (scheduler service and its worker client, the gateway's scheduler client and call
# lifecycle, the replica router) is checked like the rest, with no suppression (scripts/sanitize.sh
# tsan). Ferry's binaries are still linked against the system libraries; only the loader's choice
# changes. Nothing is installed system-wide and the system's apt sources are left alone: the source
# packages come from deb.debian.org through a private apt state in a temporary directory. About 16
# minutes on 2 cores (Abseil 8, the five gRPC libraries 8); a no-op once built.
set -euo pipefail
prefix=${1:?usage: $0 PREFIX}
[ -f "$prefix/lib/libgrpc.so" ] && [ -f "$prefix/lib/libabsl_synchronization.so" ] && exit 0
mkdir -p "$prefix/lib"
prefix=$(cd "$prefix" && pwd)
JOBS=${JOBS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/apt/lists/partial" "$work/apt/parts"
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
cat > "$work/apt/sources.list" <<EOF
deb-src http://deb.debian.org/debian $codename main
deb-src http://deb.debian.org/debian $codename-updates main
deb-src http://deb.debian.org/debian-security $codename-security main
EOF
apt_private=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=$work/apt/parts"
             -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=")
apt-get -qq "${apt_private[@]}" update

# The source of the installed binary package $1, unpacked with Debian's patches (dpkg-source -x,
# which apt-get source runs): prints its directory.
source_of() {
  local pkg ver
  pkg=$(dpkg-query -W -f='${source:Package}' "$1")
  ver=$(dpkg-query -W -f='${source:Version}' "$1")
  (cd "$work" && apt-get -qq "${apt_private[@]}" source "$pkg=$ver" >/dev/null 2>&1)
  find "$work" -maxdepth 1 -type d -name "$pkg-*" | head -1
}

tsan_flags=(-DCMAKE_C_FLAGS="-O1 -g1 -fsanitize=thread" -DCMAKE_CXX_FLAGS="-O1 -g1 -fsanitize=thread"
            -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread
            -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON)

# Abseil, configured as debian/rules does (C++17, shared), plus the sanitizer.
absl=$(source_of libabsl20220623)
nice -n 19 cmake -S "$absl" -B "$work/absl" -G Ninja "${tsan_flags[@]}" -DCMAKE_INSTALL_PREFIX="$work/absl-install" \
  -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
nice -n 19 cmake --build "$work/absl" -j "$JOBS" >/dev/null
cmake --install "$work/absl" >/dev/null
cp -P "$work"/absl-install/lib/libabsl_*.so* "$prefix/lib/"

# gRPC against the system's packages (as debian/rules: abseil, c-ares, protobuf, re2, ssl, zlib);
# only the five libraries Ferry links. The headers of the system Abseil are the same version.
grpc=$(source_of libgrpc29)
nice -n 19 cmake -S "$grpc" -B "$work/grpc" -G Ninja "${tsan_flags[@]}" -DgRPC_BUILD_TESTS=OFF \
  -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package -DgRPC_PROTOBUF_PROVIDER=package \
  -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package \
  -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF -DgRPC_BUILD_CSHARP_EXT=OFF -DgRPC_BUILD_GRPC_CSHARP_PLUGIN=OFF \
  -DgRPC_BUILD_GRPC_NODE_PLUGIN=OFF -DgRPC_BUILD_GRPC_OBJECTIVE_C_PLUGIN=OFF -DgRPC_BUILD_GRPC_PHP_PLUGIN=OFF \
  -DgRPC_BUILD_GRPC_PYTHON_PLUGIN=OFF -DgRPC_BUILD_GRPC_RUBY_PLUGIN=OFF >/dev/null
nice -n 19 cmake --build "$work/grpc" -j "$JOBS" --target grpc grpc++ gpr upb address_sorting >/dev/null
for lib in grpc grpc++ gpr upb address_sorting; do cp -P "$work/grpc/lib$lib.so"* "$prefix/lib/"; done
echo "tsan-deps: Abseil and gRPC (Debian's sources) with -fsanitize=thread in $prefix/lib"
