#!/usr/bin/env bash
# A private kube-apiserver (with its own etcd) for the kubelet-apiserver tests and benchmarks.
#
#   apiserver-test-env.sh install              install Debian's etcd-server, golang-go, openssl,
#                                              curl, rsync, jq and build kube-apiserver and
#                                              kube-controller-manager 1.20.2 from Debian's
#                                              kubernetes source package, once: the binaries are
#                                              cached (root + apt-get only)
#   apiserver-test-env.sh start ENVDIR [NODE]  start an etcd and a kube-apiserver whose data,
#                                              certificates, kubeconfigs and logs all live under
#                                              ENVDIR (created, must not be in use), on free ports
#                                              of 127.0.0.1; print its settings
#   apiserver-test-env.sh stop-apiserver ENVDIR   stop the API server only (etcd keeps the data)
#   apiserver-test-env.sh start-apiserver ENVDIR  start it again, same port, same etcd
#   apiserver-test-env.sh stop ENVDIR          stop both and remove ENVDIR
#   apiserver-test-env.sh source-tree WORKDIR  unpack Debian's kubernetes source package into
#                                              WORKDIR, patched to build with Debian's Go, and
#                                              print the tree's path (`install` builds from it)
#   apiserver-test-env.sh kubectl              print the path of Debian's kubectl (package
#                                              kubernetes-client), unpacked once into the cache
#                                              without installing the package (root + apt-get)
#
# `start` prints KEY=VALUE lines (also written to ENVDIR/env): APISERVER_URL, ADMIN_KUBECONFIG,
# NODE_KUBECONFIG, NODE_NAME, APISERVER_PID, ETCD_PID, ETCD_URL, CA_FILE, ADMIN_TOKEN, AUDIT_LOG.
# The API server reaches kubelets at their InternalIP (then Hostname) with a client certificate
# for kube-apiserver-kubelet-client (no groups; bind it to system:kubelet-api-admin to let it in),
# issued by CA_FILE, and does not verify the kubelets' serving certificates.
# The node credentials are an x509 client certificate for system:node:NODE (group system:nodes),
# so the Node authorizer and NodeRestriction apply as in a real cluster; NODE defaults to $NODE_NAME
# or kubelet-sdk-node. The admin credentials are in system:masters.
#
# Environment: KUBE_APISERVER_BIN and KUBE_CONTROLLER_MANAGER_BIN (the cached binaries, default
# /var/cache/kubelet-sdk/kube-{apiserver,controller-manager}-1.20.2; working binaries there are
# never rebuilt), KUBELET_SDK_ENV_OWNER_PID (start: stop the environment when that process is
# gone), KUBELET_SDK_SERVICE_ACCOUNTS=1 (start: behave as a Kubernetes >= 1.21 cluster does for
# service accounts, see below).
# No scheduler runs: pods need spec.nodeName. By default no controller-manager runs either and
# the ServiceAccount admission plugin is off, as in Kubernetes 1.20 it would wait for legacy
# token Secrets. With KUBELET_SDK_SERVICE_ACCOUNTS=1 the environment is what a current cluster
# gives every pod: the gate BoundServiceAccountTokenVolume is on (alpha in 1.20, on from 1.21)
# and ServiceAccount admission gives every pod a projected `kube-api-access-*` volume (a
# TokenRequest token, `kube-root-ca.crt` and the namespace); a kube-controller-manager runs the
# `serviceaccount` controller (the `default` ServiceAccount of every namespace) and the
# `root-ca-cert-publisher` (the `kube-root-ca.crt` ConfigMap of every namespace).
# KUBELET_SDK_BOOTSTRAP=1 (start; implies the above) makes the environment a kubeadm cluster a
# node joins with a bootstrap token: bootstrap-token authentication, the controller-manager's
# CSR approver, signer (the CA of CA_FILE; certificates valid for KUBELET_SDK_SIGNING_DURATION,
# default 8760h) and cleaners, kubeadm's bindings, and BOOTSTRAP_KUBECONFIG / BOOTSTRAP_TOKEN
# in the settings. KUBELET_SDK_EXTRA_CONTROLLERS (start; a comma-separated list such as
# `namespace,garbagecollector`; implies KUBELET_SDK_SERVICE_ACCOUNTS=1) runs these
# controller-manager controllers too.
set -euo pipefail

KUBE_VERSION="1.20.2"
KUBE_APISERVER_BIN="${KUBE_APISERVER_BIN:-/var/cache/kubelet-sdk/kube-apiserver-$KUBE_VERSION}"
KUBE_CONTROLLER_MANAGER_BIN="${KUBE_CONTROLLER_MANAGER_BIN:-/var/cache/kubelet-sdk/kube-controller-manager-$KUBE_VERSION}"
GOCODE="/usr/share/gocode/src"
PORT_CLAIMS="${TMPDIR:-/tmp}/kubelet-sdk-apiserver-ports-$(id -u)"

die() {
    echo "apiserver-test-env: $*" >&2
    exit 1
}

# A binary is usable when it runs and reports the expected version.
bin_ok() {
    [ -x "$1" ] && "$1" --version 2>/dev/null | grep -q "v$KUBE_VERSION"
}
binary_ok() {
    bin_ok "$KUBE_APISERVER_BIN" && bin_ok "$KUBE_CONTROLLER_MANAGER_BIN"
}

# Adds deb-src entries for every bookworm* deb entry when apt has no bookworm deb-src at all.
# Handles both formats: one-line (sources.list, *.list) and deb822 (*.sources).
ensure_deb_src() {
    local f
    local lists=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list)
    local srcs=(/etc/apt/sources.list.d/*.sources)
    for f in "${lists[@]}"; do
        [ -f "$f" ] && grep -Eq '^[[:space:]]*deb-src[[:space:]].*[[:space:]]bookworm[[:space:]]' "$f" && return 0
    done
    for f in "${srcs[@]}"; do
        [ -f "$f" ] || continue
        # A paragraph with deb-src among its Types and bookworm among its Suites.
        awk 'BEGIN { RS = ""; IGNORECASE = 1 }
             /(^|\n)Types:[^\n]*deb-src/ && /(^|\n)Suites:[^\n]*[ \t]bookworm([ \t]|\n|$)/ \
             && !/(^|\n)Enabled:[ \t]*no/ { found = 1 }
             END { exit !found }' "$f" && return 0
    done
    local out=/etc/apt/sources.list.d/kubelet-sdk-deb-src
    for f in "${lists[@]}"; do
        [ -f "$f" ] || continue
        sed -nE 's/^[[:space:]]*deb([[:space:]].*[[:space:]]bookworm[[:space:]].*)$/deb-src\1/p' "$f"
    done >"$out.list"
    [ -s "$out.list" ] || rm -f "$out.list"
    for f in "${srcs[@]}"; do
        [ -f "$f" ] || continue
        [ "$f" = "$out.sources" ] && continue
        # Copy each bookworm paragraph with Types: deb, as Types: deb-src.
        awk 'BEGIN { RS = ""; ORS = "\n\n" }
             {
                 if ($0 !~ /(^|\n)Types:[^\n]*deb/) next
                 if ($0 !~ /(^|\n)Suites:[^\n]*[ \t]bookworm([ \t-]|\n|$)/) next
                 if ($0 ~ /(^|\n)Enabled:[ \t]*no/) next
                 n = split($0, lines, "\n"); para = ""
                 for (i = 1; i <= n; i++) {
                     l = lines[i]
                     if (l ~ /^#/) continue
                     if (l ~ /^Types:/) l = "Types: deb-src"
                     para = para l "\n"
                 }
                 printf "%s\n", para
             }' "$f"
    done >"$out.sources"
    [ -s "$out.sources" ] || rm -f "$out.sources"
    [ -f "$out.list" ] || [ -f "$out.sources" ] || die "no bookworm entry in the apt sources to derive deb-src from"
}

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >/dev/null
}

# Unpacks Debian's kubernetes source package into WORK, patched to build with this Go, and
# prints the tree's path.
source_tree() {
    local work=$1
    (cd "$work" && apt-get source -qq kubernetes >/dev/null 2>"$work/source.log") ||
        { tail -20 "$work/source.log" >&2; die "apt-get source kubernetes failed"; }
    local src
    src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
    [ -n "$src" ] && [ -f "$src/build/root/Makefile" -o -f "$src/Makefile" ] || die "no kubernetes source tree in $work"
    # reflect2 1.0.1 (vendored) crashes on Go >= 1.18; json-iterator follows reflect2's API.
    local pkg
    for pkg in github.com/modern-go/reflect2 github.com/json-iterator/go; do
        [ -d "$GOCODE/$pkg" ] || die "$GOCODE/$pkg missing"
        rm -rf "${src:?}/vendor/$pkg"
        mkdir -p "$src/vendor/$pkg"
        rsync -a --exclude '*_test.go' --exclude '.git*' "$GOCODE/$pkg/" "$src/vendor/$pkg/"
    done
    echo "$src"
}

# Builds the missing ones of kube-apiserver and kube-controller-manager from Debian's kubernetes
# source package into $KUBE_APISERVER_BIN and $KUBE_CONTROLLER_MANAGER_BIN.
build_binaries() {
    local what=() names=()
    bin_ok "$KUBE_APISERVER_BIN" || { what+=(cmd/kube-apiserver); names+=(kube-apiserver); }
    bin_ok "$KUBE_CONTROLLER_MANAGER_BIN" || { what+=(cmd/kube-controller-manager); names+=(kube-controller-manager); }
    [ "${#what[@]}" -gt 0 ] || return 0
    local work
    work=$(mktemp -d "${KUBELET_SDK_BUILD_DIR:-/var/tmp}/kubelet-sdk-apiserver-build.XXXXXX")
    # shellcheck disable=SC2064
    [ "${KUBELET_SDK_KEEP_BUILD:-0}" = 1 ] || trap "rm -rf '$work'" EXIT
    echo "apiserver-test-env: building ${names[*]} $KUBE_VERSION in $work (a few minutes)" >&2
    local src
    src=$(source_tree "$work")
    # No git metadata in a source package: give the build its version.
    (
        cd "$src"
        export KUBE_GIT_VERSION="v$KUBE_VERSION" KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=debian
        export GOCACHE="$work/gocache" GOPATH="$work/gopath" GOFLAGS= GO111MODULE=off
        make WHAT="${what[*]}" >"$work/build.log" 2>&1
    ) || { tail -40 "$work/build.log" >&2; die "make WHAT=${what[*]} failed (log above)"; }
    local name built dest
    for name in "${names[@]}"; do
        built=$(find "$src/_output" -type f -name "$name" -perm -u+x | head -1)
        [ -n "$built" ] || die "the build produced no $name"
        case $name in
        kube-apiserver) dest=$KUBE_APISERVER_BIN ;;
        *) dest=$KUBE_CONTROLLER_MANAGER_BIN ;;
        esac
        mkdir -p "$(dirname "$dest")"
        cp "$built" "$dest.tmp"
        mv -f "$dest.tmp" "$dest"
    done
}

cmd_install() {
    local missing=()
    command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    command -v curl >/dev/null 2>&1 || missing+=(curl ca-certificates)
    if ! binary_ok; then
        command -v go >/dev/null 2>&1 || missing+=(golang-go)
        command -v rsync >/dev/null 2>&1 || missing+=(rsync)
        command -v jq >/dev/null 2>&1 || missing+=(jq)
        command -v make >/dev/null 2>&1 || missing+=(make)
        command -v dpkg-source >/dev/null 2>&1 || missing+=(dpkg-dev)
        [ -d "$GOCODE/github.com/modern-go/reflect2" ] || missing+=(golang-github-modern-go-reflect2-dev)
        [ -d "$GOCODE/github.com/json-iterator/go" ] || missing+=(golang-github-json-iterator-go-dev)
    fi
    if [ "${#missing[@]}" -eq 0 ] && binary_ok; then
        echo "KUBE_APISERVER_BIN=$KUBE_APISERVER_BIN"
        echo "KUBE_CONTROLLER_MANAGER_BIN=$KUBE_CONTROLLER_MANAGER_BIN"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        binary_ok || die "no kube-apiserver at $KUBE_APISERVER_BIN or kube-controller-manager at $KUBE_CONTROLLER_MANAGER_BIN, and cannot build them (needs root and apt-get)"
        die "missing ${missing[*]} and cannot install them (needs root and apt-get)"
    fi
    # Tests start environments in parallel: one installer at a time (the lock is per binary, so
    # the second caller finds the first one's build), and one apt-get at a time across scripts.
    mkdir -p "$(dirname "$KUBE_APISERVER_BIN")"
    exec 8>"$KUBE_APISERVER_BIN.lock"
    flock 8
    exec 9>"${TMPDIR:-/tmp}/kubelet-sdk-apt.lock"
    flock 9
    ensure_deb_src
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    if [ "${#missing[@]}" -gt 0 ]; then
        apt_install "${missing[@]}"
    fi
    flock -u 9
    exec 9>&-
    if ! binary_ok; then
        build_binaries
        bin_ok "$KUBE_APISERVER_BIN" || die "the built $KUBE_APISERVER_BIN does not run"
        bin_ok "$KUBE_CONTROLLER_MANAGER_BIN" || die "the built $KUBE_CONTROLLER_MANAGER_BIN does not run"
    fi
    flock -u 8
    exec 8>&-
    echo "KUBE_APISERVER_BIN=$KUBE_APISERVER_BIN"
    echo "KUBE_CONTROLLER_MANAGER_BIN=$KUBE_CONTROLLER_MANAGER_BIN"
}

# True when something listens on TCP port $1 (IPv4 or IPv6).
port_listening() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v h="$hex" 'FNR > 1 { split($2, a, ":"); if (a[length(a)] == h && $4 == "0A") f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Claims a free port for ENVDIR and prints it. Claims are files under $PORT_CLAIMS naming their
# environment, so that environments starting side by side never pick the same port; a claim whose
# environment is gone is stale. Below the kernel's ephemeral range, so no client takes it.
claim_port() {
    local env=$1 port tries=0 owner
    mkdir -p "$PORT_CLAIMS"
    exec 7>"$PORT_CLAIMS.lock"
    flock 7
    while :; do
        tries=$((tries + 1))
        [ "$tries" -lt 500 ] || die "no free port"
        port=$(( 20000 + (RANDOM * 32768 + RANDOM) % 12000 ))
        if owner=$(cat "$PORT_CLAIMS/$port" 2>/dev/null) && [ -d "$owner" ]; then
            continue
        fi
        port_listening "$port" && continue
        echo "$env" >"$PORT_CLAIMS/$port"
        break
    done
    flock -u 7
    exec 7>&-
    echo "$port"
}

release_ports() {
    local env=$1 f
    for f in "$PORT_CLAIMS"/*; do
        [ -f "$f" ] && [ "$(cat "$f" 2>/dev/null)" = "$env" ] && rm -f "$f"
    done
    return 0
}

OPENSSL_CNF='[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
'

new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# issue DIR NAME SUBJECT EXTENSIONS: a key and a certificate signed by DIR/ca.
issue() {
    local dir=$1 name=$2 subj=$3 ext=$4
    new_key "$dir/$name.key"
    openssl req -new -config "$dir/openssl.cnf" -key "$dir/$name.key" -subj "$subj" -out "$dir/$name.csr"
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
        -set_serial "0x$(openssl rand -hex 12)" -days 3650 -extfile "$dir/openssl.cnf" \
        -extensions "$ext" -out "$dir/$name.crt" 2>/dev/null
    rm -f "$dir/$name.csr"
}

b64() { base64 -w0 <"$1"; }

# kubeconfig OUT URL PKI NAME: a kubeconfig with NAME's client certificate and the CA embedded.
kubeconfig() {
    local out=$1 url=$2 pki=$3 name=$4
    cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kubelet-sdk-test
  cluster:
    server: $url
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(b64 "$pki/$name.crt")
    client-key-data: $(b64 "$pki/$name.key")
contexts:
- name: kubelet-sdk-test
  context:
    cluster: kubelet-sdk-test
    user: $name
current-context: kubelet-sdk-test
EOF
    chmod 600 "$out"
}

# The pid in FILE, if that process still runs with ENVDIR on its command line (not a reused pid).
live_pid() {
    local file=$1 env=$2 pid
    pid=$(cat "$file" 2>/dev/null) || return 1
    [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$env/" || return 1
    echo "$pid"
}

# Stops the process of pid file FILE (TERM, then KILL after 10 s) and waits until it is gone.
stop_pid() {
    local file=$1 env=$2 pid i
    if pid=$(live_pid "$file" "$env"); then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    fi
    rm -f "$file"
}

launch_etcd() {
    local env=$1
    local client_port peer_port
    client_port=$(sed -n 's/^ETCD_URL=http:\/\/127.0.0.1://p' "$env/ports")
    peer_port=$(sed -n 's/^ETCD_PEER_PORT=//p' "$env/ports")
    setsid etcd --name kubelet-sdk --data-dir "$env/etcd" \
        --listen-client-urls "http://127.0.0.1:$client_port" \
        --advertise-client-urls "http://127.0.0.1:$client_port" \
        --listen-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-cluster "kubelet-sdk=http://127.0.0.1:$peer_port" \
        --initial-cluster-state new --log-level warn \
        >>"$env/etcd.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$env/etcd.pid"
    local i
    for i in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$client_port/health" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || { tail -20 "$env/etcd.log" >&2; die "etcd exited during start"; }
        sleep 0.1
    done
    tail -20 "$env/etcd.log" >&2
    die "etcd did not answer within 30 s"
}

# Starts (or restarts) the API server of an existing ENVDIR and waits until /readyz is ok.
launch_apiserver() {
    local env=$1 url
    url=$(sed -n 's/^APISERVER_URL=//p' "$env/ports")
    local args=()
    mapfile -t args <"$env/apiserver.args"
    setsid "$KUBE_APISERVER_BIN" "${args[@]}" >>"$env/apiserver.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$env/apiserver.pid"
    local i pki="$env/pki"
    # Ready, and the bootstrap controller has created the default namespace (/readyz can pass
    # a moment before it exists, and tests create objects there at once).
    for i in $(seq 1 1200); do
        if curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
            "$url/readyz" >/dev/null 2>&1 &&
            curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
                "$url/api/v1/namespaces/default" >/dev/null 2>&1; then
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || { tail -30 "$env/apiserver.log" >&2; die "kube-apiserver exited during start"; }
        sleep 0.1
    done
    tail -30 "$env/apiserver.log" >&2
    die "kube-apiserver not ready within 120 s"
}

write_env() {
    local env=$1
    {
        cat "$env/ports"
        echo "ADMIN_KUBECONFIG=$env/admin.kubeconfig"
        echo "NODE_KUBECONFIG=$env/node.kubeconfig"
        echo "NODE_NAME=$(cat "$env/node-name")"
        echo "APISERVER_PID=$(cat "$env/apiserver.pid")"
        echo "ETCD_PID=$(cat "$env/etcd.pid")"
        echo "CA_FILE=$env/pki/ca.crt"
        echo "ADMIN_TOKEN=$(cut -d, -f1 "$env/tokens.csv")"
        echo "AUDIT_LOG=$env/audit.log"
        if [ -f "$env/bootstrap.kubeconfig" ]; then
            echo "BOOTSTRAP_KUBECONFIG=$env/bootstrap.kubeconfig"
            echo "BOOTSTRAP_TOKEN=$(cat "$env/bootstrap-token")"
        fi
    } >"$env/env.tmp"
    mv -f "$env/env.tmp" "$env/env"
}

cmd_start() {
    local env=${1:?usage: start ENVDIR [NODE]}
    local node=${2:-${NODE_NAME:-kubelet-sdk-node}}
    cmd_install >/dev/null
    binary_ok || die "no working kube-apiserver at $KUBE_APISERVER_BIN (run: $0 install)"
    mkdir -p "$env"
    env=$(cd "$env" && pwd)
    [ -e "$env/ports" ] && die "$env is already in use"
    echo "$node" >"$env/node-name"
    local etcd_port peer_port api_port
    etcd_port=$(claim_port "$env")
    peer_port=$(claim_port "$env")
    api_port=$(claim_port "$env")
    local url="https://127.0.0.1:$api_port"
    {
        echo "APISERVER_URL=$url"
        echo "ETCD_URL=http://127.0.0.1:$etcd_port"
        echo "ETCD_PEER_PORT=$peer_port"
    } >"$env/ports"

    # Certificates: a CA, the serving certificate, the admin and node client certificates, and
    # the service-account signing key pair.
    local pki="$env/pki"
    mkdir -p "$pki"
    chmod 700 "$pki"
    printf '%s' "$OPENSSL_CNF" >"$pki/openssl.cnf"
    new_key "$pki/ca.key"
    openssl req -new -x509 -config "$pki/openssl.cnf" -extensions ca -key "$pki/ca.key" \
        -subj "/CN=kubelet-sdk-test-ca" -days 3650 -out "$pki/ca.crt"
    issue "$pki" apiserver "/CN=kube-apiserver" server
    issue "$pki" admin "/O=system:masters/CN=admin" client
    issue "$pki" node "/O=system:nodes/CN=system:node:$node" client
    issue "$pki" kubelet-client "/CN=kube-apiserver-kubelet-client" client
    new_key "$pki/sa.key"
    openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    echo "$(openssl rand -hex 16),admin,admin,\"system:masters\"" >"$env/tokens.csv"
    chmod 600 "$env/tokens.csv"
    cat >"$env/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
EOF
    kubeconfig "$env/admin.kubeconfig" "$url" "$pki" admin
    kubeconfig "$env/node.kubeconfig" "$url" "$pki" node

    local admission_and_gates="--disable-admission-plugins=ServiceAccount"
    local bootstrap=${KUBELET_SDK_BOOTSTRAP:-0} controllers=serviceaccount,root-ca-cert-publisher
    if [ "$bootstrap" = 1 ]; then
        controllers="$controllers,csrapproving,csrsigning,csrcleaner,bootstrapsigner,tokencleaner"
        echo "$(openssl rand -hex 3).$(openssl rand -hex 8)" >"$env/bootstrap-token"
    fi
    local extra=${KUBELET_SDK_EXTRA_CONTROLLERS:-}
    [ -z "$extra" ] || controllers="$controllers,$extra"
    if [ "${KUBELET_SDK_SERVICE_ACCOUNTS:-0}" = 1 ] || [ "$bootstrap" = 1 ] || [ -n "$extra" ]; then
        admission_and_gates="--feature-gates=BoundServiceAccountTokenVolume=true"
        cat >"$env/controller-manager.args" <<EOF
--kubeconfig=$env/admin.kubeconfig
--controllers=$controllers
--cluster-signing-cert-file=$pki/ca.crt
--cluster-signing-key-file=$pki/ca.key
--cluster-signing-duration=${KUBELET_SDK_SIGNING_DURATION:-8760h}
--root-ca-file=$pki/ca.crt
--service-account-private-key-file=$pki/sa.key
--feature-gates=BoundServiceAccountTokenVolume=true
--leader-elect=false
--bind-address=127.0.0.1
--port=0
--secure-port=0
--logtostderr=true
--v=1
EOF
    fi
    cat >"$env/apiserver.args" <<EOF
--etcd-servers=http://127.0.0.1:$etcd_port
--bind-address=127.0.0.1
--advertise-address=127.0.0.1
--secure-port=$api_port
--insecure-port=0
--cert-dir=$pki
--tls-cert-file=$pki/apiserver.crt
--tls-private-key-file=$pki/apiserver.key
--client-ca-file=$pki/ca.crt
--token-auth-file=$env/tokens.csv
--authorization-mode=Node,RBAC
--enable-admission-plugins=NodeRestriction
$admission_and_gates
--endpoint-reconciler-type=none
--service-cluster-ip-range=10.0.0.0/24
--service-account-issuer=https://kubernetes.default.svc
--service-account-key-file=$pki/sa.pub
--service-account-signing-key-file=$pki/sa.key
--api-audiences=https://kubernetes.default.svc
--allow-privileged=true
--enable-bootstrap-token-auth=$([ "$bootstrap" = 1 ] && echo true || echo false)
--kubelet-client-certificate=$pki/kubelet-client.crt
--kubelet-client-key=$pki/kubelet-client.key
--kubelet-preferred-address-types=InternalIP,Hostname
--audit-policy-file=$env/audit-policy.yaml
--audit-log-path=$env/audit.log
--profiling=false
--logtostderr=true
--v=1
EOF
    # Stop everything if the owner goes away without calling stop (a test process killed).
    if [ -n "${KUBELET_SDK_ENV_OWNER_PID:-}" ]; then
        setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 1; done
                        [ -d "$2" ] && exec bash "$3" stop "$2"' \
            watchdog "$KUBELET_SDK_ENV_OWNER_PID" "$env" "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" \
            >/dev/null 2>&1 </dev/null &
        echo "$!" >"$env/watchdog.pid"
    fi
    launch_etcd "$env"
    launch_apiserver "$env"
    [ -f "$env/controller-manager.args" ] && launch_controller_manager "$env"
    [ "$bootstrap" = 1 ] && bootstrap_objects "$env"
    write_env "$env"
    cat "$env/env"
}

# What kubeadm creates for a node joining with a bootstrap token: the token's Secret (group
# system:bootstrappers:kubeadm:default-node-token), the bindings that let the group create
# CertificateSigningRequests and have them approved (nodeclient), the binding that lets nodes
# have their renewals approved (selfnodeclient), and a bootstrap kubeconfig with the token.
bootstrap_objects() {
    local env=$1 url pki="$env/pki" token id secret
    url=$(sed -n 's/^APISERVER_URL=//p' "$env/ports")
    token=$(cat "$env/bootstrap-token")
    id=${token%%.*}
    secret=${token#*.}
    post() {
        curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
            -H 'Content-Type: application/json' -X POST "$url$1" -d "$2" >/dev/null ||
            die "creating $1 failed"
    }
    local group=system:bootstrappers:kubeadm:default-node-token
    post /api/v1/namespaces/kube-system/secrets "{\"apiVersion\":\"v1\",\"kind\":\"Secret\",
        \"metadata\":{\"name\":\"bootstrap-token-$id\",\"namespace\":\"kube-system\"},
        \"type\":\"bootstrap.kubernetes.io/token\",
        \"stringData\":{\"token-id\":\"$id\",\"token-secret\":\"$secret\",
        \"usage-bootstrap-authentication\":\"true\",\"usage-bootstrap-signing\":\"true\",
        \"auth-extra-groups\":\"$group\",\"description\":\"kubelet-sdk test bootstrap token\"}}"
    binding() {
        post /apis/rbac.authorization.k8s.io/v1/clusterrolebindings "{\"apiVersion\":\"rbac.authorization.k8s.io/v1\",
            \"kind\":\"ClusterRoleBinding\",\"metadata\":{\"name\":\"$1\"},
            \"roleRef\":{\"apiGroup\":\"rbac.authorization.k8s.io\",\"kind\":\"ClusterRole\",\"name\":\"$2\"},
            \"subjects\":[{\"apiGroup\":\"rbac.authorization.k8s.io\",\"kind\":\"Group\",\"name\":\"$3\"}]}"
    }
    binding kubeadm:kubelet-bootstrap system:node-bootstrapper "$group"
    binding kubeadm:node-autoapprove-bootstrap \
        system:certificates.k8s.io:certificatesigningrequests:nodeclient "$group"
    binding kubeadm:node-autoapprove-certificate-rotation \
        system:certificates.k8s.io:certificatesigningrequests:selfnodeclient system:nodes
    cat >"$env/bootstrap.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kubelet-sdk-test
  cluster:
    server: $url
    certificate-authority: $pki/ca.crt
users:
- name: tls-bootstrap-token-user
  user:
    token: $token
contexts:
- name: tls-bootstrap-token-user@kubelet-sdk-test
  context:
    cluster: kubelet-sdk-test
    user: tls-bootstrap-token-user
current-context: tls-bootstrap-token-user@kubelet-sdk-test
EOF
    chmod 600 "$env/bootstrap.kubeconfig"
}

# Starts the controller-manager of ENVDIR and waits until the `default` namespace has its
# `default` ServiceAccount and its `kube-root-ca.crt` ConfigMap.
launch_controller_manager() {
    local env=$1 url pki="$env/pki"
    url=$(sed -n 's/^APISERVER_URL=//p' "$env/ports")
    local args=()
    mapfile -t args <"$env/controller-manager.args"
    setsid "$KUBE_CONTROLLER_MANAGER_BIN" "${args[@]}" >>"$env/controller-manager.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$env/controller-manager.pid"
    local i
    for i in $(seq 1 600); do
        if curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
            "$url/api/v1/namespaces/default/serviceaccounts/default" >/dev/null 2>&1 &&
            curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
                "$url/api/v1/namespaces/default/configmaps/kube-root-ca.crt" >/dev/null 2>&1; then
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || { tail -30 "$env/controller-manager.log" >&2; die "kube-controller-manager exited during start"; }
        sleep 0.1
    done
    tail -30 "$env/controller-manager.log" >&2
    die "kube-controller-manager made no default ServiceAccount and kube-root-ca.crt within 60 s"
}

cmd_stop_apiserver() {
    local env=${1:?usage: stop-apiserver ENVDIR}
    env=$(cd "$env" && pwd)
    [ -f "$env/ports" ] || die "$env is not an environment"
    stop_pid "$env/apiserver.pid" "$env"
}

cmd_start_apiserver() {
    local env=${1:?usage: start-apiserver ENVDIR}
    env=$(cd "$env" && pwd)
    [ -f "$env/ports" ] || die "$env is not an environment"
    live_pid "$env/apiserver.pid" "$env" >/dev/null && die "the API server of $env runs"
    launch_apiserver "$env"
    write_env "$env"
    cat "$env/env"
}

# Debian's kubectl, unpacked from its .deb into the cache (never installed over another
# package's /usr/bin/kubectl).
KUBECTL_DIR="${KUBECTL_DIR:-/var/cache/kubelet-sdk/kubernetes-client}"
cmd_kubectl() {
    local bin="$KUBECTL_DIR/usr/bin/kubectl"
    if [ -x "$bin" ] && "$bin" version --client >/dev/null 2>&1; then
        echo "$bin"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        die "no Debian kubectl at $bin and cannot unpack one (needs root and apt-get)"
    fi
    mkdir -p "$(dirname "$KUBECTL_DIR")"
    exec 8>"$KUBECTL_DIR.lock"
    flock 8
    if ! { [ -x "$bin" ] && "$bin" version --client >/dev/null 2>&1; }; then
        local work
        work=$(mktemp -d "${TMPDIR:-/tmp}/kubelet-sdk-kubectl.XXXXXX")
        exec 9>"${TMPDIR:-/tmp}/kubelet-sdk-apt.lock"
        flock 9
        if ! (cd "$work" && apt-get download -qq kubernetes-client >/dev/null 2>&1); then
            apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
            (cd "$work" && apt-get download -qq kubernetes-client >/dev/null) || { rm -rf "$work"; die "apt-get download kubernetes-client failed"; }
        fi
        flock -u 9
        exec 9>&-
        rm -rf "$KUBECTL_DIR.tmp"
        dpkg-deb -x "$work"/kubernetes-client_*.deb "$KUBECTL_DIR.tmp" || { rm -rf "$work"; die "unpacking kubernetes-client failed"; }
        rm -rf "$work" "$KUBECTL_DIR"
        mv "$KUBECTL_DIR.tmp" "$KUBECTL_DIR"
    fi
    flock -u 8
    exec 8>&-
    "$bin" version --client >/dev/null 2>&1 || die "the unpacked $bin does not run"
    echo "$bin"
}

cmd_stop() {
    local env=${1:?usage: stop ENVDIR}
    [ -d "$env" ] || return 0
    env=$(cd "$env" && pwd)
    local pid
    if pid=$(cat "$env/watchdog.pid" 2>/dev/null) && [ "$pid" != "$PPID" ] && [ "$pid" != "$$" ]; then
        kill -TERM "$pid" 2>/dev/null || true
    fi
    stop_pid "$env/controller-manager.pid" "$env"
    stop_pid "$env/apiserver.pid" "$env"
    stop_pid "$env/etcd.pid" "$env"
    release_ports "$env"
    rm -rf "$env"
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start "${2:-}" "${3:-}" ;;
stop) cmd_stop "${2:-}" ;;
stop-apiserver) cmd_stop_apiserver "${2:-}" ;;
kubectl) cmd_kubectl ;;
source-tree) source_tree "${2:?usage: source-tree WORKDIR}" ;;
start-apiserver) cmd_start_apiserver "${2:-}" ;;
*)
    sed -n '2,32p' "$0" >&2
    exit 2
    ;;
esac
