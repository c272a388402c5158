#!/usr/bin/env bash
# A private image registry for the image tests: Debian's docker-registry on 127.0.0.1 with TLS
# (a CA generated per environment) and htpasswd authentication, fed with locally built images
# by skopeo.
#
#   registry-test-env.sh install              install docker-registry, skopeo, apache2-utils
#                                             (htpasswd) and openssl when missing (root + apt-get)
#   registry-test-env.sh start ENVDIR CERTSD  start a registry whose certificates, password
#                                             file, storage and log live under ENVDIR (created,
#                                             must not be in use), push the test images, and
#                                             write CERTSD/<host:port>/hosts.toml so that a
#                                             containerd with `config_path = CERTSD` trusts it;
#                                             prints its settings
#   registry-test-env.sh stop ENVDIR          stop that registry and remove ENVDIR
#
# `start` prints KEY=VALUE lines (also written to ENVDIR/env): REGISTRY (host:port),
# REGISTRY_USER, REGISTRY_PASSWORD, REGISTRY_CA, PRIVATE_IMAGE (busybox, needs the credentials),
# EXTRA_IMAGES (space-separated, each a distinct image of a few MiB, for garbage collection),
# and with REGISTRY_BIG_IMAGE_MIB=N in the environment BIG_IMAGE (an image of N MiB, for pull
# benchmarks).
# The images come from scripts/containerd-test-env.sh's busybox archive (`images`).
set -euo pipefail

BUSYBOX_BIN="/bin/busybox"
REGISTRY_USER="kubelet-sdk"
HERE="$(cd "$(dirname "$0")" && pwd)"

die() {
    echo "registry-test-env: $*" >&2
    exit 1
}

cmd_install() {
    local missing=()
    command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
    command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
    command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        die "missing ${missing[*]} and cannot install them (needs root and apt-get)"
    fi
    exec 9>"${TMPDIR:-/tmp}/kubelet-sdk-apt.lock"
    flock 9
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    # The package's service is not wanted: tests start their own registries.
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    flock -u 9
    exec 9>&-
}

# A free TCP port on 127.0.0.1.
free_port() {
    local port
    for _ in $(seq 1 100); do
        port=$(( (RANDOM % 20000) + 30000 ))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return 0
        fi
    done
    die "no free port"
}

# A CA and a server certificate for 127.0.0.1 (and localhost).
make_certs() {
    local dir=$1
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kubelet-sdk test registry CA" \
        -keyout "$dir/ca.key" -out "$dir/ca.crt" >/dev/null 2>&1
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
        -keyout "$dir/server.key" -out "$dir/server.csr" >/dev/null 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$dir/ext.cnf"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 2 -extfile "$dir/ext.cnf" -out "$dir/server.crt" >/dev/null 2>&1
}

# An OCI archive `name` of one layer of `mib` MiB of random data, so that
# each extra image has a size and blobs of its own.
extra_image() {
    local out=$1 name=$2 mib=$3 work
    work=$(mktemp -d)
    mkdir -p "$work/rootfs/data"
    head -c "$((mib * 1024 * 1024))" /dev/urandom >"$work/rootfs/data/blob"
    tar -C "$work/rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$work/layer.tar" .
    bash "$HERE/containerd-test-env.sh" build-image "$out" "$name" "$work/layer.tar" \
        '{"Env":["PATH=/bin"],"Cmd":["/bin/sh"],"WorkingDir":"/"}'
    rm -rf "$work"
}

cmd_start() {
    local env=${1:?usage: start ENVDIR CERTSD} certsd=${2:?usage: start ENVDIR CERTSD}
    cmd_install
    mkdir -p "$env"
    env=$(cd "$env" && pwd)
    [ -e "$env/registry.pid" ] && die "$env is already in use"
    mkdir -p "$env/storage" "$env/images"
    make_certs "$env"
    local password port host
    password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
    htpasswd -Bbn "$REGISTRY_USER" "$password" >"$env/htpasswd" 2>/dev/null
    port=$(free_port)
    host="127.0.0.1:$port"
    cat >"$env/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $env/storage
  delete:
    enabled: true
http:
  addr: $host
  tls:
    certificate: $env/server.crt
    key: $env/server.key
auth:
  htpasswd:
    realm: kubelet-sdk-test
    path: $env/htpasswd
EOF
    setsid docker-registry serve "$env/config.yml" >>"$env/registry.log" 2>&1 </dev/null &
    echo $! >"$env/registry.pid"
    local i
    for i in $(seq 1 100); do
        if curl -s -o /dev/null --cacert "$env/ca.crt" "https://$host/v2/"; then
            break
        fi
        kill -0 "$(cat "$env/registry.pid")" 2>/dev/null || { tail -20 "$env/registry.log" >&2; die "docker-registry exited during start"; }
        [ "$i" -lt 100 ] || die "docker-registry did not answer on $host within 10 s"
        sleep 0.1
    done
    # skopeo reads CA certificates (*.crt) from a directory.
    mkdir -p "$env/skopeo-certs"
    cp "$env/ca.crt" "$env/skopeo-certs/ca.crt"
    # The busybox archive of the containerd environment (built on demand).
    bash "$HERE/containerd-test-env.sh" images "$env/images" >/dev/null
    local push=(skopeo copy -q --dest-cert-dir "$env/skopeo-certs" --dest-creds "$REGISTRY_USER:$password")
    "${push[@]}" "oci-archive:$env/images/busybox.tar" "docker://$host/private/busybox:v1" >/dev/null
    local extras=() n
    for n in 1 2 3; do
        extra_image "$env/images/extra$n.tar" "$host/private/extra:v$n" "$((n + 1))"
        "${push[@]}" "oci-archive:$env/images/extra$n.tar" "docker://$host/private/extra:v$n" >/dev/null
        extras+=("$host/private/extra:v$n")
    done
    local big=""
    if [ -n "${REGISTRY_BIG_IMAGE_MIB:-}" ]; then
        extra_image "$env/images/big.tar" "$host/private/big:v1" "$REGISTRY_BIG_IMAGE_MIB"
        "${push[@]}" "oci-archive:$env/images/big.tar" "docker://$host/private/big:v1" >/dev/null
        big="$host/private/big:v1"
    fi
    rm -rf "$env/images"
    mkdir -p "$certsd/$host"
    cat >"$certsd/$host/hosts.toml" <<EOF
server = "https://$host"

[host."https://$host"]
  capabilities = ["pull", "resolve"]
  ca = "$env/ca.crt"
EOF
    {
        echo "REGISTRY=$host"
        echo "REGISTRY_USER=$REGISTRY_USER"
        echo "REGISTRY_PASSWORD=$password"
        echo "REGISTRY_CA=$env/ca.crt"
        echo "PRIVATE_IMAGE=$host/private/busybox:v1"
        echo "EXTRA_IMAGES=${extras[*]}"
        [ -z "$big" ] || echo "BIG_IMAGE=$big"
    } | tee "$env/env"
}

cmd_stop() {
    local env=${1:?usage: stop ENVDIR}
    [ -d "$env" ] || return 0
    local pid
    if pid=$(cat "$env/registry.pid" 2>/dev/null); then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -rf "$env"
}

case "${1:-}" in
install) cmd_install ;;
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
*) die "usage: $0 install | start ENVDIR CERTSD | stop ENVDIR" ;;
esac
