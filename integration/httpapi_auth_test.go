//go:build linux

package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/ociimage"
)

// TestHTTPAPIAuthAndBounds checks what keeps clients of `branchctl serve`
// apart and bounded: over TCP a bearer token is required, a token reaches
// only its namespaces (a client with another namespace's token sees and
// touches nothing of this one), the token file is re-read when it changes,
// TLS is required off loopback, and request bodies, concurrent execs and
// concurrent streams are bounded per client.
func TestHTTPAPIAuthAndBounds(t *testing.T) {
	ctx, env := startEnv(t)
	importImage(t, ctx, env, "branch")
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	const (
		tokA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		tokB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
		tokC = "cccccccccccccccccccccccccccccccc"
	)
	writeTokens := func(lines string) {
		t.Helper()
		// Written anew and renamed, as a rotation would be.
		tmp := tokens + ".new"
		if err := os.WriteFile(tmp, []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, tokens); err != nil {
			t.Fatal(err)
		}
	}
	writeTokens(tokA + " " + env.Namespace + "\n" + tokB + " other\n")
	srv := startServe(t, env, true, "--token-file", tokens, "--max-body", "65536", "--max-execs", "2", "--max-streams", "1")
	local := newUnixAPI(t, srv)
	removeSandboxesAtEnd(t, srv, env.Namespace)
	a := newTCPAPI(t, srv, tokA)
	b := newTCPAPI(t, srv, tokB)
	anon := newTCPAPI(t, srv, "")
	ns := "/v1/namespaces/" + env.Namespace
	sb := ns + "/sandboxes/sb"

	local.must(ctx, 201, "POST", ns+"/sandboxes", map[string]any{"id": "sb", "image": ociimage.ImageRef, "args": []string{"sleep", "100000"}})
	defer local.call(context.WithoutCancel(ctx), "DELETE", sb, nil)

	// No token, a wrong one, a token of another scheme: 401.
	anon.fails(ctx, 401, "permission-denied", "GET", ns+"/sandboxes", nil)
	newTCPAPI(t, srv, "not-a-token-at-all-but-long").fails(ctx, 401, "permission-denied", "GET", ns+"/sandboxes", nil)
	// Namespace b's token sees and touches nothing of this namespace.
	b.fails(ctx, 403, "permission-denied", "GET", ns+"/sandboxes", nil)
	b.fails(ctx, 403, "permission-denied", "POST", sb+"/fork", map[string]any{"count": 1})
	b.fails(ctx, 403, "permission-denied", "GET", sb+"/branches/0/files?path=/etc/passwd", nil)
	b.fails(ctx, 403, "permission-denied", "DELETE", sb, nil)
	if r := b.must(ctx, 200, "GET", "/v1/namespaces/other/sandboxes", nil); !strings.Contains(string(r.Body), `"sandboxes":[]`) {
		t.Fatalf("namespace other lists: %s", r.Body)
	}
	b.fails(ctx, 404, "not-found", "POST", "/v1/namespaces/other/sandboxes/sb/fork", map[string]any{"count": 1})
	var kids apiBranches
	a.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 1}).decode(t, &kids)
	br := sb + "/branches/" + kids.Branches[0].ID

	// Bodies: a file over --max-body is refused.
	a.fails(ctx, 429, "resource-exhausted", "PUT", br+"/files?path=/big", make([]byte, 100<<10))
	a.must(ctx, 200, "PUT", br+"/files?path=/small", make([]byte, 60<<10))

	// Execs: two run; a third of the same client is refused, another
	// client's is not; a client that leaves kills its process.
	ectx, ecancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ectx, "POST", srv.TCP+br+"/exec", strings.NewReader(`{"args":["sleep","1000"]}`))
			req.Header.Set("Authorization", "Bearer "+tokA)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = resp.Body.Read(make([]byte, 1))
				<-ectx.Done()
				resp.Body.Close()
			}
		}()
	}
	waitPids := func(want int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			var tree struct {
				Branches []struct {
					ID   string
					Pids []int
				} `json:"branches"`
			}
			local.must(ctx, 200, "GET", sb+"/tree", nil).decode(t, &tree)
			var pids []int
			for _, c := range tree.Branches {
				if c.ID == kids.Branches[0].ID {
					pids = c.Pids
				}
			}
			if len(pids) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("branch has pids %v, want %d", pids, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitPids(3) // its init and the two sleeps
	a.fails(ctx, 429, "resource-exhausted", "POST", br+"/exec", map[string]any{"args": []string{"true"}})
	local.must(ctx, 200, "POST", br+"/exec", map[string]any{"args": []string{"true"}})
	ecancel()
	wg.Wait()
	waitPids(1)
	// The server frees a client's exec when its handler has ended, which
	// can be just after the branch's processes are gone: until then only
	// the limit's refusal is right.
	for deadline := time.Now().Add(10 * time.Second); ; {
		r := a.call(ctx, "POST", br+"/exec", map[string]any{"args": []string{"true"}})
		if r.Status == 200 {
			break
		}
		if r.Status != 429 || time.Now().After(deadline) {
			t.Fatalf("exec once the two ended: want 200, got %d: %s", r.Status, r.Body)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Streams: one event stream per client.
	sctx, scancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(sctx, "GET", srv.TCP+ns+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+tokA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("events: %v %v", resp, err)
	}
	a.fails(ctx, 429, "resource-exhausted", "GET", ns+"/events", nil)
	scancel()
	resp.Body.Close()

	// Rotation: tokA goes, tokC comes, without a restart.
	writeTokens(tokC + " " + env.Namespace + "\n")
	a.fails(ctx, 401, "permission-denied", "GET", ns+"/sandboxes", nil)
	newTCPAPI(t, srv, tokC).must(ctx, 200, "GET", ns+"/sandboxes", nil)
	// A broken file keeps no token valid.
	writeTokens(tokC + "\n")
	newTCPAPI(t, srv, tokC).fails(ctx, 401, "permission-denied", "GET", ns+"/sandboxes", nil)
	writeTokens(tokC + " " + env.Namespace + "\n")

	// TCP off loopback needs TLS; with it, the API is served over HTTPS.
	out, err := exec.CommandContext(ctx, filepath.Join(env.BinDir, "branchctl"), "serve", "--address", env.Address, "--socket", "",
		"--tcp", "0.0.0.0:0", "--token-file", tokens).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a loopback address") {
		t.Fatalf("serve --tcp 0.0.0.0:0 without TLS: %v: %s", err, out)
	}
	cert, key, pool := selfSigned(t, dir)
	tsrv := startServe(t, env, true, "--token-file", tokens, "--tls-cert", cert, "--tls-key", key)
	if !strings.HasPrefix(tsrv.TCP, "https://") {
		t.Fatalf("with TLS the server says %q", tsrv.TCP)
	}
	tc := newTCPAPI(t, tsrv, tokC)
	tc.hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	tc.must(ctx, 200, "GET", ns+"/sandboxes", nil)
}

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t testing.TB, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "branchbox test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(c)
	return certFile, keyFile, pool
}
