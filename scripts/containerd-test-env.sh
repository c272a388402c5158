#!/usr/bin/env bash
# A private containerd for the kubelet-cri tests and benchmarks.
#
#   containerd-test-env.sh install        install Debian's containerd, runc, CNI plugins and
#                                         busybox-static when missing (root + apt-get only),
#                                         and fetch containerd 1.7 (`fetch17`)
#   containerd-test-env.sh fetch17        unpack Debian trixie's containerd 1.7 package into
#                                         CONTAINERD17_DIR unless it is there; prints the path
#                                         of its containerd binary (not installed system-wide)
#   containerd-test-env.sh images DIR     build the pause and busybox OCI archives into DIR
#   containerd-test-env.sh build-image OUT.tar NAME LAYER.tar CONFIG-JSON
#                                         build a one-layer OCI archive (the `images` recipe)
#   containerd-test-env.sh start ENVDIR   start a containerd whose root, state, socket, CNI
#                                         config and logs all live under ENVDIR (created, must
#                                         not be in use), import the images, print its settings
#   containerd-test-env.sh start17 ENVDIR `start` with containerd 1.7 (`fetch17` first)
#   containerd-test-env.sh stop ENVDIR    stop that containerd and its shims, delete its pods'
#                                         network namespaces and bridge, unmount everything
#                                         under ENVDIR and remove ENVDIR
#
# `start` prints KEY=VALUE lines (also written to ENVDIR/env): CONTAINERD_SOCKET,
# CONTAINERD_PID, CONTAINERD_VERSION, PAUSE_IMAGE, BUSYBOX_IMAGE, POD_SUBNET, BRIDGE.
# No registry is needed: both images are built from /bin/busybox (busybox-static).
#
# Environment: CONTAINERD_ROOT_TMPFS (a size such as `256M`: `start` puts containerd's root on
# a tmpfs of that size, a small image filesystem), CONTAINERD_BIN (the containerd `start`
# runs, default the one on PATH; its directory goes first on the daemon's PATH so that it uses
# the shim and `ctr` next to it),
# CONTAINERD17_DIR (where `fetch17` unpacks containerd 1.7, default
# /var/cache/kubelet-sdk/containerd-1.7; a working binary there is never fetched again).
set -euo pipefail

PAUSE_IMAGE="localhost/kubelet-sdk/pause:test"
BUSYBOX_IMAGE="localhost/kubelet-sdk/busybox:test"
CNI_BIN_DIR="/usr/lib/cni"
BUSYBOX_BIN="/bin/busybox"
CONTAINERD17_DIR="${CONTAINERD17_DIR:-/var/cache/kubelet-sdk/containerd-1.7}"
# The Debian release whose containerd is 1.7 (its libc needs are met by bookworm's).
CONTAINERD17_SUITE="trixie"

die() {
    echo "containerd-test-env: $*" >&2
    exit 1
}

cmd_install() {
    local missing=()
    command -v containerd >/dev/null 2>&1 || missing+=(containerd)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    [ -x "$CNI_BIN_DIR/bridge" ] || missing+=(containernetworking-plugins)
    [ -x "$BUSYBOX_BIN" ] || missing+=(busybox-static)
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    command -v pgrep >/dev/null 2>&1 || missing+=(procps)
    # The DNS resolution test serves a zone with dnsmasq (the binary only: no system service).
    [ -x /usr/sbin/dnsmasq ] || missing+=(dnsmasq-base)
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        die "missing ${missing[*]} and cannot install them (needs root and apt-get)"
    fi
    # Tests start environments in parallel: one installer at a time (dpkg has one lock).
    exec 9>"${TMPDIR:-/tmp}/kubelet-sdk-apt.lock"
    flock 9
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    flock -u 9
    exec 9>&-
}

containerd17_bin() { echo "$CONTAINERD17_DIR/usr/bin/containerd"; }

containerd17_ok() {
    "$(containerd17_bin)" --version 2>/dev/null | grep -Eq ' v?1\.7\.'
}

# Downloads trixie's containerd package with a private apt configuration (its own source list,
# index and cache in a temporary directory: the host's sources and dpkg state are untouched;
# the archive is verified against Debian's keyring) and unpacks it into CONTAINERD17_DIR. The
# mirror is the one the host's apt sources use for Debian's main archive.
cmd_fetch17() {
    if ! containerd17_ok; then
        [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 ||
            die "no containerd 1.7 in $CONTAINERD17_DIR and cannot fetch it (needs root and apt-get)"
        mkdir -p "$(dirname "$CONTAINERD17_DIR")"
        # One fetch at a time; the second caller finds the first one's result.
        exec 8>"$CONTAINERD17_DIR.lock"
        flock 8
        containerd17_ok || fetch17_locked
        flock -u 8
        exec 8>&-
    fi
    containerd17_bin
}

fetch17_locked() {
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg mirror
    [ -f "$keyring" ] || die "$keyring missing (install debian-archive-keyring)"
    # The repository of the host's release suite itself (not -updates or -security), main.
    mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 'Created-By: Packages' |
        awk '$2 !~ /-/ && $3 == "main" { print $1; exit }')
    [ -n "$mirror" ] || die "no Debian main archive in the apt sources to fetch containerd 1.7 from"
    local work
    work=$(mktemp -d "${TMPDIR:-/tmp}/kubelet-sdk-containerd17.XXXXXX")
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb" "$work/root"
    echo "deb [signed-by=$keyring] $mirror $CONTAINERD17_SUITE main" >"$work/sources.list"
    local apt=(apt-get -qq
        -o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
        -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache"
        -o APT::Sandbox::User=root)
    "${apt[@]}" update >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; rm -rf "$work"; die "apt-get update ($CONTAINERD17_SUITE) failed"; }
    (cd "$work/deb" && "${apt[@]}" download containerd) >"$work/apt.log" 2>&1 ||
        { cat "$work/apt.log" >&2; rm -rf "$work"; die "apt-get download containerd ($CONTAINERD17_SUITE) failed"; }
    dpkg-deb -x "$work"/deb/containerd_*.deb "$work/root"
    "$work/root/usr/bin/containerd" --version 2>/dev/null | grep -Eq ' v?1\.7\.' ||
        { rm -rf "$work"; die "$CONTAINERD17_SUITE's containerd is not 1.7"; }
    rm -rf "$CONTAINERD17_DIR"
    mv "$work/root" "$CONTAINERD17_DIR"
    rm -rf "$work"
}

# sha256 of a file, hex.
sha() { sha256sum "$1" | cut -d' ' -f1; }

# Moves a file into an OCI blob store under its digest; prints "<digest> <size>".
put_blob() {
    local layout=$1 file=$2 d s
    d=$(sha "$file")
    s=$(stat -c %s "$file")
    mv "$file" "$layout/blobs/sha256/$d"
    echo "$d $s"
}

# build_image OUT.tar NAME LAYER.tar CONFIG-JSON-FRAGMENT
build_image() {
    local out=$1 name=$2 layer=$3 cfg=$4 work
    work=$(mktemp -d)
    local layout="$work/layout"
    mkdir -p "$layout/blobs/sha256"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
    local layer_d layer_s
    cp "$layer" "$work/layer.tar"
    read -r layer_d layer_s < <(put_blob "$layout" "$work/layer.tar")
    printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$cfg" "$layer_d" >"$work/config.json"
    local cfg_d cfg_s
    read -r cfg_d cfg_s < <(put_blob "$layout" "$work/config.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
        "$cfg_d" "$cfg_s" "$layer_d" "$layer_s" >"$work/manifest.json"
    local man_d man_s
    read -r man_d man_s < <(put_blob "$layout" "$work/manifest.json")
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"test"}}]}' \
        "$man_d" "$man_s" "$name" >"$layout/index.json"
    tar -C "$layout" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out.tmp" .
    mv "$out.tmp" "$out"
    rm -rf "$work"
}

cmd_images() {
    local dir=${1:?usage: images DIR}
    [ -x "$BUSYBOX_BIN" ] || die "$BUSYBOX_BIN missing (install busybox-static)"
    mkdir -p "$dir"
    local work
    work=$(mktemp -d)
    local rootfs="$work/rootfs"
    mkdir -p "$rootfs"/{bin,dev,etc,proc,sys,tmp,var,root}
    chmod 1777 "$rootfs/tmp"
    cp "$BUSYBOX_BIN" "$rootfs/bin/busybox"
    local applet
    for applet in $("$BUSYBOX_BIN" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
    tar -C "$rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$work/layer.tar" .
    build_image "$dir/busybox.tar" "$BUSYBOX_IMAGE" "$work/layer.tar" \
        '{"Env":["PATH=/bin"],"Cmd":["/bin/sh"],"WorkingDir":"/"}'
    # The pause image: PID 1 of the sandbox, exits on SIGTERM/SIGINT, otherwise sleeps.
    build_image "$dir/pause.tar" "$PAUSE_IMAGE" "$work/layer.tar" \
        '{"Env":["PATH=/bin"],"Entrypoint":["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"],"WorkingDir":"/"}'
    rm -rf "$work"
}

write_config() {
    local env=$1 subnet=$2 bridge=$3
    mkdir -p "$env/root" "$env/state" "$env/opt" "$env/cni/net.d" "$env/cni/ipam"
    cat >"$env/cni/net.d/10-kubelet-sdk.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kubelet-sdk-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$env/cni/ipam",
        "ranges": [[{"subnet": "$subnet"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
    cat >"$env/config.toml" <<EOF
version = 2
root = "$env/root"
state = "$env/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$env/containerd.sock"

[ttrpc]
  address = "$env/containerd.sock.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$env/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$env/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    # Per-registry settings (the test registry's CA: scripts/registry-test-env.sh).
    config_path = "$env/certs.d"
EOF
}

# ctr ARGS... against ENVDIR's containerd: the ctr next to its binary, else the one on PATH.
ctr_of() {
    local env=$1 ctr
    shift
    ctr="$(dirname "$(cat "$env/containerd.bin")")/ctr"
    [ -x "$ctr" ] || ctr=ctr
    "$ctr" -a "$env/containerd.sock" "$@"
}

# Starts (or restarts) the containerd of an existing ENVDIR and waits for its socket.
launch() {
    local env=$1
    rm -f "$env/containerd.sock" "$env/containerd.sock.ttrpc"
    # The binary `start` chose; its directory first on PATH, for its shim and ctr.
    local bin
    bin=$(cat "$env/containerd.bin")
    # setsid: the daemon must not share the caller's process group or terminal signals.
    PATH="$(dirname "$bin"):$PATH" setsid "$bin" --config "$env/config.toml" >>"$env/containerd.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$env/containerd.pid"
    local i
    for i in $(seq 1 300); do
        if [ -S "$env/containerd.sock" ] && ctr_of "$env" version >/dev/null 2>&1; then
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || { tail -20 "$env/containerd.log" >&2; die "containerd exited during start"; }
        sleep 0.1
    done
    tail -20 "$env/containerd.log" >&2
    die "containerd did not open $env/containerd.sock within 30 s"
}

cmd_start() {
    local env=${1:?usage: start ENVDIR}
    [ "$(id -u)" -eq 0 ] || die "needs root"
    cmd_install
    mkdir -p "$env"
    env=$(cd "$env" && pwd)
    [ -e "$env/containerd.pid" ] && die "$env is already in use"
    local bin version
    bin=$(command -v "${CONTAINERD_BIN:-containerd}") || die "no containerd ${CONTAINERD_BIN:-on PATH}"
    version=$("$bin" --version | awk '{ sub(/^v/, "", $3); sub(/~.*/, "", $3); print $3 }')
    echo "$bin" >"$env/containerd.bin"
    # One /24 and one bridge per environment, so that environments can run side by side.
    local slot tries=0
    while :; do
        slot=$(( (RANDOM + $$) % 250 + 1 ))
        ip link show "ksdk$slot" >/dev/null 2>&1 || break
        tries=$((tries + 1))
        [ "$tries" -lt 50 ] || die "no free bridge name"
    done
    local subnet="10.123.$slot.0/24" bridge="ksdk$slot"
    write_config "$env" "$subnet" "$bridge"
    # A small image filesystem of its own when asked (disk pressure tests): containerd's root,
    # content store and snapshots on a tmpfs of that size.
    if [ -n "${CONTAINERD_ROOT_TMPFS:-}" ]; then
        mount -t tmpfs -o "size=$CONTAINERD_ROOT_TMPFS" ksdk-containerd-root "$env/root"
    fi
    # Images are deterministic; one cache per busybox binary, image names and this script's
    # image recipe is shared by all environments.
    local key
    key=$( { sha "$BUSYBOX_BIN"; echo "$PAUSE_IMAGE $BUSYBOX_IMAGE"; declare -f cmd_images build_image; } | sha256sum | cut -c1-16)
    local cache="${TMPDIR:-/tmp}/kubelet-sdk-images-$key"
    if [ ! -f "$cache/pause.tar" ] || [ ! -f "$cache/busybox.tar" ]; then
        local tmpcache
        tmpcache=$(mktemp -d "${TMPDIR:-/tmp}/kubelet-sdk-images.XXXXXX")
        cmd_images "$tmpcache"
        mkdir -p "$cache"
        mv -f "$tmpcache/pause.tar" "$tmpcache/busybox.tar" "$cache/"
        rmdir "$tmpcache"
    fi
    launch "$env"
    ctr_of "$env" -n k8s.io images import "$cache/pause.tar" >/dev/null
    ctr_of "$env" -n k8s.io images import "$cache/busybox.tar" >/dev/null
    {
        echo "CONTAINERD_SOCKET=$env/containerd.sock"
        echo "CONTAINERD_PID=$(cat "$env/containerd.pid")"
        echo "CONTAINERD_VERSION=$version"
        echo "PAUSE_IMAGE=$PAUSE_IMAGE"
        echo "BUSYBOX_IMAGE=$BUSYBOX_IMAGE"
        echo "POD_SUBNET=$subnet"
        echo "BRIDGE=$bridge"
    } | tee "$env/env"
}

# Kills containerd only (shims and containers keep running), as a crash would.
cmd_kill() {
    local env=${1:?usage: kill ENVDIR}
    local pid
    pid=$(cat "$env/containerd.pid" 2>/dev/null) || die "no containerd.pid in $env"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}

# Starts containerd again on the same ENVDIR (after `kill`).
cmd_restart() {
    local env=${1:?usage: restart ENVDIR}
    env=$(cd "$env" && pwd)
    launch "$env"
}

cmd_stop() {
    local env=${1:?usage: stop ENVDIR}
    [ -d "$env" ] || return 0
    env=$(cd "$env" && pwd)
    local sock="$env/containerd.sock"
    # The containers this containerd ran (their cgroups are removed at the end).
    local ids=()
    local state_dir
    for state_dir in "$env"/state/io.containerd.runtime.v2.task/*/*; do
        [ -d "$state_dir" ] && ids+=("$(basename "$state_dir")")
    done
    # containerd itself.
    local pid
    if pid=$(cat "$env/containerd.pid" 2>/dev/null); then
        kill -TERM "$pid" 2>/dev/null || true
        local i
        for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    # Its shims (they carry the socket address on their command line) and their containers.
    local p
    for p in $(pgrep -f -- "containerd-shim-runc-v2 .*-address $sock( |\$)" || true); do
        local kids
        kids=$(pgrep -P "$p" || true)
        kill -KILL "$p" $kids 2>/dev/null || true
    done
    # Container processes left without a shim: every process in a cgroup under our runc root.
    for state_dir in "$env"/state/io.containerd.runtime.v2.task/*/*; do
        [ -d "$state_dir" ] || continue
        local cpid
        cpid=$(cat "$state_dir/init.pid" 2>/dev/null || true)
        [ -n "$cpid" ] && kill -KILL "$cpid" 2>/dev/null || true
    done
    sleep 0.2
    # Network namespaces (netns_mounts_under_state_dir puts them under state/netns).
    local ns
    for ns in "$env"/state/netns/*; do
        [ -e "$ns" ] || continue
        umount -l "$ns" 2>/dev/null || true
    done
    # Every mount under ENVDIR, deepest first.
    local m
    while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done < <(awk -v e="$env" '{ gsub(/\\040/, " ", $5); if (index($5, e "/") == 1) print $5 }' /proc/self/mountinfo | sort -r)
    # The bridge.
    if [ -f "$env/env" ]; then
        local bridge
        bridge=$(sed -n 's/^BRIDGE=//p' "$env/env")
        [ -n "$bridge" ] && ip link del "$bridge" 2>/dev/null || true
    fi
    # Cgroups runc left behind for those containers (cgroupfs driver, v1 or v2 layouts).
    local id cg
    for id in "${ids[@]}"; do
        for cg in /sys/fs/cgroup/*/k8s.io/"$id" /sys/fs/cgroup/k8s.io/"$id" /sys/fs/cgroup/*/*/"$id"; do
            [ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true
        done
    done
    # containerd's parent cgroup, once no containerd at all runs (it may serve another env).
    if ! pgrep -x containerd >/dev/null 2>&1; then
        for cg in /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/k8s.io; do
            [ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true
        done
    fi
    rm -rf "$env"
}

case "${1:-}" in
install) cmd_install && cmd_fetch17 >/dev/null ;;
fetch17) cmd_fetch17 ;;
images) cmd_images "${2:-}" ;;
build-image) build_image "${2:?OUT.tar}" "${3:?NAME}" "${4:?LAYER.tar}" "${5:?CONFIG-JSON}" ;;
start) cmd_start "${2:-}" ;;
start17)
    CONTAINERD_BIN=$(cmd_fetch17)
    cmd_start "${2:-}"
    ;;
stop) cmd_stop "${2:-}" ;;
kill) cmd_kill "${2:-}" ;;
restart) cmd_restart "${2:-}" ;;
*)
    sed -n '2,32p' "$0" >&2
    exit 2
    ;;
esac
