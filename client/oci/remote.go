package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"syscall"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	remoteserrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// DefaultHostsDir is where containerd's registry host configuration
// (hosts.toml per registry: mirrors, TLS, plain HTTP) lives on a node.
const DefaultHostsDir = "/etc/containerd/certs.d"

// Remote says how to reach a registry, as ctr's flags do.
type Remote struct {
	// HostsDir is containerd's registry host configuration directory
	// (DefaultHostsDir if empty).
	HostsDir string
	// PlainHTTP talks HTTP, not HTTPS, to a registry hosts.toml does not
	// configure (a local test registry).
	PlainHTTP bool
	// User and Secret authenticate to the registry.
	User, Secret string
}

// resolver is containerd's docker resolver configured from r.
func (r Remote) resolver(ctx context.Context) remotes.Resolver {
	dir := r.HostsDir
	if dir == "" {
		dir = DefaultHostsDir
	}
	opts := config.HostOptions{HostDir: config.HostDirFromRoot(dir)}
	if r.PlainHTTP {
		opts.DefaultScheme = "http"
	}
	if r.User != "" {
		user, secret := r.User, r.Secret
		opts.Credentials = func(string) (string, string, error) { return user, secret, nil }
	}
	return docker.NewResolver(docker.ResolverOptions{Hosts: config.ConfigureHosts(ctx, opts)})
}

// Transfer counts what a push sent: the blobs the registry did not have.
type Transfer struct {
	mu      sync.Mutex
	Blobs   []ocispec.Descriptor
	Bytes   int64
	Skipped int // blobs the registry had already
}

func (t *Transfer) add(d ocispec.Descriptor) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.Blobs = append(t.Blobs, d)
	t.Bytes += d.Size
}

func (t *Transfer) skip() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.Skipped++
}

// countingResolver counts the blobs its pushers open writers for: the
// docker pusher asks the registry first and opens none for a blob it has.
type countingResolver struct {
	remotes.Resolver
	t *Transfer
}

func (c countingResolver) Pusher(ctx context.Context, ref string) (remotes.Pusher, error) {
	p, err := c.Resolver.Pusher(ctx, ref)
	if err != nil {
		return nil, err
	}
	return remotes.PusherFunc(func(ctx context.Context, d ocispec.Descriptor) (content.Writer, error) {
		w, err := p.Push(ctx, d)
		if err == nil {
			c.t.add(d)
		} else {
			c.t.skip()
		}
		return w, err
	}), nil
}

// remoteError says what a registry error means for the user: refused
// credentials, a registry that does not answer, or a reference it does not
// know, each with its errdefs kind.
func remoteError(ref string, err error) error {
	var st remoteserrors.ErrUnexpectedStatus
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The caller gave up, not the registry (the HTTP client's
		// error for it is a *url.Error too).
		return err
	case errors.As(err, &st) && (st.StatusCode == http.StatusUnauthorized || st.StatusCode == http.StatusForbidden),
		errors.Is(err, docker.ErrInvalidAuthorization):
		return fmt.Errorf("the registry of %s refused the credentials (give --user USER:SECRET, or the registry's credentials in containerd's hosts configuration): %w: %w", ref, err, errdefs.ErrPermissionDenied)
	case errors.As(err, &st) && st.StatusCode == http.StatusNotFound, errdefs.IsNotFound(err):
		return fmt.Errorf("the registry has no %s: %w: %w", ref, err, errdefs.ErrNotFound)
	case errors.As(err, &st) && st.StatusCode >= http.StatusInternalServerError:
		return fmt.Errorf("the registry of %s failed (%s; try again once it works): %w: %w", ref, http.StatusText(st.StatusCode), err, errdefs.ErrUnavailable)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.EPIPE), errors.As(err, new(*url.Error)):
		// A *url.Error is the HTTP client's: the request never got an
		// answer (a registry gone, or gone in the middle).
		return fmt.Errorf("the registry of %s does not answer or broke off the transfer (is it up? try again once it is): %w: %w", ref, err, errdefs.ErrUnavailable)
	}
	return err
}

// Resolver is containerd's docker resolver configured from r, for other
// pulls than Pull's (the HTTP API's sandbox from an image).
func (r Remote) Resolver(ctx context.Context) remotes.Resolver { return r.resolver(ctx) }
