//go:build linux

package sandbox

// A memory fork a process asks for of its own context, through the branch
// socket (`branchctl self fork --memory`): the caller is one of the
// processes to copy, and the connection it asks on is a socket connected
// to the shim, which CRIU cannot copy. So the fork is made after the call,
// as fork(2) returns twice: the call answers at once with a token; the
// caller closes its connection and waits, holding nothing but its
// process, for fork-TOKEN.json in the socket's directory; the shim waits
// until no connection to the context's socket is open, makes the fork,
// and writes the outcome there: the branches (or the error) in the
// context's directory, and in each branch's directory (the copy's
// /run/branchbox is its own) the branch the copy runs in.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

const (
	// selfForkWait bounds the wait for the caller, and any other process
	// of the context, to close its connection to the socket.
	selfForkWait = 10 * time.Second
	// selfForkKeep is how long an outcome stays for its reader.
	selfForkKeep = time.Minute
)

// liveSelfMemoryKey marks the fork made after such a call.
type liveSelfMemoryKey struct{}

func isLiveSelfMemory(ctx context.Context) bool {
	v, _ := ctx.Value(liveSelfMemoryKey{}).(bool)
	return v
}

// forkSelfLater answers a memory fork of the caller's own context with a
// token and makes it once the caller has let go of the socket.
func (s *selfService) forkSelfLater(ctx context.Context, req *shimv1.ForkRequest) (*shimv1.ForkResponse, error) {
	s.c.insock.mu.Lock()
	sock := s.c.insock.socks[selfKey(s.sandbox, s.self)]
	s.c.insock.mu.Unlock()
	if sock == nil {
		return nil, fmt.Errorf("memory fork of %s/%s: its branch socket is gone: %w", s.sandbox, s.self, errdefs.ErrNotFound)
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(b)
	ctx = context.WithValue(withSelfFork(context.WithoutCancel(ctx)), liveSelfMemoryKey{}, true)
	go func() {
		resp, err := s.forkWhenLetGo(ctx, sock, req)
		s.c.publishSelfFork(ctx, s.sandbox, sock.dir, token, resp, err)
	}()
	return &shimv1.ForkResponse{Pending: token}, nil
}

func (s *selfService) forkWhenLetGo(ctx context.Context, sock *selfSock, req *shimv1.ForkRequest) (*shimv1.ForkResponse, error) {
	wctx, cancel := context.WithTimeout(ctx, selfForkWait)
	defer cancel()
	if n, err := sock.conns.waitNone(wctx); err != nil {
		return nil, fmt.Errorf("memory fork of %s/%s: %d connection(s) to its branch socket stayed open for %s (a `branchctl self` call of one of its processes), which a copy could not be given: %w", s.sandbox, s.self, n, selfForkWait, errdefs.ErrFailedPrecondition)
	}
	resp, err := s.c.Fork(ctx, req)
	if err != nil {
		return nil, err
	}
	for _, b := range resp.Branches {
		hide(b)
	}
	return resp, nil
}

// publishSelfFork writes the outcome for the caller and for each copy of it.
func (c *Service) publishSelfFork(ctx context.Context, sandboxID, dir, token string, resp *shimv1.ForkResponse, ferr error) {
	var out branch.SelfForkOutcome
	var err error
	if ferr != nil {
		out.Error, err = protojson.Marshal(status.Convert(toTTRPC(ferr)).Proto())
	} else {
		out.Response, err = protojson.Marshal(resp)
	}
	if err != nil {
		log.G(ctx).WithError(err).Warn("self memory fork: encode its outcome")
		return
	}
	name := branch.SelfForkOutcomeFile(token)
	// The copies first: the caller may act on the branches at once.
	if resp != nil {
		for _, b := range resp.Branches {
			c.insock.mu.Lock()
			sock := c.insock.socks[selfKey(sandboxID, b.Id)]
			c.insock.mu.Unlock()
			if sock != nil {
				writeOutcome(ctx, filepath.Join(sock.dir, name), branch.SelfForkOutcome{Self: b.Id})
			}
		}
	}
	writeOutcome(ctx, filepath.Join(dir, name), out)
}

// writeOutcome puts out at path whole (written beside it, renamed) and
// removes it after selfForkKeep; it goes sooner with its context's bundle.
func writeOutcome(ctx context.Context, path string, out branch.SelfForkOutcome) {
	data, err := json.Marshal(out)
	if err == nil {
		tmp := path + ".tmp"
		if err = os.WriteFile(tmp, data, 0o644); err == nil {
			err = os.Rename(tmp, path)
		}
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("path", path).Warn("self memory fork: write its outcome")
		return
	}
	time.AfterFunc(selfForkKeep, func() { _ = os.Remove(path) })
}
