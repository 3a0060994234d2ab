package branch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
)

// TTRPCSuffix names the snapshotter's ttrpc socket: the branch API is
// served over gRPC at the snapshotter's address and over ttrpc at that
// address with this suffix, as containerd serves its API beside its gRPC
// socket. A call over ttrpc takes fewer hand-offs between threads, each of
// which costs 100 us or more on a busy machine.
const TTRPCSuffix = ".ttrpc"

var branchService = branchv1.Branches_ServiceDesc.ServiceName

// transport carries calls of the branch API.
type transport interface {
	invoke(ctx context.Context, method string, req, resp proto.Message) error
	Close() error
}

// dialTransport picks ttrpc where the snapshotter serves it, else gRPC.
func dialTransport(address string) (transport, error) {
	if fi, err := os.Stat(address + TTRPCSuffix); err == nil && fi.Mode().Type() == os.ModeSocket {
		return &ttrpcTransport{address: address + TTRPCSuffix}, nil
	}
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to branch snapshotter at %s: %w", address, err)
	}
	return grpcTransport{conn}, nil
}

type grpcTransport struct{ conn *grpc.ClientConn }

func (t grpcTransport) invoke(ctx context.Context, method string, req, resp proto.Message) error {
	return t.conn.Invoke(ctx, "/"+branchService+"/"+method, req, resp)
}

func (t grpcTransport) Close() error { return t.conn.Close() }

// ttrpcTransport dials on first use, and again after the connection
// closed (the snapshotter restarted), as a gRPC connection would.
type ttrpcTransport struct {
	address string

	mu     sync.Mutex
	client *ttrpc.Client
	closed bool
}

func (t *ttrpcTransport) connect(ctx context.Context) (*ttrpc.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("branch snapshotter client for %s: %w", t.address, ttrpc.ErrClosed)
	}
	if t.client != nil {
		return t.client, nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", t.address)
	if err != nil {
		return nil, fmt.Errorf("connect to branch snapshotter at %s (is it running?): %v: %w", t.address, err, errdefs.ErrUnavailable)
	}
	var c *ttrpc.Client
	c = ttrpc.NewClient(conn, ttrpc.WithOnClose(func() { t.forget(c) }))
	t.client = c
	return c, nil
}

// forget drops c, a closed connection, so that the next call dials anew.
func (t *ttrpcTransport) forget(c *ttrpc.Client) {
	t.mu.Lock()
	if t.client == c {
		t.client = nil
	}
	t.mu.Unlock()
}

func (t *ttrpcTransport) invoke(ctx context.Context, method string, req, resp proto.Message) error {
	c, err := t.connect(ctx)
	if err != nil {
		return err
	}
	if err := c.Call(ctx, branchService, method, req, resp); err != nil {
		if errors.Is(err, ttrpc.ErrClosed) {
			// The close callback may not have run yet: without this the
			// next call could still be made on the dead connection.
			t.forget(c)
			// Sent or not, the call's fate is unknown: not retried.
			return fmt.Errorf("branch snapshotter at %s closed the connection during %s (restarted?): %w", t.address, method, errdefs.ErrUnavailable)
		}
		return err
	}
	return nil
}

func (t *ttrpcTransport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.client == nil {
		return nil
	}
	err := t.client.Close()
	t.client = nil
	return err
}
