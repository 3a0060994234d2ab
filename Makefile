# branchbox build, test and benchmark entry points. Everything runs as root
# on a clean Debian machine: the targets install what they need.

# One containerd version for the Go module and for the daemon the tests run.
# Keep in step with go.mod (checked by `make check-version`).
CONTAINERD_VERSION := v2.2.1
STATICCHECK_VERSION := v0.8.2
# crictl, the CRI client the CRI tests drive containerd with.
CRICTL_VERSION := v1.37.0
# The CNCF distribution registry the push and pull tests run on loopback.
REGISTRY_VERSION := v3.0.0
# runc at the version of the libcontainer the shim links (go.mod), for the
# CRI tests' runc handler where Debian's runc 1.1 falls short (id-mapped
# mounts, which a pod with its own user namespace needs). Installed as
# runc-upstream, so that the PATH's runc stays every other test's.
RUNC_VERSION := v1.4.4
# CRIU, which memory forks dump and restore processes with, built from a
# pinned release (hack/build-criu.sh says why it is built).
CRIU_VERSION := 4.2.1
# The single-node Kubernetes cluster of make test-kubernetes (and the short
# kubelet test of make test): kube-apiserver, kubelet and kubectl of
# k8s.io/kubernetes, etcd, and critest, each built from the module in
# hack/ that pins it (hack/kubernetes, hack/etcd, hack/critest).
KUBERNETES_VERSION := v1.37.2
ETCD_VERSION := v3.7.3
CRITEST_VERSION := v1.37.0

GO ?= go
# bin/ of this clone, named relative to it in targets (make splits a target
# at spaces: the clone may be in a path with one) and absolute where a tool
# needs it so (GOBIN, the tests' BRANCHBOX_BIN), quoted.
BIN := bin
ABSBIN := $(CURDIR)/bin
export BRANCHBOX_BIN := $(ABSBIN)

CONTAINERD_BINS := $(BIN)/containerd $(BIN)/ctr $(BIN)/containerd-shim-runc-v2
CRI_BINS := $(BIN)/crictl
REGISTRY_BINS := $(BIN)/registry
RUNC_BINS := $(BIN)/runc-upstream
OUR_BINS := $(BIN)/containerd-branch-snapshotter $(BIN)/containerd-shim-branch-v1 $(BIN)/branchctl $(BIN)/branchctl-full
DEMO := $(BIN)/branchbox-demo

.PHONY: proto all deps node-deps binaries demo test unit integration test-cgroupv2 test-fs test-kubernetes bench benchstat crash-loop soak lint check-version check-tidy check-proto check-imports check-length check-walk clean containerd-config install image

all: binaries

deps:
	@hack/install-deps.sh

# containerd, ctr and the runc shim, pinned; rebuilt only when the pin moves.
$(BIN)/.containerd-$(CONTAINERD_VERSION):
	@mkdir -p $(BIN)
	GOBIN="$(ABSBIN)" $(GO) install \
		github.com/containerd/containerd/v2/cmd/containerd@$(CONTAINERD_VERSION) \
		github.com/containerd/containerd/v2/cmd/ctr@$(CONTAINERD_VERSION) \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$(CONTAINERD_VERSION)
	@rm -f $(BIN)/.containerd-*
	@touch $@

$(CONTAINERD_BINS): $(BIN)/.containerd-$(CONTAINERD_VERSION) ;

$(BIN)/.crictl-$(CRICTL_VERSION):
	@mkdir -p $(BIN)
	GOBIN="$(ABSBIN)" $(GO) install sigs.k8s.io/cri-tools/cmd/crictl@$(CRICTL_VERSION)
	@rm -f $(BIN)/.crictl-*
	@touch $@

$(CRI_BINS): $(BIN)/.crictl-$(CRICTL_VERSION) ;

$(BIN)/.registry-$(REGISTRY_VERSION):
	@mkdir -p $(BIN)
	GOBIN="$(ABSBIN)" $(GO) install github.com/distribution/distribution/v3/cmd/registry@$(REGISTRY_VERSION)
	@rm -f $(BIN)/.registry-*
	@touch $@

$(REGISTRY_BINS): $(BIN)/.registry-$(REGISTRY_VERSION) ;

$(BIN)/.runc-$(RUNC_VERSION):
	@mkdir -p $(BIN)/.runc-build
	GOBIN="$(ABSBIN)/.runc-build" $(GO) install -tags seccomp github.com/opencontainers/runc@$(RUNC_VERSION)
	mv $(BIN)/.runc-build/runc $(BIN)/runc-upstream
	@rm -rf $(BIN)/.runc-build $(BIN)/.runc-v*
	@touch $@

$(RUNC_BINS): $(BIN)/.runc-$(RUNC_VERSION) ;

$(BIN)/.criu-$(CRIU_VERSION): hack/build-criu.sh $(wildcard hack/criu/*.patch)
	@hack/build-criu.sh $(BIN)
	@rm -f $(BIN)/.criu-*
	@touch $@

CRIU_BINS := $(BIN)/criu
$(CRIU_BINS): $(BIN)/.criu-$(CRIU_VERSION) ;

# k8s.io/kubernetes's own build stamps its version through these variables;
# without them the kubelet would call itself v0.0.0-master.
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBERNETES_VERSION) \
	-X k8s.io/component-base/version.gitMajor=$(patsubst v%,%,$(word 1,$(subst ., ,$(KUBERNETES_VERSION)))) \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBERNETES_VERSION))) \
	-X k8s.io/component-base/version.gitTreeState=clean
# Long on 2 cores the first time (docs/kubernetes.md gives the
# times), cached by the stamp after; nice keeps the machine usable.
$(BIN)/.kubernetes-$(KUBERNETES_VERSION): hack/kubernetes/go.mod hack/kubernetes/go.sum
	@mkdir -p $(BIN)
	@grep -qE "k8s.io/kubernetes $(KUBERNETES_VERSION)( |$$)" hack/kubernetes/go.mod || \
		{ echo "hack/kubernetes/go.mod does not pin k8s.io/kubernetes $(KUBERNETES_VERSION)"; exit 1; }
	cd hack/kubernetes && nice $(GO) build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o "$(ABSBIN)/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
	@rm -f $(BIN)/.kubernetes-*
	@touch $@

$(BIN)/.etcd-$(ETCD_VERSION): hack/etcd/go.mod hack/etcd/go.sum hack/etcd/main.go
	@mkdir -p $(BIN)
	@grep -qE "go.etcd.io/etcd/server/v3 $(ETCD_VERSION)( |$$)" hack/etcd/go.mod || \
		{ echo "hack/etcd/go.mod does not pin etcd $(ETCD_VERSION)"; exit 1; }
	cd hack/etcd && nice $(GO) build -trimpath -o "$(ABSBIN)/etcd" .
	@rm -f $(BIN)/.etcd-*
	@touch $@

# critest is cri-tools' test binary (go test -c), not a command.
$(BIN)/.critest-$(CRITEST_VERSION): hack/critest/go.mod hack/critest/go.sum
	@mkdir -p $(BIN)
	@grep -qE "sigs.k8s.io/cri-tools $(CRITEST_VERSION)( |$$)" hack/critest/go.mod || \
		{ echo "hack/critest/go.mod does not pin cri-tools $(CRITEST_VERSION)"; exit 1; }
	cd hack/critest && nice $(GO) test -c -o "$(ABSBIN)/critest" sigs.k8s.io/cri-tools/cmd/critest
	@rm -f $(BIN)/.critest-*
	@touch $@

KUBE_BINS := $(BIN)/kube-apiserver $(BIN)/kubelet $(BIN)/kubectl
$(KUBE_BINS): $(BIN)/.kubernetes-$(KUBERNETES_VERSION) ;
$(BIN)/etcd: $(BIN)/.etcd-$(ETCD_VERSION) ;
$(BIN)/critest: $(BIN)/.critest-$(CRITEST_VERSION) ;

# Our own binaries are always rebuilt; go's cache makes that cheap.
$(OUR_BINS) $(DEMO): FORCE
	@mkdir -p $(BIN)
	$(GO) build $(BUILD_TAGS) -o $@ ./cmd/$(notdir $@)

# The shim runs seccomp profiles through libseccomp (cgo; libseccomp-dev).
$(BIN)/containerd-shim-branch-v1: BUILD_TAGS := -tags seccomp

# branchctl is static, so that it can be copied into an image and used from
# inside a sandbox (branchctl self, through the branch socket).
# branchctl-full is the rest of branchctl (serve, mcp, push, pull, save,
# load), which branchctl execs; static too, so that the pair can be copied
# anywhere together.
$(BIN)/branchctl $(BIN)/branchctl-full: export CGO_ENABLED := 0
# Every package a binary links runs its initialisation on every start,
# used or not (docs/benchmarks.md#tails). Without urfave/cli's man page
# and markdown generators, which branchctl does not use (their markdown
# library), and without gRPC's golang.org/x/net/trace (html/template, its
# event log), which only grpc.EnableTracing uses.
$(BIN)/branchctl $(BIN)/branchctl-full: BUILD_TAGS := -tags urfave_cli_no_docs,grpcnotrace

# The shim's runtime alone, which the shim runs branches with when it
# sits beside it (it starts faster than the whole shim binary).
SHIM_RUNTIME := $(BIN)/containerd-shim-branch-v1-runtime
$(SHIM_RUNTIME): FORCE
	@mkdir -p $(BIN)
	$(GO) build -tags seccomp -o $@ ./cmd/containerd-shim-branch-v1/runtime

# The branch init, static: it starts in new namespaces for every branch
# and runs as C before the Go runtime would (shim/brinit). osusergo and
# netgo keep glibc's NSS out of the static link (the init never looks up
# a user or a host).
SHIM_INIT := $(BIN)/containerd-shim-branch-v1-init
$(SHIM_INIT): FORCE
	@mkdir -p $(BIN)
	$(GO) build -tags osusergo,netgo -ldflags '-extldflags "-static"' -o $@ ./cmd/containerd-shim-branch-v1/init

FORCE:

binaries: deps $(CONTAINERD_BINS) $(CRI_BINS) $(REGISTRY_BINS) $(RUNC_BINS) $(CRIU_BINS) $(KUBE_BINS) $(BIN)/etcd $(OUR_BINS) $(SHIM_RUNTIME) $(SHIM_INIT)

# The main job: a private containerd with the branch snapshotter running a
# container, all in a temporary directory that is removed afterwards.
demo: binaries $(DEMO)
	$(DEMO)

check-version:
	@grep -q "github.com/containerd/containerd/v2 $(CONTAINERD_VERSION)" go.mod || \
		{ echo "go.mod does not pin containerd $(CONTAINERD_VERSION)"; exit 1; }
	@grep -q "github.com/opencontainers/runc $(RUNC_VERSION)" go.mod || \
		{ echo "go.mod does not pin runc $(RUNC_VERSION)"; exit 1; }

$(BIN)/staticcheck:
	GOBIN="$(ABSBIN)" $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# deps first: vet, staticcheck and the walk build the shim with -tags seccomp,
# which needs libseccomp-dev (pkg-config), not on a fresh machine.
lint: deps check-version check-tidy check-proto check-imports check-length check-walk $(BIN)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags seccomp ./shim/...
	$(BIN)/staticcheck ./...
	$(BIN)/staticcheck -tags seccomp ./shim/...
	@# The project's own tools, each its own module (hack/walk, hack/funclen).
	@for m in hack/walk hack/funclen; do (cd $$m && $(GO) vet ./... && $(ABSBIN)/staticcheck ./...) || exit 1; done

# go.mod and go.sum say exactly what the code needs.
check-tidy:
	@$(GO) mod tidy -diff || { echo "go.mod or go.sum is not tidy: run go mod tidy"; exit 1; }
	@for m in hack/kubernetes hack/etcd hack/critest hack/walk hack/funclen; do \
		(cd $$m && $(GO) mod tidy -diff) || { echo "$$m/go.mod or go.sum is not tidy: run go mod tidy there"; exit 1; }; \
	done

# The generated protobuf code is what the .protos give (make proto).
check-proto:
	@hack/proto.sh --check

# The layering (docs/dev/architecture.md): the shim and the snapshotter are
# peers that import neither each other nor the clients; branch/ is the
# domain core and imports none of them; the shim binary links no bbolt. The
# shim calls the snapshotter through client/branchapi, its API client.
check-imports:
	@hack/check-imports.sh

# Code a reader takes in at once (issue 30): no non-test, non-generated Go
# file over 600 lines, no function over 80 lines in the packages on the
# fork, commit, abort and rollback paths (hack/funclen/main.go lists them).
check-length:
	@hack/funclen.sh

# A reader following a fork through the shim never comes back to a file it
# left (issue 30; docs/design.md, "a fork's path").
check-walk: deps
	@out=$$(hack/walk.sh -max-returns 0) || { echo "$$out"; exit 1; }; echo "$$out" | tail -1

# The tests of pure logic: no root, no daemons, seconds.
UNIT_PKGS := ./branch/ ./client/ ./internal/fifoio/ ./client/branchapi/ ./patterns/ ./internal/branchctl/ ./cmd/branchctl/ ./cmd/branchctl-full/ ./hack/benchtable/ ./internal/containerdconfig/ ./shim/ocirt/ ./internal/safeopen/ ./internal/fscopy/ ./internal/procfd/ ./shim/brinit/ ./httpapi/ ./mcpserver/
unit:
	$(GO) test -count=1 $(UNIT_PKGS)

# The npm packages the integration tests use, pinned by
# integration/node/package-lock.json: the official MCP TypeScript SDK (the
# MCP client of branchctl mcp), TypeScript and node's types (to check the
# TypeScript SDK's declarations). Into integration/node/node_modules
# (ignored by git); again only when the lock changes.
NODE_DEPS := integration/node/node_modules/.package-lock.json
$(NODE_DEPS): integration/node/package-lock.json integration/node/package.json | deps
	cd integration/node && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

node-deps: $(NODE_DEPS)

# Every other test, as root, against real daemons it starts and stops
# itself (-tags seccomp, as the shim is built: shim/seccompbpf's tests check
# its programs against runc's), then the leak check and the cgroup v2 VM
# subset.
integration: binaries $(NODE_DEPS)
	$(GO) test -tags seccomp -count=1 -timeout 20m $$($(GO) list -tags seccomp ./... | grep -vxF "$$($(GO) list $(UNIT_PKGS))")
	hack/test-on-fs.sh xfs $(GO) test -count=1 -timeout 10m ./snapshotter/
	@hack/leakcheck.sh
	CGV2_NATIVE_SKIP=1 hack/test-cgroupv2.sh $(CGV2_SUBSET)

# What CI runs (.ci/run).
test: lint unit integration

# A single-node Kubernetes cluster (etcd, kube-apiserver, a kubelet) on a
# private containerd with the documented configuration: the pods of
# TestKubernetesNode on RuntimeClass branch, and critest on the runc and
# branch handlers compared spec by spec (TestCritest, docs/critest.md).
# make test runs the short TestKubeletBranchPod only (docs/kubernetes.md).
test-kubernetes: binaries $(BIN)/critest
	BRANCHBOX_TEST_KUBERNETES=full $(GO) test -tags seccomp -count=1 -timeout 60m -v \
		-run '^(TestKubeletBranchPod|TestKubernetesNode|TestCritest|TestCritestDocs)$$' ./integration/
	@hack/leakcheck.sh

# The tests `make test` also runs on a cgroup-v2-only kernel in a VM when
# the host is not cgroup v2 only (under emulation, 10-30x slower): those
# of the cgroup code that differs between v1 and v2, the systemd cgroup
# driver's (the VM's PID 1 is systemd), and a node's reboot (its cgroups
# gone with everything in them).
CGV2_SUBSET ?= integration:TestContextsLimitsAndOOM integration:TestContextsSealFreeze \
	integration:TestContextsKillSuite integration:TestContextsRuntimeFallback \
	integration:TestContextsSystemdCgroup integration:TestCRIBranchSystemdCgroup \
	integration:TestMemoryFork integration:TestMemoryRollback integration:TestMemoryCheckpoint \
	integration:TestMemoryRollbackSandbox integration:TestMemoryForkMemoryLimit integration:TestKubeletBranchPod \
	integration:TestTaskCheckpointRestore integration:TestUpdateWithBranches integration:TestNodeReboot

# The whole suite on a cgroup-v2-only kernel in a VM (long: hours under
# emulation). TESTS=pkg:TestName ... runs only those.
# A package's whole run (pkg:ALL) takes up to half an hour there.
test-cgroupv2: binaries
	VM_TIMEOUT=14400 PER_TEST_TIMEOUT=2400 GO_TIMEOUT=38m hack/test-cgroupv2.sh $(TESTS)

# The snapshotter's packages on XFS and btrfs, and the integration suite on
# XFS, their temporary directories on a filesystem of that type on a loop
# device (hack/test-on-fs.sh; make test runs the snapshotter package on XFS).
test-fs: binaries $(NODE_DEPS)
	hack/test-on-fs.sh xfs $(GO) test -count=1 -timeout 10m ./snapshotter/...
	hack/test-on-fs.sh btrfs $(GO) test -count=1 -timeout 10m ./snapshotter/...
	hack/test-on-fs.sh xfs $(GO) test -tags seccomp -count=1 -timeout 30m ./integration/

# benchstat (golang.org/x/perf), pinned, prints make bench's table of medians.
BENCHSTAT_VERSION := v0.0.0-20260908200009-22c9c6c9d4da
$(BIN)/.benchstat-$(BENCHSTAT_VERSION):
	@mkdir -p $(BIN)
	GOBIN="$(ABSBIN)" $(GO) install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)
	@rm -f $(BIN)/.benchstat-*
	@touch $@

benchstat: $(BIN)/.benchstat-$(BENCHSTAT_VERSION)

bench: binaries benchstat
	@hack/bench.sh

# The crash loop of the branch contexts (TestContextsCrashLoop), long:
# CRASH_ROUNDS rounds with the snapshotter killed, as many with the shim
# killed, and as many with either. `make test` runs a few of each.
CRASH_ROUNDS ?= 300
crash-loop: binaries
	BRANCHBOX_CRASH_ROUNDS=$(CRASH_ROUNDS) $(GO) test -count=1 -timeout 6h -v -run 'TestContextsCrashLoop' ./integration/

# A sandbox's long session (TestSoak): SOAK_ROUNDS rounds of fork, commit,
# nested fork, checkpoint and rollback; nothing it leaves may grow. Then
# eight agents racing on one sandbox for AGENTS_SECONDS
# (TestConcurrentAgents). `make test` runs 60 rounds and 5 seconds.
SOAK_ROUNDS ?= 3200
AGENTS_SECONDS ?= 600
soak: binaries
	BRANCHBOX_SOAK_ROUNDS=$(SOAK_ROUNDS) BRANCHBOX_AGENTS_SECONDS=$(AGENTS_SECONDS) \
		$(GO) test -tags seccomp -count=1 -timeout 2h -v -run 'TestSoak$$|TestConcurrentAgents$$' ./integration/

clean:
	rm -rf $(BIN)

# Node install (docs/node-setup.md): the binaries, the snapshotter's
# systemd unit (pointing at BINDIR), a containerd.service drop-in ordering
# containerd after it, and the containerd configuration to merge.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
UNITDIR ?= $(PREFIX)/lib/systemd/system
DATADIR ?= $(PREFIX)/share/branchbox
COMPLETIONDIR ?= $(PREFIX)/share/bash-completion/completions

install: $(OUR_BINS) $(SHIM_RUNTIME) $(SHIM_INIT) $(CRIU_BINS)
	install -D -m 0755 $(BIN)/containerd-branch-snapshotter $(DESTDIR)$(BINDIR)/containerd-branch-snapshotter
	install -D -m 0755 $(BIN)/containerd-shim-branch-v1 $(DESTDIR)$(BINDIR)/containerd-shim-branch-v1
	install -D -m 0755 $(BIN)/containerd-shim-branch-v1-runtime $(DESTDIR)$(BINDIR)/containerd-shim-branch-v1-runtime
	install -D -m 0755 $(BIN)/containerd-shim-branch-v1-init $(DESTDIR)$(BINDIR)/containerd-shim-branch-v1-init
	install -D -m 0755 $(BIN)/branchctl $(DESTDIR)$(BINDIR)/branchctl
	# branchctl runs its serve, mcp, push, pull, save and load from beside it.
	install -D -m 0755 $(BIN)/branchctl-full $(DESTDIR)$(BINDIR)/branchctl-full
	# CRIU, for memory forks: the runtime looks for it beside itself.
	install -D -m 0755 $(BIN)/criu $(DESTDIR)$(BINDIR)/criu
	install -d $(DESTDIR)$(COMPLETIONDIR)
	$(BIN)/branchctl completion bash > $(DESTDIR)$(COMPLETIONDIR)/branchctl
	chmod 0644 $(DESTDIR)$(COMPLETIONDIR)/branchctl
	install -d $(DESTDIR)$(UNITDIR)/containerd.service.d
	sed 's|@BINDIR@|$(BINDIR)|g' hack/systemd/containerd-branch-snapshotter.service > $(DESTDIR)$(UNITDIR)/containerd-branch-snapshotter.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/containerd-branch-snapshotter.service
	install -m 0644 hack/systemd/containerd-branchbox.conf $(DESTDIR)$(UNITDIR)/containerd.service.d/10-branchbox.conf
	install -d $(DESTDIR)$(DATADIR)
	# The CRI handler names the shim by path: the one installed here.
	sed 's|runtime_path = "/usr/local/bin/containerd-shim-branch-v1"|runtime_path = "$(BINDIR)/containerd-shim-branch-v1"|' docs/containerd-config.toml > $(DESTDIR)$(DATADIR)/containerd-config.toml
	chmod 0644 $(DESTDIR)$(DATADIR)/containerd-config.toml
	install -D -m 0644 docs/runtimeclass.yaml $(DESTDIR)$(DATADIR)/runtimeclass.yaml

proto:
	@hack/proto.sh

# A small OCI image archive of the host's static busybox, for machines that
# reach no registry: ctr images import --snapshotter branch bin/busybox.tar
# (docs/private-containerd.md).
image:
	@mkdir -p $(BIN)
	$(GO) run ./hack/busybox-image -o $(BIN)/busybox.tar

# docs/containerd-config.toml is generated (internal/containerdconfig); a unit
# test fails when it is stale.
containerd-config:
	$(GO) run ./hack/gen-containerd-config --platform linux/amd64 > docs/containerd-config.toml
