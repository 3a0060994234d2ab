package branchapi

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	"github.com/branchbox/branchbox/branch"
)

// abortOnly answers Abort with the branch it was asked about.
type abortOnly struct {
	branchv1.TTRPCBranchesService
	server string
}

func (a abortOnly) Abort(_ context.Context, req *branchv1.AbortRequest) (*branchv1.AbortResponse, error) {
	return &branchv1.AbortResponse{Aborted: []string{a.server + ":" + req.GetBranch().GetBranch()}}, nil
}

func serveTTRPC(t *testing.T, path, name string) *ttrpc.Server {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	branchv1.RegisterTTRPCBranchesService(s, abortOnly{server: name})
	go func() { _ = s.Serve(context.Background(), l) }()
	t.Cleanup(func() { s.Close() })
	return s
}

// TestDialPrefersTTRPCAndRedials: Dial takes the ttrpc socket beside the
// address; a call while the server is gone fails as unavailable, and the
// client connects again once a server is back, as a gRPC one would.
func TestDialPrefersTTRPCAndRedials(t *testing.T) {
	dir := t.TempDir()
	addr := filepath.Join(dir, "snapshotter.sock")
	first := serveTTRPC(t, addr+branch.TTRPCSuffix, "first")
	c, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref := branch.Ref{Root: branch.Root{Key: "k"}, Branch: "3"}
	if got, err := c.Abort(ctx, ref); err != nil || len(got) != 1 || got[0] != "first:3" {
		t.Fatalf("abort through the first server: %v %v", got, err)
	}

	first.Close()
	os.Remove(addr + branch.TTRPCSuffix)
	// The client learns of the close from its connection; until a server
	// is back, calls fail as unavailable.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = c.Abort(ctx, ref)
		if errdefs.IsUnavailable(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("abort with no server: %v, want unavailable", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	serveTTRPC(t, addr+branch.TTRPCSuffix, "second")
	// Under load, about one run in 150 has the first call after the
	// restart fail as unavailable too (the connection it dialled was
	// closed under it; not explained yet): the client must still connect
	// again, without being told to.
	for tries := 1; ; tries++ {
		got, err := c.Abort(ctx, ref)
		if err == nil && len(got) == 1 && got[0] == "second:3" {
			break
		}
		if !errdefs.IsUnavailable(err) || tries == 3 {
			t.Fatalf("abort after the server came back (try %d): %v %v", tries, got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// grpcAbortOnly is abortOnly served over gRPC.
type grpcAbortOnly struct {
	branchv1.UnimplementedBranchesServer
	server string
}

func (a grpcAbortOnly) Abort(_ context.Context, req *branchv1.AbortRequest) (*branchv1.AbortResponse, error) {
	return &branchv1.AbortResponse{Aborted: []string{a.server + ":" + req.GetBranch().GetBranch()}}, nil
}

// TestDialFallsBackToGRPC: a snapshotter that serves only gRPC is reached
// over gRPC.
func TestDialFallsBackToGRPC(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "snapshotter.sock")
	l, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	branchv1.RegisterBranchesServer(s, grpcAbortOnly{server: "grpc"})
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	c, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := c.Abort(ctx, branch.Ref{Root: branch.Root{Key: "k"}, Branch: "3"}); err != nil || len(got) != 1 || got[0] != "grpc:3" {
		t.Fatalf("abort through a gRPC-only server: %v %v", got, err)
	}
}

// TestDialWhileDown: a client made while no snapshotter runs (or while one
// starts, its gRPC socket bound before the ttrpc one) takes ttrpc once it is
// served: it was held to gRPC for its life, saw no lost connection, and
// after a restart failed calls with a stale dial error during gRPC's
// backoff (seen in the crash loop: "tree through the shim: ... dial unix
// .../snapshotter.sock: connect: no such file or directory" with the
// snapshotter up).
func TestDialWhileDown(t *testing.T) {
	dir := t.TempDir()
	addr := filepath.Join(dir, "snapshotter.sock")
	drops := make(chan struct{}, 4)
	c, err := DialNotify(addr, func() { drops <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref := branch.Ref{Root: branch.Root{Key: "k"}, Branch: "3"}
	if _, err := c.Abort(ctx, ref); !errors.Is(err, ErrNotSent) || !errdefs.IsUnavailable(err) {
		t.Fatalf("abort with no server: %v; want unavailable and not sent", err)
	}
	// A starting snapshotter: gRPC bound (nothing answers on it yet
	// beyond the accept), ttrpc next.
	gl, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer gl.Close()
	first := serveTTRPC(t, addr+branch.TTRPCSuffix, "first")
	if got, err := c.Abort(ctx, ref); err != nil || len(got) != 1 || got[0] != "first:3" {
		t.Fatalf("abort once ttrpc is served: %v %v", got, err)
	}
	first.Close()
	select {
	case <-drops:
	case <-time.After(5 * time.Second):
		t.Fatal("onDrop not called: the client is not on ttrpc")
	}
}

// TestDialNotifyReportsDrops: a lost connection calls onDrop and moves the
// generation on; a call made while no server listens is marked as not
// sent (it certainly did nothing), and one answered is not.
func TestDialNotifyReportsDrops(t *testing.T) {
	dir := t.TempDir()
	addr := filepath.Join(dir, "snapshotter.sock")
	first := serveTTRPC(t, addr+branch.TTRPCSuffix, "first")
	drops := make(chan struct{}, 4)
	c, err := DialNotify(addr, func() { drops <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref := branch.Ref{Root: branch.Root{Key: "k"}, Branch: "3"}
	if _, err := c.Abort(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if g := c.Generation(); g != 0 {
		t.Fatalf("generation %d before any loss, want 0", g)
	}
	first.Close()
	os.Remove(addr + branch.TTRPCSuffix)
	select {
	case <-drops:
	case <-time.After(5 * time.Second):
		t.Fatal("onDrop not called after the server closed the connection")
	}
	if g := c.Generation(); g != 1 {
		t.Fatalf("generation %d after one loss, want 1", g)
	}
	_, err = c.Abort(ctx, ref)
	if !errors.Is(err, ErrNotSent) || !errdefs.IsUnavailable(err) {
		t.Fatalf("abort with no server: %v; want unavailable and not sent", err)
	}
	serveTTRPC(t, addr+branch.TTRPCSuffix, "second")
	if got, err := c.Abort(ctx, ref); err != nil || got[0] != "second:3" {
		t.Fatalf("abort after the server came back: %v %v", got, err)
	}
	if g := c.Generation(); g != 1 {
		t.Fatalf("generation %d after reconnecting, want 1 (it counts losses)", g)
	}
	c.Close()
	select {
	case <-drops:
		t.Fatal("onDrop called for the client's own Close")
	case <-time.After(100 * time.Millisecond):
	}
}
