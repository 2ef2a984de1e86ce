#!/usr/bin/env bash
# Builds the orderworker image without pulling anything: the four binaries
# are built on this host (static, CGO_ENABLED=0), laid out with the host's
# CA bundle and a passwd and group file for the non-root user in a root
# file system, and deploy/container/Containerfile copies that onto scratch.
#
#   deploy/container/build.sh [TAG]     # TAG defaults to orderworker:$VERSION
#
# Environment:
#   ENGINE      podman or docker (default: podman if present, else docker)
#   VERSION     the image's version label and tag (default: git describe)
#   SOURCE      the image's source label (default: the project's repository)
#   CA_BUNDLE   the CA certificates to copy (default: /etc/ssl/certs/ca-certificates.crt)
set -euo pipefail
cd "$(dirname "$0")/../.."

ENGINE=${ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE=${SOURCE:-https://github.com/orderworker/orderworker}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
TAG=${1:-orderworker:$VERSION}
GO=${GO:-go}

if [ ! -s "$CA_BUNDLE" ]; then
  echo "build.sh: no CA bundle at $CA_BUNDLE (Debian: apt-get install ca-certificates; or set CA_BUNDLE)" >&2
  exit 1
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/home/nonroot" "$root/tmp"
chmod 1777 "$root/tmp"

# Static binaries: no libc in the image. -trimpath keeps the host's paths
# out; the VCS stamp (go version -m) stays, so a binary tells its commit.
# One go build for the four, so that their packages compile once, in
# parallel, and the links run side by side.
CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$root/usr/local/bin/" \
  ./cmd/worker ./cmd/producer ./cmd/dashboard ./cmd/demo
for b in worker producer dashboard demo; do
  [ -x "$root/usr/local/bin/$b" ] || { echo "build.sh: no $b binary" >&2; exit 1; }
done

cp "$CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
GROUP
# The user owns its home and nothing else. --chown would need the engine
# to know the user; numeric ownership in the context works with both.
if [ "$(id -u)" = 0 ]; then chown -R 65532:65532 "$root/home/nonroot"; fi

# --no-cache: the build is one COPY, and a cached step would keep the
# labels (created, version) of an earlier build of the same files.
"$ENGINE" build --no-cache \
  --file deploy/container/Containerfile \
  --build-arg VERSION="$VERSION" \
  --build-arg REVISION="$REVISION" \
  --build-arg SOURCE="$SOURCE" \
  --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  --tag "$TAG" \
  "$ctx"
echo "built $TAG"
