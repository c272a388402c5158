#!/usr/bin/env bash
# A private containerd for the kubelet-cri tests and benchmarks.
#
#   containerd-test-env.sh install        install Debian's containerd, runc, CNI plugins and
#                                         busybox-static when missing (root + apt-get only)
#   containerd-test-env.sh images DIR     build the pause and busybox OCI archives into DIR
#   containerd-test-env.sh start ENVDIR   start a containerd whose root, state, socket, CNI
#                                         config and logs all live under ENVDIR (created, must
#                                         not be in use), import the images, print its settings
#   containerd-test-env.sh stop ENVDIR    stop that containerd and its shims, delete its pods'
#                                         network namespaces and bridge, unmount everything
#                                         under ENVDIR and remove ENVDIR
#
# `start` prints KEY=VALUE lines (also written to ENVDIR/env): CONTAINERD_SOCKET,
# CONTAINERD_PID, PAUSE_IMAGE, BUSYBOX_IMAGE, POD_SUBNET, BRIDGE.
# No registry is needed: both images are built from /bin/busybox (busybox-static).
set -euo pipefail

PAUSE_IMAGE="localhost/kubelet-sdk/pause:test"
BUSYBOX_IMAGE="localhost/kubelet-sdk/busybox:test"
CNI_BIN_DIR="/usr/lib/cni"
BUSYBOX_BIN="/bin/busybox"

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
EOF
}

# Starts (or restarts) the containerd of an existing ENVDIR and waits for its socket.
launch() {
    local env=$1
    rm -f "$env/containerd.sock" "$env/containerd.sock.ttrpc"
    # setsid: the daemon must not share the caller's process group or terminal signals.
    setsid containerd --config "$env/config.toml" >>"$env/containerd.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$env/containerd.pid"
    local i
    for i in $(seq 1 300); do
        if [ -S "$env/containerd.sock" ] && ctr -a "$env/containerd.sock" version >/dev/null 2>&1; then
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
    ctr -a "$env/containerd.sock" -n k8s.io images import "$cache/pause.tar" >/dev/null
    ctr -a "$env/containerd.sock" -n k8s.io images import "$cache/busybox.tar" >/dev/null
    {
        echo "CONTAINERD_SOCKET=$env/containerd.sock"
        echo "CONTAINERD_PID=$(cat "$env/containerd.pid")"
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
install) cmd_install ;;
images) cmd_images "${2:-}" ;;
start) cmd_start "${2:-}" ;;
stop) cmd_stop "${2:-}" ;;
kill) cmd_kill "${2:-}" ;;
restart) cmd_restart "${2:-}" ;;
*)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
