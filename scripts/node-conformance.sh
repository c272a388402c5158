#!/usr/bin/env bash
# The upstream node conformance specs ([NodeConformance] of Kubernetes 1.20.2's node e2e suite)
# against minimal_kubelet, or another agent, on containerd.
#
#   node-conformance.sh build         build what the run needs, once (cached): the node e2e test
#                                     binary, ginkgo and the test images' binaries (agnhost, nnp)
#                                     from Debian's kubernetes source package, and the images
#   node-conformance.sh run [OUTDIR]  run the selection: one line per spec, then the totals;
#                                     the JUnit report, the spec output and every component's log
#                                     go to OUTDIR (default ./target/node-conformance)
#   node-conformance.sh list          print the specs the selection holds (no agent needed)
#
# `run` needs root. It creates a network namespace and, inside it, starts etcd and a
# kube-apiserver (scripts/apiserver-test-env.sh, as a current cluster: service-account admission
# gives every pod a projected token volume) with a kube-controller-manager running the namespace,
# garbage collector and node lifecycle controllers (the last removes the not-ready taint the API
# server puts on a new node once it is Ready), a private containerd (scripts/containerd-test-env.sh) with
# the test images imported, the agent, and the test binary with `--start-services=false`. When it
# ends, whatever happened, it stops all of them and deletes the namespace, its mounts, the agent's
# pod cgroups, the pod logs it wrote in /var/log/pods and /var/log/containers (the specs read
# them there) and its working directory (kept only with KEEP=1).
#
# The agent is started as
#   AGENT_BIN --config CONFIG --kubeconfig KUBECONFIG --container-runtime-endpoint unix://SOCKET \
#             --node-ip 10.201.0.1 --hostname-override NODE --root-dir ROOT AGENT_ARGS...
# where CONFIG is a KubeletConfiguration (kubelet.config.k8s.io/v1beta1) naming staticPodPath,
# authentication (x509 client CA, webhook), authorization (Webhook), readOnlyPort 10255 (the
# kubelet's flag default, which the upstream runner keeps; the Summary API spec reads it) and
# the eviction thresholds the upstream node e2e runner gives the kubelet. An agent built from the
# SDK with `kubelet::config_file` and the kubelet's flags takes it as it is; point AGENT_BIN at a
# wrapper otherwise. The API server reaches the agent's port 10250 with a client certificate it may use
# for every kubelet API (bound to system:kubelet-api-admin).
#
# Environment:
#   AGENT_BIN           the agent (default: `cargo build --release -p minimal_kubelet`'s binary)
#   AGENT_ARGS          more arguments for it (word-split)
#   CONFORMANCE_FOCUS   ginkgo focus (default: \[NodeConformance\])
#   CONFORMANCE_SKIP    ginkgo skip (default: the Flaky, Slow, Serial, Disruptive and feature specs,
#                       and those that pull from the internet)
#   CONFORMANCE_NODES   specs run in parallel (default 4)
#   NODE_E2E_CACHE      where `build` keeps its results (default /var/cache/kubelet-sdk/node-e2e-1.20.2)
#   KEEP=1              keep the working directory (logs stay in OUTDIR anyway)
set -euo pipefail

KUBE_VERSION="1.20.2"
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE="${NODE_E2E_CACHE:-/var/cache/kubelet-sdk/node-e2e-$KUBE_VERSION}"
BUSYBOX_BIN="/bin/busybox"
NODE_NAME="conformance-node"
NODE_IP="10.201.0.1"

FOCUS_DEFAULT='\[NodeConformance\]'
# Pulls that need a registry on the internet succeed only with one; the specs that expect a pull
# to fail pass offline and stay in.
SKIP_DEFAULT='\[Flaky\]|\[Slow\]|\[Serial\]|\[Disruptive\]|\[Feature:[^]]+\]|\[NodeFeature:[^]]+\]|\[NodeAlphaFeature:[^]]+\]|should be able to pull image|should be able to pull from private registry with secret|should be able to pull from private registry with credential provider'

die() {
    echo "node-conformance: $*" >&2
    exit 1
}
log() { echo "node-conformance: $*" >&2; }

# The images the selected specs use, under the names the 1.20.2 suite gives them
# (test/utils/image/manifest.go). The docker library ones are stand-ins with the same behaviour
# the specs look at (see docs/conformance.md).
AGNHOST="k8s.gcr.io/e2e-test-images/agnhost:2.21"
BUSYBOX="docker.io/library/busybox:1.29"
NGINX="docker.io/library/nginx:1.14-alpine"
NGINX_NEW="docker.io/library/nginx:1.15-alpine"
HTTPD="docker.io/library/httpd:2.4.38-alpine"
HTTPD_NEW="docker.io/library/httpd:2.4.39-alpine"
NONEWPRIVS="gcr.io/kubernetes-e2e-test-images/nonewprivs:1.0"
NONROOT="gcr.io/kubernetes-e2e-test-images/nonroot:1.0"
PAUSE="k8s.gcr.io/pause:3.2"

binaries_ok() {
    [ -x "$CACHE/e2e_node.test" ] && [ -x "$CACHE/ginkgo" ] && [ -x "$CACHE/agnhost" ] && [ -x "$CACHE/nnp" ]
}

# Builds e2e_node.test, ginkgo, agnhost and nnp from Debian's kubernetes source package.
build_binaries() {
    binaries_ok && return 0
    "$HERE/apiserver-test-env.sh" install >/dev/null
    # What building from source needs (apiserver-test-env.sh installs it only while it has no
    # kube-apiserver binary of its own).
    local missing=()
    command -v go >/dev/null 2>&1 || missing+=(golang-go)
    command -v rsync >/dev/null 2>&1 || missing+=(rsync)
    command -v make >/dev/null 2>&1 || missing+=(make)
    command -v dpkg-source >/dev/null 2>&1 || missing+=(dpkg-dev)
    [ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || missing+=(golang-github-modern-go-reflect2-dev)
    [ -d /usr/share/gocode/src/github.com/json-iterator/go ] || missing+=(golang-github-json-iterator-go-dev)
    if [ "${#missing[@]}" -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends "${missing[@]}" >/dev/null || die "installing ${missing[*]} failed"
    fi
    local work
    work=$(mktemp -d "${KUBELET_SDK_BUILD_DIR:-/var/tmp}/kubelet-sdk-node-e2e-build.XXXXXX")
    # shellcheck disable=SC2064
    [ "${KUBELET_SDK_KEEP_BUILD:-0}" = 1 ] || trap "rm -rf '$work'" EXIT
    log "building the node e2e suite $KUBE_VERSION in $work (10-20 minutes)"
    local src
    src=$("$HERE/apiserver-test-env.sh" source-tree "$work")
    [ -d "$src/test/e2e_node" ] || die "no node e2e suite in $src"
    (
        cd "$src"
        export KUBE_GIT_VERSION="v$KUBE_VERSION" KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=debian
        export GOCACHE="$work/gocache" GOPATH="$work/gopath" GOFLAGS= GO111MODULE=off CGO_ENABLED=0
        make WHAT="test/e2e_node/e2e_node.test vendor/github.com/onsi/ginkgo/ginkgo test/images/agnhost test/images/nonewprivs" \
            >"$work/build.log" 2>&1
    ) || { tail -40 "$work/build.log" >&2; die "building the node e2e suite failed (log above)"; }
    mkdir -p "$CACHE"
    local name built
    for name in e2e_node.test ginkgo agnhost nonewprivs; do
        built=$(find "$src/_output" -type f -name "$name" -perm -u+x | head -1)
        [ -n "$built" ] || die "the build produced no $name"
        case $name in
        nonewprivs) cp "$built" "$CACHE/nnp.tmp" && mv -f "$CACHE/nnp.tmp" "$CACHE/nnp" ;;
        *) cp "$built" "$CACHE/$name.tmp" && mv -f "$CACHE/$name.tmp" "$CACHE/$name" ;;
        esac
    done
    # `run` replaces the EXIT trap with its own clean-up: the build tree goes now.
    if [ "${KUBELET_SDK_KEEP_BUILD:-0}" != 1 ]; then
        rm -rf "$work"
        trap - EXIT
    fi
}

# A busybox root filesystem in DIR (as containerd-test-env.sh builds its busybox image).
busybox_rootfs() {
    local root=$1 applet
    mkdir -p "$root"/{bin,dev,etc,proc,sys,tmp,var,root,usr/local/bin}
    chmod 1777 "$root/tmp"
    cp "$BUSYBOX_BIN" "$root/bin/busybox"
    for applet in $("$BUSYBOX_BIN" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
}

# image OUT.tar NAME ROOTFS CONFIG-JSON
image() {
    local out=$1 name=$2 root=$3 cfg=$4
    tar -C "$root" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out.layer" .
    "$HERE/containerd-test-env.sh" build-image "$out" "$name" "$out.layer" "$cfg"
    rm -f "$out.layer"
}

# Copies the program SRC to DEST in ROOT with the loader and libraries it links (from this host).
host_program_into() {
    local root=$1 src=$2 dest=$3 lib
    mkdir -p "$root$(dirname "$dest")"
    rm -f "$root$dest"
    cp "$src" "$root$dest"
    for lib in $(ldd "$src" | grep -o '/[^ ]*'); do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}

# Debian's netcat-openbsd as /usr/bin/nc in ROOT (the package is unpacked into the cache, never
# installed), and Debian's dash as /bin/sh: Debian's busybox shell runs its own applets before
# PATH, so its `nc` (no UDP) would win over /usr/bin/nc.
netcat_into() {
    local root=$1
    if [ ! -x "$CACHE/netcat/bin/nc.openbsd" ]; then
        local work
        work=$(mktemp -d "${TMPDIR:-/tmp}/kubelet-sdk-netcat.XXXXXX")
        (cd "$work" && apt-get download -qq netcat-openbsd >/dev/null 2>&1) ||
            { rm -rf "$work"; die "apt-get download netcat-openbsd failed"; }
        rm -rf "$CACHE/netcat"
        dpkg-deb -x "$work"/netcat-openbsd_*.deb "$CACHE/netcat"
        rm -rf "$work"
    fi
    host_program_into "$root" "$CACHE/netcat/bin/nc.openbsd" /usr/bin/nc
    host_program_into "$root" /bin/dash /bin/sh
}

images_key() {
    { sha256sum "$BUSYBOX_BIN" "$CACHE/agnhost" "$CACHE/nnp"; declare -f build_images busybox_rootfs image netcat_into host_program_into; } |
        sha256sum | cut -c1-16
}

# The images, as OCI archives in $CACHE/images (rebuilt when a binary or the recipe changes).
build_images() {
    local key
    key=$(images_key)
    [ -f "$CACHE/images/$key" ] && return 0
    [ -x "$BUSYBOX_BIN" ] || die "$BUSYBOX_BIN missing (install busybox-static)"
    local work
    work=$(mktemp -d "${TMPDIR:-/tmp}/kubelet-sdk-node-e2e-images.XXXXXX")
    local out="$work/out"
    mkdir -p "$out"
    local path='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'

    busybox_rootfs "$work/busybox"
    image "$out/busybox.tar" "$BUSYBOX" "$work/busybox" "{\"Env\":[$path],\"Cmd\":[\"sh\"]}"
    # The pause image: PID 1 that exits on SIGTERM/SIGINT.
    image "$out/pause.tar" "$PAUSE" "$work/busybox" \
        "{\"Env\":[$path],\"Entrypoint\":[\"/bin/sh\",\"-c\",\"trap 'exit 0' TERM INT; while :; do sleep 3600 & wait \$!; done\"]}"
    # agnhost: the binary built from the source tree on a busybox root (upstream: alpine).
    cp -a "$work/busybox" "$work/agnhost"
    cp "$CACHE/agnhost" "$work/agnhost/agnhost"
    ln -s agnhost "$work/agnhost/agnhost-2"
    mkdir -p "$work/agnhost/uploads" "$work/agnhost/usr/bin"
    # The specs call curl in agnhost containers (hooks, pod-to-pod checks); the upstream image
    # has alpine's. This one GETs or POSTs with busybox wget.
    cat >"$work/agnhost/usr/bin/curl" <<'CURL'
#!/bin/sh
url="" data="" post=""
while [ $# -gt 0 ]; do
    case $1 in
    -X) [ "$2" = POST ] && post=1; shift ;;
    -d | --data) data=$2; post=1; shift ;;
    -*) ;;
    *) url=$1 ;;
    esac
    shift
done
[ -n "$post" ] && exec wget -q -O - --post-data "$data" "$url"
exec wget -q -O - "$url"
CURL
    chmod 755 "$work/agnhost/usr/bin/curl"
    # And `nc -u` (busybox's nc has no UDP), from Debian's netcat-openbsd.
    netcat_into "$work/agnhost"
    image "$out/agnhost.tar" "$AGNHOST" "$work/agnhost" \
        "{\"Env\":[$path],\"Entrypoint\":[\"/agnhost\"],\"Cmd\":[\"pause\"],\"ExposedPorts\":{\"80/tcp\":{},\"8080/tcp\":{},\"8081/tcp\":{},\"9376/tcp\":{}}}"
    # nonewprivs: nnp setuid root, printing its effective uid.
    cp -a "$work/busybox" "$work/nnp"
    cp "$CACHE/nnp" "$work/nnp/usr/local/bin/nnp"
    chown 0:0 "$work/nnp/usr/local/bin/nnp"
    chmod 4755 "$work/nnp/usr/local/bin/nnp"
    image "$out/nonewprivs.tar" "$NONEWPRIVS" "$work/nnp" "{\"Env\":[$path],\"Cmd\":[\"nnp\"]}"
    # nonroot: busybox as user 1234.
    image "$out/nonroot.tar" "$NONROOT" "$work/busybox" "{\"Env\":[$path],\"Cmd\":[\"sh\"],\"User\":\"1234\"}"
    # Stand-ins for the docker library web servers: busybox httpd serving a page on port 80
    # in the foreground, as `nginx -g 'daemon off;'` and `httpd-foreground` do.
    cp -a "$work/busybox" "$work/web"
    mkdir -p "$work/web/usr/share/nginx/html" "$work/web/usr/local/apache2/htdocs"
    echo '<html><body>It works!</body></html>' >"$work/web/usr/share/nginx/html/index.html"
    cp "$work/web/usr/share/nginx/html/index.html" "$work/web/usr/local/apache2/htdocs/index.html"
    local name
    for name in "$NGINX" "$NGINX_NEW"; do
        image "$out/$(echo "$name" | tr '/:' '__').tar" "$name" "$work/web" \
            "{\"Env\":[$path],\"Cmd\":[\"httpd\",\"-f\",\"-p\",\"80\",\"-h\",\"/usr/share/nginx/html\"],\"ExposedPorts\":{\"80/tcp\":{}},\"StopSignal\":\"SIGQUIT\"}"
    done
    for name in "$HTTPD" "$HTTPD_NEW"; do
        image "$out/$(echo "$name" | tr '/:' '__').tar" "$name" "$work/web" \
            "{\"Env\":[$path],\"Cmd\":[\"httpd\",\"-f\",\"-p\",\"80\",\"-h\",\"/usr/local/apache2/htdocs\"],\"ExposedPorts\":{\"80/tcp\":{}},\"StopSignal\":\"SIGWINCH\"}"
    done
    rm -rf "$CACHE/images"
    mkdir -p "$CACHE"
    mv "$out" "$CACHE/images"
    touch "$CACHE/images/$key"
    rm -rf "$work"
}

cmd_build() {
    [ "$(id -u)" -eq 0 ] || die "needs root (apt-get)"
    "$HERE/containerd-test-env.sh" install
    build_binaries
    build_images
    echo "E2E_NODE_TEST=$CACHE/e2e_node.test"
    echo "GINKGO=$CACHE/ginkgo"
    echo "IMAGES=$CACHE/images"
}

focus() { echo "${CONFORMANCE_FOCUS:-$FOCUS_DEFAULT}"; }
skip() { echo "${CONFORMANCE_SKIP:-$SKIP_DEFAULT}"; }

cmd_list() {
    binaries_ok || die "run \`$0 build\` first"
    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/kubelet-sdk-node-conformance-list.XXXXXX")
    (cd "$dir" && "$CACHE/e2e_node.test" --ginkgo.dryRun --ginkgo.noColor --report-dir="$dir" \
        --ginkgo.focus="$(focus)" --ginkgo.skip="$(skip)" >/dev/null 2>&1) || { rm -rf "$dir"; die "the dry run failed"; }
    python3 - "$dir" <<'EOF2'
import glob, sys, xml.etree.ElementTree as ET
names = sorted({c.get("name", "") for p in glob.glob(sys.argv[1] + "/junit_*.xml")
                for c in ET.parse(p).getroot().iter("testcase") if c.find("skipped") is None})
print("\n".join(names))
print(f"total: {len(names)} specs")
EOF2
    rm -rf "$dir"
}

# --- run ---------------------------------------------------------------------------------------

NETNS=""
WORK=""
CNTR_ENV=""
API_ENV=""
AGENT_PID=""
TEST_PID=""

# Runs a command in the test's network namespace (mounts stay shared with the host, so the
# agent's volume mounts are the ones containerd sees). Background processes call nsenter
# themselves, so that $! is the process and not a subshell.
in_ns() { nsenter --net="/run/netns/$NETNS" -- "$@"; }

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    [ -n "$TEST_PID" ] && kill -TERM -- "-$TEST_PID" 2>/dev/null
    if [ -n "$AGENT_PID" ]; then
        kill -TERM "$AGENT_PID" 2>/dev/null
        local i
        for i in $(seq 1 100); do kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$AGENT_PID" 2>/dev/null
    fi
    [ -n "$CNTR_ENV" ] && [ -d "$CNTR_ENV" ] && in_ns "$HERE/containerd-test-env.sh" stop "$CNTR_ENV" >/dev/null 2>&1
    [ -n "$API_ENV" ] && [ -d "$API_ENV" ] && in_ns "$HERE/apiserver-test-env.sh" stop "$API_ENV" >/dev/null 2>&1
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        # Volumes the agent mounted (tmpfs, secrets, projected), deepest first.
        local m
        while read -r m; do
            umount -l "$m" 2>/dev/null
        done < <(awk -v w="$WORK" '{ gsub(/\\040/, " ", $5); if (index($5, w "/") == 1) print $5 }' /proc/self/mountinfo | sort -r)
        # The pod cgroups the agent made (cgroupfs driver, every hierarchy), leaves first.
        local cg
        for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
            [ -d "$cg" ] || continue
            find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
        done
        local dir entry
        for dir in pods containers; do
            [ -f "$WORK/var-log-$dir.before" ] || continue
            while read -r entry; do
                grep -qxF -- "$entry" "$WORK/var-log-$dir.before" || rm -rf -- "/var/log/$dir/${entry:?}"
            done < <(ls -A "/var/log/$dir")
            [ -f "$WORK/var-log-$dir.created" ] && rmdir "/var/log/$dir"
        done
        if [ "${KEEP:-0}" = 1 ]; then
            log "kept $WORK"
        else
            rm -rf "$WORK"
        fi
    fi
    [ -n "$NETNS" ] && ip netns del "$NETNS" 2>/dev/null
    exit "$rc"
}

wait_for() {
    local what=$1 seconds=$2
    shift 2
    local i
    for i in $(seq 1 $((seconds * 10))); do
        "$@" >/dev/null 2>&1 && return 0
        if [ -n "$AGENT_PID" ] && ! kill -0 "$AGENT_PID" 2>/dev/null; then
            tail -30 "$OUT/agent.log" >&2
            die "the agent exited while waiting for $what"
        fi
        sleep 0.1
    done
    die "no $what within $seconds s"
}

write_agent_config() {
    local ca=$1
    cat >"$WORK/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $WORK/manifests
fileCheckFrequency: 10s
readOnlyPort: 10255
volumeStatsAggPeriod: 10s
serializeImagePulls: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $ca
authorization:
  mode: Webhook
evictionPressureTransitionPeriod: 30s
evictionHard:
  memory.available: 250Mi
  nodefs.available: 10%
  nodefs.inodesFree: 5%
evictionMinimumReclaim:
  nodefs.available: 5%
  nodefs.inodesFree: 5%
EOF
}

cmd_run() {
    OUT=${1:-$REPO/target/node-conformance}
    [ "$(id -u)" -eq 0 ] || die "needs root"
    binaries_ok || cmd_build >/dev/null
    build_images
    local agent=${AGENT_BIN:-}
    if [ -z "$agent" ]; then
        log "building minimal_kubelet (release)"
        (cd "$REPO" && cargo build -q --release -p minimal_kubelet) || die "building minimal_kubelet failed"
        agent="${CARGO_TARGET_DIR:-$REPO/target}/release/minimal_kubelet"
    fi
    [ -x "$agent" ] || die "no agent at $agent"
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    rm -f "$OUT"/*.log "$OUT"/junit_*.xml "$OUT/summary.txt"

    trap cleanup EXIT
    trap 'exit 130' INT TERM
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/kubelet-sdk-node-conformance.XXXXXX")
    mkdir -p "$WORK/manifests" "$WORK/root"
    # The specs read the container logs at the kubelet's fixed paths (/var/log/pods,
    # /var/log/containers): what is there now stays, what the run adds is removed at the end.
    local dir
    for dir in pods containers; do
        [ -d "/var/log/$dir" ] || touch "$WORK/var-log-$dir.created"
        mkdir -p "/var/log/$dir"
        ls -A "/var/log/$dir" >"$WORK/var-log-$dir.before"
    done

    # The namespace: loopback and one veth pair, its first end the node's address.
    NETNS="ksdk-nc-$$"
    ip netns add "$NETNS"
    in_ns ip link set lo up
    # eth0: the Summary API spec expects the node's interface to be eth0 (or unnamed).
    in_ns ip link add eth0 type veth peer name eth1
    in_ns ip addr add "$NODE_IP/24" dev eth0
    in_ns ip link set eth0 up
    in_ns ip link set eth1 up
    in_ns ip route add default via "${NODE_IP%.*}.2" dev eth0 onlink

    log "starting containerd"
    CNTR_ENV="$WORK/containerd"
    in_ns "$HERE/containerd-test-env.sh" start "$CNTR_ENV" >/dev/null
    local sock tar sandbox_image
    sock=$(sed -n 's/^CONTAINERD_SOCKET=//p' "$CNTR_ENV/env")
    # containerd's sandbox_image: imported, never pullable. Named to the agent as kubeadm does,
    # so that the image GC keeps it when the disk fills up (containerd 1.6 does not report it
    # pinned).
    sandbox_image=$(sed -n 's/^PAUSE_IMAGE=//p' "$CNTR_ENV/env")
    for tar in "$CACHE"/images/*.tar; do
        in_ns ctr -a "$sock" -n k8s.io images import "$tar" >/dev/null
    done

    log "starting etcd, kube-apiserver and kube-controller-manager"
    API_ENV="$WORK/apiserver"
    KUBELET_SDK_SERVICE_ACCOUNTS=1 KUBELET_SDK_EXTRA_CONTROLLERS=namespace,garbagecollector,nodelifecycle \
        in_ns "$HERE/apiserver-test-env.sh" start "$API_ENV" "$NODE_NAME" >/dev/null
    local url token ca node_kubeconfig admin_kubeconfig kubectl
    url=$(sed -n 's/^APISERVER_URL=//p' "$API_ENV/env")
    token=$(sed -n 's/^ADMIN_TOKEN=//p' "$API_ENV/env")
    ca=$(sed -n 's/^CA_FILE=//p' "$API_ENV/env")
    node_kubeconfig=$(sed -n 's/^NODE_KUBECONFIG=//p' "$API_ENV/env")
    admin_kubeconfig=$(sed -n 's/^ADMIN_KUBECONFIG=//p' "$API_ENV/env")
    kubectl=$("$HERE/apiserver-test-env.sh" kubectl)
    in_ns "$kubectl" --kubeconfig "$admin_kubeconfig" create clusterrolebinding kube-apiserver-kubelet-client \
        --clusterrole=system:kubelet-api-admin --user=kube-apiserver-kubelet-client >/dev/null

    log "starting the agent ($agent)"
    write_agent_config "$ca"
    # shellcheck disable=SC2086
    nsenter --net="/run/netns/$NETNS" -- "$agent" --config "$WORK/kubelet-config.yaml" --kubeconfig "$node_kubeconfig" \
        --container-runtime-endpoint "unix://$sock" --node-ip "$NODE_IP" \
        --hostname-override "$NODE_NAME" --root-dir "$WORK/root" \
        --pod-infra-container-image "$sandbox_image" ${AGENT_ARGS:-} \
        >"$OUT/agent.log" 2>&1 </dev/null &
    AGENT_PID=$!
    wait_for "Ready node" 120 in_ns sh -c "'$kubectl' --kubeconfig '$admin_kubeconfig' get node '$NODE_NAME' \
        -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"

    cd "$WORK"
    log "running the specs ($(focus) minus $(skip)), ${CONFORMANCE_NODES:-4} at a time"
    local rc=0
    # setsid: the ginkgo processes in a group of their own that cleanup can stop.
    nsenter --net="/run/netns/$NETNS" -- setsid "$CACHE/ginkgo" -nodes="${CONFORMANCE_NODES:-4}" -noColor -succinct \
        -focus="$(focus)" -skip="$(skip)" "$CACHE/e2e_node.test" -- \
        --start-services=false --host="$url" --bearer-token="$token" --node-name="$NODE_NAME" \
        --prepull-images=false --container-runtime=remote \
        --container-runtime-endpoint="unix://$sock" --image-service-endpoint="unix://$sock" \
        --report-dir="$OUT" --report-prefix=node-conformance \
        >"$OUT/specs.log" 2>&1 </dev/null &
    TEST_PID=$!
    wait "$TEST_PID" || rc=$?
    TEST_PID=""
    cp "$API_ENV"/*.log "$OUT/" 2>/dev/null || true
    cp "$CNTR_ENV/containerd.log" "$OUT/" 2>/dev/null || true
    summarize "$OUT" | tee "$OUT/summary.txt"
    return "$rc"
}

# One line per spec from the JUnit reports (passed, failed, skipped), then the totals.
summarize() {
    local out=$1
    python3 - "$out" <<'EOF'
import glob, sys, xml.etree.ElementTree as ET
results = {}
for path in sorted(glob.glob(sys.argv[1] + "/junit_*.xml")):
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if case.find("skipped") is not None:
            state = results.get(name, "skipped")
        elif case.find("failure") is not None or case.find("error") is not None:
            state = "failed"
        else:
            state = "passed"
        if results.get(name) in (None, "skipped"):
            results[name] = state
        elif state == "failed":
            results[name] = "failed"
ran = {n: s for n, s in results.items() if s != "skipped" and not n.startswith("[BeforeSuite]") and not n.startswith("[AfterSuite]")}
for name in sorted(ran):
    print(f"{ran[name]:6}  {name}")
passed = sum(1 for s in ran.values() if s == "passed")
print(f"total: {len(ran)} specs, {passed} passed, {len(ran) - passed} failed")
suite = [n for n, s in results.items() if n.startswith("[") and "Suite]" in n and s == "failed"]
if suite:
    print("suite set-up failed: " + ", ".join(suite))
EOF
}

# The spec lists and the summary are read from the JUnit reports with python3.
case "${1:-}" in
list | run) command -v python3 >/dev/null 2>&1 || die "needs python3 (Debian package python3)" ;;
esac

case "${1:-}" in
build) cmd_build ;;
run) cmd_run "${2:-}" ;;
list) cmd_list ;;
*)
    sed -n '2,44p' "$0" >&2
    exit 2
    ;;
esac
