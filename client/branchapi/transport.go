package branchapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	"github.com/branchbox/branchbox/branch"
)

var branchService = branchv1.Branches_ServiceDesc.ServiceName

// ErrNotSent marks a call that failed before it reached the snapshotter
// (no connection could be made): it certainly did nothing there. A call
// that lost its connection midway has an unknown fate and is not marked.
var ErrNotSent = errors.New("call not sent")

// notSent is a dial failure: unavailable, and certainly not carried out.
// noSocket: the socket did not exist.
type notSent struct {
	err      error
	noSocket bool
}

func (e notSent) Error() string   { return e.err.Error() }
func (e notSent) Unwrap() []error { return []error{e.err, ErrNotSent} }

// transport carries calls of the branch API.
type transport interface {
	invoke(ctx context.Context, method string, req, resp proto.Message) error
	// generation counts the connections lost so far: a caller that saw
	// it change knows the snapshotter may have restarted (and finished
	// or undone work) since.
	generation() uint64
	Close() error
}

// dialTransport returns a transport that takes ttrpc where the snapshotter
// serves it and gRPC where it serves only that (one older than the ttrpc
// socket). The choice is made at each connection, not here: a client made
// while the snapshotter is down or starting (its gRPC socket is bound before
// the ttrpc one) must not be held to gRPC for its life, where no lost
// connection is seen and gRPC's reconnection backoff fails calls with a
// stale dial error long after the snapshotter is back. onDrop, if not nil,
// is called (on a goroutine of its own) each time a ttrpc connection is lost.
func dialTransport(address string, onDrop func()) (transport, error) {
	return &pickTransport{
		ttrpcTransport: ttrpcTransport{address: address + branch.TTRPCSuffix, onDrop: onDrop},
		grpcAddress:    address,
	}, nil
}

// pickTransport is ttrpc, falling back to gRPC for a call when the ttrpc
// socket does not exist and the gRPC one answers.
type pickTransport struct {
	ttrpcTransport
	grpcAddress string

	gmu  sync.Mutex
	grpc *grpc.ClientConn // made on the first fallback
}

func (t *pickTransport) invoke(ctx context.Context, method string, req, resp proto.Message) error {
	err := t.ttrpcTransport.invoke(ctx, method, req, resp)
	var ns notSent
	if !errors.As(err, &ns) || !ns.noSocket || !t.grpcServed() {
		return err
	}
	conn, gerr := t.grpcConn()
	if gerr != nil {
		return gerr
	}
	return conn.Invoke(ctx, "/"+branchService+"/"+method, req, resp)
}

// grpcServed tells whether something accepts connections on the gRPC socket.
func (t *pickTransport) grpcServed() bool {
	c, err := net.DialTimeout("unix", t.grpcAddress, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func (t *pickTransport) grpcConn() (*grpc.ClientConn, error) {
	t.gmu.Lock()
	defer t.gmu.Unlock()
	if t.grpc != nil {
		return t.grpc, nil
	}
	conn, err := grpc.NewClient("unix://"+t.grpcAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to branch snapshotter at %s: %w", t.grpcAddress, err)
	}
	t.grpc = conn
	return conn, nil
}

func (t *pickTransport) Close() error {
	err := t.ttrpcTransport.Close()
	t.gmu.Lock()
	defer t.gmu.Unlock()
	if t.grpc != nil {
		err = errors.Join(err, t.grpc.Close())
		t.grpc = nil
	}
	return err
}

// ttrpcTransport dials on first use, and again after the connection
// closed (the snapshotter restarted), as a gRPC connection would.
type ttrpcTransport struct {
	address string
	onDrop  func()

	mu     sync.Mutex
	client *ttrpc.Client
	conn   syscall.Conn // client's connection
	closed bool
	lost   uint64 // connections lost so far
}

func (t *ttrpcTransport) connect(ctx context.Context) (*ttrpc.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("branch snapshotter client for %s: %w", t.address, ttrpc.ErrClosed)
	}
	if t.client != nil {
		if !peerGone(t.conn) {
			return t.client, nil
		}
		// The snapshotter went (a restart, a crash) and the client has
		// not seen it yet: a call on it would fail as closed, its fate
		// unknown, when it was never sent. Dial anew.
		c := t.client
		t.client = nil
		t.lost++
		_ = c.Close()
		if t.onDrop != nil {
			go t.onDrop()
		}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", t.address)
	if err != nil {
		return nil, notSent{err: fmt.Errorf("connect to branch snapshotter at %s (is it running?): %v: %w", t.address, err, errdefs.ErrUnavailable), noSocket: errors.Is(err, syscall.ENOENT)}
	}
	var c *ttrpc.Client
	c = ttrpc.NewClient(conn, ttrpc.WithOnClose(func() { t.forget(c) }))
	t.client = c
	t.conn, _ = conn.(syscall.Conn)
	return c, nil
}

// peerGone tells whether the other end of conn has closed it: a peek
// reads its end of file. It does not wait, nor take what the client's
// reader would read.
func peerGone(conn syscall.Conn) bool {
	if conn == nil {
		return false
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		gone = n == 0 && err == nil
	})
	return gone
}

// forget drops c, a closed connection, so that the next call dials anew.
func (t *ttrpcTransport) forget(c *ttrpc.Client) {
	t.mu.Lock()
	dropped := t.client == c && !t.closed
	if t.client == c {
		t.client = nil
		t.lost++
	}
	t.mu.Unlock()
	if dropped && t.onDrop != nil {
		go t.onDrop()
	}
}

func (t *ttrpcTransport) generation() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lost
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
