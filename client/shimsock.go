//go:build linux

package client

import (
	"context"
	"crypto/sha256"
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// shimSocket is the address of the shim containerd started for id (a
// container, or the group a CRI pod's containers share), as containerd's
// pkg/shim.SocketAddress computes it: the sha256 of containerd's address,
// the namespace and the id, under containerd's state directory. It is
// computed here rather than called because importing pkg/shim links the
// whole shim framework into every program built on this package (go-cmp,
// vsock, the plugin registry, the ttrpc event service), whose package
// initialisation branchctl paid on every start (docs/benchmarks.md#tails).
// TestShimSocket holds it to containerd's.
func shimSocket(ctx context.Context, address, id string) (string, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return "", err
	}
	d := sha256.Sum256([]byte(filepath.Join(address, ns, id)))
	return fmt.Sprintf("unix://%s/%x", filepath.Join(defaults.DefaultStateDir, "s"), d), nil
}
