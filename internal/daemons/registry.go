//go:build linux

package daemons

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Registry is a CNCF distribution registry (bin/registry) serving plain
// HTTP on a free 127.0.0.1 port, its storage in a temporary directory:
// the far end of push and pull tests.
type Registry struct {
	Dir     string // config, log and storage live under here
	Host    string // 127.0.0.1:PORT, as an image reference names it
	Storage string // the filesystem driver's root directory
	BinDir  string

	user, password string
	// addr is where the registry listens: Host, or the far end of link.
	addr string
	link *slowLink
	p    *proc
	env  *Env // for spawn and Log: the registry has no containerd
}

// RegistryConfig says how to run a registry.
type RegistryConfig struct {
	// BinDir holds registry. Default: $BRANCHBOX_BIN.
	BinDir string
	// User and Password, if set, make the registry refuse requests without
	// them (htpasswd basic auth).
	User, Password string
	// Rate, if set, puts the registry behind a link that carries each
	// direction of each connection at this many bytes per second (Host is
	// the link's address): transfers that a test interrupts take their
	// time whatever the machine's speed.
	Rate int
}

// StartRegistry starts a registry and waits until it answers. Stop it with
// Stop, which also removes its storage.
func StartRegistry(ctx context.Context, cfg RegistryConfig) (_ *Registry, retErr error) {
	if cfg.BinDir == "" {
		cfg.BinDir = BinDirFromEnv()
	}
	bin, err := filepath.Abs(cfg.BinDir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(bin, "registry")); err != nil {
		return nil, fmt.Errorf("registry not found in %s: build it with `make binaries`: %w", bin, err)
	}
	dir, err := os.MkdirTemp("", "bbx-reg-")
	if err != nil {
		return nil, err
	}
	r := &Registry{Dir: dir, Storage: filepath.Join(dir, "storage"), BinDir: bin, user: cfg.User, password: cfg.Password,
		env: &Env{Dir: dir}}
	defer func() {
		if retErr != nil {
			_ = r.Stop()
		}
	}()
	if err := r.start(ctx, ""); err != nil {
		return nil, err
	}
	if cfg.Rate > 0 {
		if r.link, err = newSlowLink(r.addr, cfg.Rate); err != nil {
			return nil, err
		}
		r.Host = r.link.Addr()
	}
	return r, nil
}

// start runs the registry on addr, or on a free port if addr is "".
func (r *Registry) start(ctx context.Context, addr string) error {
	if addr == "" {
		// Ask the kernel for a free port; the registry binds it a moment
		// later (a race with other binders that a retry would paper
		// over: start fails loudly instead).
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		addr = l.Addr().String()
		l.Close()
	}
	r.Host, r.addr = addr, addr
	auth := ""
	if r.user != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(r.password), bcrypt.MinCost)
		if err != nil {
			return err
		}
		htpasswd := filepath.Join(r.Dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(r.user+":"+string(hash)+"\n"), 0o600); err != nil {
			return err
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: branchbox-test\n    path: %s\n", htpasswd)
	}
	// The access log records every request: tests count what was uploaded.
	config := fmt.Sprintf(`version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
%shttp:
  addr: %s
  secret: branchbox-test-secret
`, r.Storage, auth, addr)
	path := filepath.Join(r.Dir, "config.yml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return err
	}
	// No OpenTelemetry collector: the registry would retry exporting to
	// one on localhost.
	p, err := r.env.spawn("registry", []string{"OTEL_TRACES_EXPORTER=none"}, filepath.Join(r.BinDir, "registry"), "serve", path)
	if err != nil {
		return err
	}
	r.p = p
	deadline := time.Now().Add(30 * time.Second)
	client := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		// /v2/ answers 200, or 401 with auth on: either way it serves.
		if resp, err := client.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-p.done:
			r.p = nil
			return fmt.Errorf("registry exited (%v) before serving %s:\n%s", p.err, addr, tail(r.Log(), 20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("registry did not serve %s within 30s:\n%s", addr, tail(r.Log(), 20))
}

// Ref names repo:tag on this registry.
func (r *Registry) Ref(repoTag string) string { return r.Host + "/" + repoTag }

// Log returns the registry's output (its access log included).
func (r *Registry) Log() string { return r.env.Log("registry") }

// Pid is the registry's pid, 0 when it is not running.
func (r *Registry) Pid() int {
	if r.p == nil {
		return 0
	}
	return r.p.cmd.Process.Pid
}

// Kill stops the registry at once (SIGKILL), keeping its storage, as a
// registry that dies in the middle of a transfer; behind a link, the
// link's connections are cut.
func (r *Registry) Kill() error {
	if r.p == nil {
		return nil
	}
	err := r.p.stop(syscall.SIGKILL, 15*time.Second)
	r.p = nil
	if r.link != nil {
		// What the registry had written into its sockets dies with it,
		// rather than reaching the client from the link's buffers.
		r.link.Cut()
	}
	return err
}

// Restart starts a killed registry again on the same address and storage.
func (r *Registry) Restart(ctx context.Context) error {
	if r.p != nil {
		return errors.New("registry already running")
	}
	host := r.Host
	err := r.start(ctx, r.addr)
	r.Host = host
	return err
}

// Blobs lists the digests ("sha256:...") of every blob in the registry's
// storage: layers, configs and manifests alike.
func (r *Registry) Blobs() ([]string, error) {
	sizes, err := r.BlobSizes()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(sizes))
	for d := range sizes {
		out = append(out, d)
	}
	sort.Strings(out)
	return out, nil
}

// BlobSizes maps the digest of every blob in the registry's storage to
// its size.
func (r *Registry) BlobSizes() (map[string]int64, error) {
	base := filepath.Join(r.Storage, "docker", "registry", "v2", "blobs", "sha256")
	prefixes, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, p := range prefixes {
		ents, err := os.ReadDir(filepath.Join(base, p.Name()))
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			// A blob is there once its data is: an upload in progress
			// lives elsewhere (_uploads) until committed.
			if fi, err := os.Stat(filepath.Join(base, p.Name(), e.Name(), "data")); err == nil {
				out["sha256:"+e.Name()] = fi.Size()
			}
		}
	}
	return out, nil
}

// BlobUploads counts the blob uploads the registry completed, from its
// access log (the PUT that closes an upload carries ?digest=).
func (r *Registry) BlobUploads() int {
	n := 0
	for _, l := range strings.Split(r.Log(), "\n") {
		if strings.Contains(l, `"PUT /v2/`) && strings.Contains(l, "/blobs/uploads/") && strings.Contains(l, "digest=") {
			n++
		}
	}
	return n
}

// Stop kills the registry and removes its directory.
func (r *Registry) Stop() error {
	var errs []error
	if r.link != nil {
		errs = append(errs, r.link.Close())
		r.link = nil
	}
	if r.p != nil {
		if err := r.p.stop(syscall.SIGTERM, 15*time.Second); err != nil && !isSignalExit(err) {
			errs = append(errs, fmt.Errorf("stop registry: %w", err))
		}
		r.p = nil
	}
	if r.Dir != "" && r.Dir != "/" {
		if err := os.RemoveAll(r.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isSignalExit: the registry exits on SIGTERM by the signal, not with 0.
func isSignalExit(err error) bool {
	var ee interface{ ExitCode() int }
	return errors.As(err, &ee) && ee.ExitCode() == -1
}

// HasTag says whether the registry answers for repo:tag (a HEAD of its
// manifest), with basic auth if user is set.
func (r *Registry) HasTag(repo, tag, user, password string) bool {
	req, err := http.NewRequest(http.MethodHead, "http://"+r.addr+"/v2/"+repo+"/manifests/"+tag, nil)
	if err != nil {
		return false
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// KillWhenUploading waits until an upload in progress has more than n
// bytes in the registry's storage, then kills the registry: a registry
// that dies in the middle of a transfer. It gives up after five minutes
// (a push makes its layer first, which under emulation, in the cgroup-v2
// VM, takes minutes).
func (r *Registry) KillWhenUploading(ctx context.Context, n int64) error {
	repos := filepath.Join(r.Storage, "docker", "registry", "v2", "repositories")
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
		found := false
		_ = filepath.WalkDir(repos, func(p string, d os.DirEntry, err error) error {
			if err != nil || found {
				return nil
			}
			if d.Name() == "data" && strings.Contains(p, "/_uploads/") {
				if fi, err := d.Info(); err == nil && fi.Size() > n {
					found = true
				}
			}
			return nil
		})
		if found {
			return r.Kill()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return errors.New("no upload of that size began within five minutes")
}

// BlobDownloads lists, from the registry's access log, every blob it
// served whole (GET answered 200), in order, with the bytes it sent.
func (r *Registry) BlobDownloads() []Download {
	var out []Download
	for _, l := range strings.Split(r.Log(), "\n") {
		// 127.0.0.1 - - [date] "GET /v2/NAME/blobs/sha256:HEX HTTP/1.1" 200 BYTES "" "agent"
		_, req, ok := strings.Cut(l, `"GET /v2/`)
		if !ok {
			continue
		}
		path, rest, ok := strings.Cut(req, ` HTTP/1.1" `)
		if !ok {
			continue
		}
		i := strings.Index(path, "/blobs/")
		if i < 0 {
			continue
		}
		var status int
		var n int64
		if _, err := fmt.Sscanf(rest, "%d %d", &status, &n); err != nil || status != http.StatusOK {
			continue
		}
		out = append(out, Download{Digest: path[i+len("/blobs/"):], Bytes: n})
	}
	return out
}

// Download is one blob a registry served.
type Download struct {
	Digest string
	Bytes  int64
}
