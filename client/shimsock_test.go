//go:build linux

package client

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	cshim "github.com/containerd/containerd/v2/pkg/shim"
)

// TestShimSocket: the shim's address is containerd's own computation of
// it, for the addresses, namespaces and ids clients name.
func TestShimSocket(t *testing.T) {
	for _, tc := range []struct{ address, ns, id string }{
		{"/run/containerd/containerd.sock", "default", "agent"},
		{"/tmp/x y/containerd.sock", "k8s.io", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{"/run/containerd/containerd.sock/", "ns", "a/../b"},
	} {
		ctx := namespaces.WithNamespace(context.Background(), tc.ns)
		want, err := cshim.SocketAddress(ctx, tc.address, tc.id, false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := shimSocket(ctx, tc.address, tc.id)
		if err != nil || got != want {
			t.Errorf("shimSocket(%q, %q, %q) = %q, %v; containerd's is %q", tc.address, tc.ns, tc.id, got, err, want)
		}
	}
	if _, err := shimSocket(context.Background(), "/a", "b"); err == nil {
		t.Error("shimSocket without a namespace: no error")
	}
}
