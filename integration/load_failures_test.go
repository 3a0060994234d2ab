//go:build linux

package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/opencontainers/image-spec/identity"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/client/oci"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// testImage is an image for an archive: uncompressed tar layers, bottom
// first, and the diff ids its config gives them (those of the layers if
// nil: a config that lies about a layer when set).
type testImage struct {
	ref     string
	layers  [][]byte
	diffIDs []digest.Digest
}

// archiveFile is one file of an OCI layout tar.
type archiveFile struct {
	name string
	data []byte
}

// layoutFiles are the files of an OCI layout holding imgs, each named by
// its ref as Save names them, blobs last.
func layoutFiles(t *testing.T, imgs ...testImage) []archiveFile {
	t.Helper()
	blob := func(b []byte) archiveFile {
		return archiveFile{"blobs/sha256/" + digest.FromBytes(b).Encoded(), b}
	}
	desc := func(mt string, b []byte) ocispec.Descriptor {
		return ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b))}
	}
	var blobs []archiveFile
	index := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex}
	for _, img := range imgs {
		cfg := ocispec.Image{
			Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
			Config:   ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Cmd: []string{"/bin/sh"}},
			RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: img.diffIDs},
		}
		m := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest}
		for _, l := range img.layers {
			if img.diffIDs == nil {
				cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, digest.FromBytes(l))
			}
			m.Layers = append(m.Layers, desc(ocispec.MediaTypeImageLayer, l))
			blobs = append(blobs, blob(l))
		}
		cfgBlob, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m.Config = desc(ocispec.MediaTypeImageConfig, cfgBlob)
		mBlob, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		md := desc(ocispec.MediaTypeImageManifest, mBlob)
		md.Platform = &cfg.Platform
		md.Annotations = map[string]string{"io.containerd.image.name": img.ref, ocispec.AnnotationRefName: img.ref[strings.LastIndexByte(img.ref, ':')+1:]}
		index.Manifests = append(index.Manifests, md)
		blobs = append(blobs, blob(cfgBlob), blob(mBlob))
	}
	indexBlob, err := json.Marshal(index)
	if err != nil {
		t.Fatal(err)
	}
	layout, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	return append([]archiveFile{{ocispec.ImageLayoutFile, layout}, {"index.json", indexBlob}}, blobs...)
}

// writeArchive writes files as a tar at path, each blob once.
func writeArchive(t *testing.T, path string, files []archiveFile) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, f := range files {
		if seen[f.name] {
			continue
		}
		seen[f.name] = true
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// cancelReader cancels a context once more than n bytes were read through
// it (never if n is negative).
type cancelReader struct {
	r      io.Reader
	n      int64
	cancel context.CancelFunc
}

func (c *cancelReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	if c.n >= 0 {
		if c.n -= int64(n); c.n < 0 {
			c.cancel()
		}
	}
	return n, err
}

// TestLoadFailuresLeaveNodeAsBefore: a load that fails, at whatever
// point, leaves the node as it was: image records (an image of the same
// name keeps its target and runs as before), content (the store's records
// and files), leases, snapshots (containerd's and the branch
// snapshotter's own Walk) and the snapshotter's directories. Failure
// points: a layer whose diff id the config gives wrongly (found only by
// unpacking it), a blob whose bytes are not its digest's, an archive cut
// off in the middle of a blob, an archive of two images whose second is
// bad (the first is not kept either), an archive that names no image, a
// snapshotter that is not there, and
// a load cancelled while reading the archive and while unpacking a layer.
func TestLoadFailuresLeaveNodeAsBefore(t *testing.T) {
	ctx, env, cc := shimEnv(t)
	dir := t.TempDir()
	busybox, err := ociimage.BusyboxLayer()
	if err != nil {
		t.Fatal(err)
	}
	fileLayer := func(name string, data []byte) []byte {
		t.Helper()
		l, err := ociimage.FileLayer(name, 0o644, data)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	const app = "docker.io/library/app:v1"
	v1 := fileLayer("app", []byte("v1\n"))
	v2 := fileLayer("app", []byte("v2\n"))
	// A layer no image on the node has: unpacked (a new committed
	// snapshot, new content) before the bad layer above it fails.
	noise := make([]byte, 256<<10)
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	fresh := fileLayer("fresh", noise)

	good := filepath.Join(dir, "good.tar")
	writeArchive(t, good, layoutFiles(t, testImage{ref: app, layers: [][]byte{busybox, v1}}))
	if out, errOut, code := branchctl(t, ctx, env, "", "load", good); code != 0 {
		t.Fatalf("load of the good archive: exit %d: %s%s", code, out, errOut)
	}
	runs := 0
	readApp := func() string {
		t.Helper()
		runs++
		out, err := env.Ctr(ctx, "run", "--rm", "--snapshotter", "branch", app, fmt.Sprintf("check%d", runs), "cat", "/app")
		if err != nil {
			t.Fatalf("run %s: %v: %s", app, err, out)
		}
		return out
	}
	if got := readApp(); got != "v1\n" {
		t.Fatalf("%s reads %q, want v1", app, got)
	}
	collectGarbage(t, ctx, cc)
	before := stateOf(t, ctx, env, cc)

	badDiffID := testImage{ref: app, layers: [][]byte{busybox, fresh, v2},
		diffIDs: []digest.Digest{digest.FromBytes(busybox), digest.FromBytes(fresh), digest.FromString("not the layer")}}
	corrupt := layoutFiles(t, testImage{ref: app, layers: [][]byte{busybox, fresh, v2}})
	for i, f := range corrupt {
		if f.name == "blobs/sha256/"+digest.FromBytes(fresh).Encoded() {
			damaged := bytes.Clone(f.data)
			damaged[len(damaged)/2] ^= 0xff
			corrupt[i].data = damaged
		}
	}
	for _, c := range []struct {
		name  string
		files []archiveFile
		cut   bool // the archive ends in the middle of layer fresh
		want  string
	}{
		{"a wrong diff id", layoutFiles(t, badDiffID), false, "diff"},
		{"a corrupt blob", corrupt, false, "damaged"},
		{"a truncated archive", layoutFiles(t, testImage{ref: app, layers: [][]byte{busybox, v2, fresh}}), true, ""},
		{"an archive that names no image", layoutFiles(t, testImage{layers: [][]byte{busybox, fresh}}), false, "names no image"},
		{"two images, the second bad", layoutFiles(t, testImage{ref: "docker.io/library/other:v1", layers: [][]byte{busybox, fresh}}, badDiffID), false, "diff"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".tar")
		data := writeArchive(t, path, c.files)
		if c.cut {
			at := bytes.Index(data, fresh)
			if at < 0 {
				t.Fatal("layer fresh not in the archive")
			}
			if err := os.Truncate(path, int64(at+len(fresh)/2)); err != nil {
				t.Fatal(err)
			}
		}
		out, errOut, code := branchctl(t, ctx, env, "", "load", path)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Fatalf("load of %s: exit %d, want an error with %q: %s%s", c.name, code, c.want, out, errOut)
		}
		t.Logf("load of %s: %s", c.name, strings.TrimSpace(errOut))
		assertUnchanged(t, ctx, env, cc, before, "a load of "+c.name)
	}

	// A snapshotter that is not there: found when unpacking, once the
	// blobs are in.
	if out, errOut, code := branchctl(t, ctx, env, "", "load", good, "--snapshotter", "nosuch"); code == 0 || !strings.Contains(errOut, "nosuch") {
		t.Fatalf("load into snapshotter nosuch: exit %d: %s%s", code, out, errOut)
	}
	assertUnchanged(t, ctx, env, cc, before, "a load into a snapshotter that is not there")

	// Cancelled: in the middle of reading the archive, and while a layer
	// is being unpacked: 16 MB in 20,000 files, whose unpacking takes
	// long enough for the poll below to see it on a loaded machine (one
	// 16 MB file was unpacked between two polls).
	big := make([]byte, 16<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	bigLayer := manyFilesLayer(t, big, 20000)
	data := writeArchive(t, filepath.Join(dir, "cancel.tar"), layoutFiles(t, testImage{ref: app, layers: [][]byte{busybox, fresh, bigLayer, v2}}))
	sn := cc.SnapshotService("branch")
	unpacking := func() bool {
		found := false
		_ = sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
			found = found || (i.Kind == snapshots.KindActive && strings.HasPrefix(i.Name, "extract-") && strings.HasSuffix(i.Name, identity.ChainID([]digest.Digest{digest.FromBytes(busybox), digest.FromBytes(fresh), digest.FromBytes(bigLayer)}).String()))
			return nil
		})
		return found
	}
	for _, c := range []struct {
		name string
		at   int64 // bytes read before the cancel; -1: once the big layer is being unpacked
	}{{"while reading the archive", int64(bytes.Index(data, fresh) + len(fresh)/2)}, {"while unpacking", -1}} {
		lctx, cancelCtx := context.WithCancel(ctx)
		var cancelled atomic.Bool
		cancel := func() { cancelled.Store(true); cancelCtx() }
		stop := make(chan struct{})
		if c.at < 0 {
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
					if unpacking() {
						cancel()
						return
					}
				}
			}()
		}
		_, err := oci.Load(lctx, cc, &cancelReader{r: bytes.NewReader(data), n: c.at, cancel: cancel}, "branch")
		close(stop)
		if err == nil {
			t.Fatalf("a load cancelled %s succeeded", c.name)
		}
		// (containerd's client may report the cut stream, an EOF, rather
		// than the cancel.)
		if !cancelled.Load() {
			t.Fatalf("a load to be cancelled %s failed before it was: %v", c.name, err)
		}
		cancelCtx()
		t.Logf("load cancelled %s: %v", c.name, err)
		assertUnchanged(t, ctx, env, cc, before, "a load cancelled "+c.name)
	}

	if got := readApp(); got != "v1\n" {
		t.Fatalf("after the failed loads %s reads %q, want v1 still", app, got)
	}
	// The same archive loads once whole, and replaces the image.
	ok := filepath.Join(dir, "v2.tar")
	writeArchive(t, ok, layoutFiles(t, testImage{ref: app, layers: [][]byte{busybox, fresh, v2}}))
	if out, errOut, code := branchctl(t, ctx, env, "", "load", ok); code != 0 {
		t.Fatalf("load of the good v2 archive: exit %d: %s%s", code, out, errOut)
	}
	if got := readApp(); got != "v2\n" {
		t.Fatalf("after loading v2 %s reads %q", app, got)
	}
}

// manyFilesLayer is a layer (an uncompressed tar) holding data cut into n
// files, under big/.
func manyFilesLayer(t *testing.T, data []byte, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "big/", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	size := len(data) / n
	for i := 0; i < n; i++ {
		part := data[i*size : (i+1)*size]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("big/%05d", i), Mode: 0o644, Size: int64(len(part))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(part); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
