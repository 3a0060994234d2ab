//go:build linux

package sandbox

// Calls that copy their own caller: a memory fork, or a checkpoint with
// memory, that a process asks for of its own branch through the branch
// socket (`branchctl self fork --memory`, `self checkpoint --memory`). The
// caller is one of the processes to dump, and the connection it asks on is
// a socket connected to the shim, which CRIU cannot copy. So the call is
// made after it returns, as fork(2) returns twice: it answers at once with
// a token; the caller closes its connection and waits, holding nothing but
// its process, for call-TOKEN.json in the socket's directory; the shim
// waits until no connection to the branch's socket is open, makes the
// call with the token written into the memory image, and writes the
// outcome there. Every restore of that image, a branch of the fork or one
// forked from (or rolled back to) the checkpoint at any later time, writes
// into the restored branch's socket directory, which is its copy's
// /run/branchbox, the branch it runs in.

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
	"google.golang.org/protobuf/proto"

	"github.com/branchbox/branchbox/branch"
)

const (
	// selfCallWait bounds the wait for the caller, and any other process
	// of the branch, to close its connection to the socket.
	selfCallWait = 10 * time.Second
	// selfCallKeep is how long an outcome stays for its reader.
	selfCallKeep = time.Minute
	// selfCallFile, in a memory image, holds the token of the call that
	// made it: its restored copies are waiting for their outcome.
	selfCallFile = "branchbox-self-call"
)

// selfCallKey carries the token of the call being made.
type selfCallKey struct{}

func selfCallToken(ctx context.Context) string {
	v, _ := ctx.Value(selfCallKey{}).(string)
	return v
}

// callerApartKey marks a call through the branch socket that dumps a
// descendant of the caller's branch, whose processes the caller is not
// among: it is made as any other.
type callerApartKey struct{}

func callerApart(ctx context.Context) bool {
	v, _ := ctx.Value(callerApartKey{}).(bool)
	return v
}

// callLater answers a call that copies its caller (what names it) with a
// token and makes it, by op, once the caller has let go of the socket.
func (s *selfService) callLater(ctx context.Context, what string, op func(context.Context) (proto.Message, error)) (string, error) {
	s.c.insock.mu.Lock()
	sock := s.c.insock.socks[selfKey(s.sandbox, s.self)]
	s.c.insock.mu.Unlock()
	if sock == nil {
		return "", fmt.Errorf("%s of %s/%s: its branch socket is gone: %w", what, s.sandbox, s.self, errdefs.ErrNotFound)
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	ctx = context.WithValue(withSelfFork(context.WithoutCancel(ctx)), selfCallKey{}, token)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, selfCallWait)
		n, err := sock.conns.waitNone(wctx)
		cancel()
		var resp proto.Message
		if err != nil {
			err = fmt.Errorf("%s of %s/%s: %d connection(s) to its branch socket stayed open for %s (a `branchctl self` call of one of its processes), which a copy could not be given: %w", what, s.sandbox, s.self, n, selfCallWait, errdefs.ErrFailedPrecondition)
		} else {
			resp, err = op(ctx)
		}
		publishSelfCall(ctx, filepath.Join(sock.dir, branch.SelfCallOutcomeFile(token)), resp, err)
	}()
	return token, nil
}

// publishSelfCall writes the outcome for the caller.
func publishSelfCall(ctx context.Context, path string, resp proto.Message, ferr error) {
	var out branch.SelfCallOutcome
	var err error
	if ferr != nil {
		out.Error, err = protojson.Marshal(status.Convert(toTTRPC(ferr)).Proto())
	} else {
		out.Response, err = protojson.Marshal(resp)
	}
	if err != nil {
		log.G(ctx).WithError(err).Warn("self call: encode its outcome")
		return
	}
	writeOutcome(ctx, path, out)
}

// markSelfCall records in a memory image the call that made it, if any.
func markSelfCall(ctx context.Context, dir string) error {
	if token := selfCallToken(ctx); token != "" {
		return os.WriteFile(filepath.Join(dir, selfCallFile), []byte(token), 0o600)
	}
	return nil
}

// restoredCaller is the outcome file the copy of a caller, to be restored
// from image dir into branch n, waits for ("": no caller in the image, or
// no socket to wait on).
func (c *Service) restoredCaller(ctx context.Context, sb *Sandbox, n *Branch, dir string) string {
	token, err := os.ReadFile(filepath.Join(dir, selfCallFile))
	if err != nil {
		return "" // no caller in the image
	}
	if _, err := hex.DecodeString(string(token)); err != nil || len(token) != 32 {
		log.G(ctx).WithField("branch", n.id).Warn("self call: a memory image with a malformed token")
		return ""
	}
	c.insock.mu.Lock()
	sock := c.insock.socks[selfKey(sb.id, n.id)]
	c.insock.mu.Unlock()
	if sock == nil {
		return "" // a sandbox without sockets: the copy has none to wait on
	}
	return filepath.Join(sock.dir, branch.SelfCallOutcomeFile(string(token)))
}

// clearRestoredCaller removes, before the restore, an outcome the copy
// must not read: a rollback's branch still holds the one its caller had
// at the dump.
func (c *Service) clearRestoredCaller(ctx context.Context, sb *Sandbox, n *Branch, dir string) {
	if path := c.restoredCaller(ctx, sb, n, dir); path != "" {
		_ = os.Remove(path)
	}
}

// tellRestoredCaller gives the copy restored from image dir into branch n
// its outcome, the branch it runs in. After the restore, not before: a
// copy that found it at once could end before CRIU let it go ("Unable to
// detach ...: No such process", the restore failed).
func (c *Service) tellRestoredCaller(ctx context.Context, sb *Sandbox, n *Branch, dir string) {
	if path := c.restoredCaller(ctx, sb, n, dir); path != "" {
		writeOutcome(ctx, path, branch.SelfCallOutcome{Self: n.id})
	}
}

// writeOutcome puts out at path whole (written beside it, renamed) and
// removes it after selfCallKeep; it goes sooner with its branch's bundle.
func writeOutcome(ctx context.Context, path string, out branch.SelfCallOutcome) {
	data, err := json.Marshal(out)
	if err == nil {
		tmp := path + ".tmp"
		if err = os.WriteFile(tmp, data, 0o644); err == nil {
			err = os.Rename(tmp, path)
		}
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("path", path).Warn("self call: write its outcome")
		return
	}
	time.AfterFunc(selfCallKeep, func() { _ = os.Remove(path) })
}
