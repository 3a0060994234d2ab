//go:build tools

// Package critest only pins critest's module: make test-kubernetes builds
// its test binary with go test -c sigs.k8s.io/cri-tools/cmd/critest.
package critest

import _ "sigs.k8s.io/cri-tools/cmd/critest"
