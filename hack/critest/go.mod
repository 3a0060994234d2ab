// critest v1.37.0 (cri-tools' CRI validation suite, a Go test binary) for
// make test-kubernetes: go test -c sigs.k8s.io/cri-tools/cmd/critest.
module github.com/branchbox/branchbox/hack/critest

go 1.26.6

require sigs.k8s.io/cri-tools v1.37.0
