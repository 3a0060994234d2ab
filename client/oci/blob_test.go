//go:build linux

package oci

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/internal/daemons"
)

// TestCommitHeldByLease: a layer or blob written under a lease that the
// content store already has (written before under another lease, as a
// retried push makes the same layer) is held by the second lease: when the
// first ends and containerd collects, it is still there. containerd's
// content service answers a commit naming the digest of a blob it has with
// AlreadyExists and leaves the blob out of the lease; a push in CI lost
// its layer so, between its commit and its manifest.
func TestCommitHeldByLease(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs a containerd daemon and must run as root (make test does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := daemons.Start(ctx, daemons.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("containerd log:\n%s", env.Log("containerd"))
		}
		if err := env.Stop(context.Background()); err != nil {
			t.Errorf("stop the daemons: %v", err)
		}
	}()
	client, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx = namespaces.WithNamespace(ctx, env.Namespace)
	ls, cs := client.LeasesService(), client.ContentStore()

	data := bytes.Repeat([]byte("branchbox "), 10000)
	config := []byte(`{"architecture":"amd64","os":"linux"}`)
	configDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(config), Size: int64(len(config))}
	write := func() (leases.Lease, digest.Digest) {
		t.Helper()
		l, err := ls.Create(ctx, leases.WithRandomID())
		if err != nil {
			t.Fatal(err)
		}
		lctx := leases.WithLease(ctx, l.ID)
		desc, _, err := storeLayer(lctx, cs, func(w io.Writer) error { _, err := w.Write(data); return err })
		if err != nil {
			t.Fatal(err)
		}
		if err := writeBlob(lctx, cs, configDesc, config, nil); err != nil {
			t.Fatal(err)
		}
		return l, desc.Digest
	}
	first, layer := write()
	second, again := write()
	if again != layer {
		t.Fatalf("the same content made layer %s, then %s", layer, again)
	}
	// gone ends l and says whether the layer or the config went with it.
	gone := func(l leases.Lease) bool {
		t.Helper()
		// Ending a lease this way collects at once what nothing else holds.
		if err := ls.Delete(ctx, l, leases.SynchronousDelete); err != nil {
			t.Fatal(err)
		}
		_, err := cs.Info(ctx, layer)
		_, cerr := cs.Info(ctx, configDesc.Digest)
		return errdefs.IsNotFound(err) || errdefs.IsNotFound(cerr)
	}
	if gone(first) {
		t.Fatal("the second lease holds the layer and the config, yet they were collected when the first lease ended")
	}
	if !gone(second) {
		t.Fatal("the layer and the config outlived both leases: the test did not make containerd collect")
	}
}
