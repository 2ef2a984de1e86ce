#!/usr/bin/env bash
# Builds the orderworker image without pulling an image: the four binaries
# are built on this host (static, CGO_ENABLED=0), laid out with a CA
# bundle and a passwd and group file for the non-root user in a root file
# system, and deploy/container/Containerfile copies that onto scratch.
#
#   deploy/container/build.sh [TAG]     # TAG defaults to orderworker:$VERSION
#
# The CA bundle is Debian's ca-certificates package, at the version and
# SHA-256 pinned below (the Mozilla roots, as Debian ships them), never the
# build host's /etc/ssl: a host's bundle holds whatever CAs were added to
# it (a proxy's interception CA, a lab's own), and an image built there
# would trust them in every cluster it runs in. The package is fetched
# with `apt-get download` (any Debian or Ubuntu host with Debian's
# security archive in its sources, or give CA_DEB), kept in a cache and
# checked against the pin each build.
#
# Environment:
#   ENGINE          podman or docker (default: podman if present, else docker)
#   VERSION         the image's version label and tag (default: git describe)
#   SOURCE          the image's source label (default: the project's repository)
#   CA_DEB          a ca-certificates .deb already on this host (air-gapped builds);
#                   it must match the pin all the same
#   CA_DEB_VERSION  the package's version (default: the pin below); a new pin
#   CA_DEB_SHA256   needs both, from `apt-cache show ca-certificates=VERSION`
#   CA_EXTRA        PEM files of CAs of your own to trust besides Debian's (an
#                   internal order API's or IdP's), space-separated, appended
#                   to the bundle: name each on purpose (default: none)
#   CA_CACHE        where the .deb is kept (default: ~/.cache/orderworker)
set -euo pipefail
cd "$(dirname "$0")/../.."

# The pin: Debian 12's ca-certificates (bookworm-security), arch all. Bump
# both lines together, from `apt-cache show ca-certificates`.
PIN_VERSION=20250419~deb12u2
PIN_SHA256=b9f76b5271a7ac373fd5e7e1b5b826a71ddd702b42a0d104955ecb1acfffc94b

ENGINE=${ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE=${SOURCE:-https://github.com/orderworker/orderworker}
CA_DEB_VERSION=${CA_DEB_VERSION:-$PIN_VERSION}
CA_DEB_SHA256=${CA_DEB_SHA256:-$PIN_SHA256}
CA_CACHE=${CA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/orderworker}
CA_EXTRA=${CA_EXTRA:-}
TAG=${1:-orderworker:$VERSION}
GO=${GO:-go}

die() { echo "build.sh: $*" >&2; exit 1; }

if [ "$CA_DEB_VERSION" != "$PIN_VERSION" ] && [ "$CA_DEB_SHA256" = "$PIN_SHA256" ]; then
  die "CA_DEB_VERSION=$CA_DEB_VERSION needs its own CA_DEB_SHA256 (apt-cache show ca-certificates=$CA_DEB_VERSION)"
fi
for f in $CA_EXTRA; do
  grep -q -- '-----BEGIN CERTIFICATE-----' "$f" 2>/dev/null || die "CA_EXTRA: $f holds no PEM certificate"
done

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

# The package: CA_DEB, else the cache, else apt-get download; its SHA-256
# checked whichever it is (apt checks its own download against Debian's
# signed index as well).
deb=${CA_DEB:-$CA_CACHE/ca-certificates_${CA_DEB_VERSION/:/%3a}_all.deb}
if [ ! -s "$deb" ]; then
  [ -z "${CA_DEB:-}" ] || die "no file at CA_DEB=$CA_DEB"
  command -v apt-get >/dev/null || die "no apt-get to fetch ca-certificates $CA_DEB_VERSION: download it and set CA_DEB"
  mkdir -p "$CA_CACHE"
  (cd "$ctx" && apt-get download -qq "ca-certificates=$CA_DEB_VERSION") >&2 ||
    die "apt-get download ca-certificates=$CA_DEB_VERSION failed: run apt-get update, add Debian 12's security archive to the sources, or set CA_DEB"
  mv "$ctx"/ca-certificates_*_all.deb "$deb"
fi
got=$(sha256sum "$deb" | cut -d' ' -f1)
[ "$got" = "$CA_DEB_SHA256" ] || die "$deb has SHA-256 $got, not the pinned $CA_DEB_SHA256 of ca-certificates $CA_DEB_VERSION"

root=$ctx/rootfs
home=$ctx/home
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp" "$root/home" "$home/nonroot"

# The bundle as the package's update-ca-certificates writes it: every
# certificate of /usr/share/ca-certificates, in name order, each ending in
# a newline; then CA_EXTRA's, in the order given.
command -v dpkg-deb >/dev/null || die "no dpkg-deb to unpack $deb"
dpkg-deb -x "$deb" "$ctx/deb"
certs=$ctx/deb/usr/share/ca-certificates
bundle=$root/etc/ssl/certs/ca-certificates.crt
n=0
while IFS= read -r -d '' crt; do
  sed -e '$a\' "$certs/$crt" >>"$bundle"
  n=$((n + 1))
done < <(cd "$certs" && find . -type f -name '*.crt' -printf '%P\0' | LC_ALL=C sort -z)
[ "$n" -ge 100 ] || die "ca-certificates $CA_DEB_VERSION holds $n certificates, fewer than the 100 a Mozilla root store has"
[ "$(grep -c -- '-----BEGIN CERTIFICATE-----' "$bundle")" = "$n" ] || die "the bundle does not hold one certificate per file of the package"
for f in $CA_EXTRA; do sed -e '$a\' "$f" >>"$bundle"; done
ca_label="debian ca-certificates $CA_DEB_VERSION"
[ -z "$CA_EXTRA" ] || ca_label="$ca_label, plus $(echo $CA_EXTRA | wc -w) of CA_EXTRA"
ca_sha=$(sha256sum "$bundle" | cut -d' ' -f1)

# Static binaries: no libc in the image. -trimpath keeps the host's paths
# out; the VCS stamp (go version -m) stays, so a binary tells its commit.
# One go build for the four, so that their packages compile once, in
# parallel, and the links run side by side.
CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$root/usr/local/bin/" \
  ./cmd/worker ./cmd/producer ./cmd/dashboard ./cmd/demo
for b in worker producer dashboard demo; do
  [ -x "$root/usr/local/bin/$b" ] || die "no $b binary"
done

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

# Modes set here, whatever this host's umask: nothing writable but by its
# owner, and /tmp sticky. Owners are the Containerfile's: every COPY names
# its own (root for the system, 65532 for its home alone), so that
# neither the engine nor this script's user decides them.
find "$root" "$home" -type d -exec chmod 0755 {} +
find "$root" -type f -exec chmod 0644 {} +
chmod 0755 "$root"/usr/local/bin/*
chmod 1777 "$root/tmp"

# --no-cache: the build is two COPYs, and a cached step would keep the
# labels (created, version) of an earlier build of the same files.
"$ENGINE" build --no-cache \
  --file deploy/container/Containerfile \
  --build-arg VERSION="$VERSION" \
  --build-arg REVISION="$REVISION" \
  --build-arg SOURCE="$SOURCE" \
  --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  --build-arg CA_CERTIFICATES="$ca_label" \
  --build-arg CA_BUNDLE_SHA256="$ca_sha" \
  --tag "$TAG" \
  "$ctx"
echo "built $TAG (CA bundle: $ca_label, $n certificates, sha256 $ca_sha)"
