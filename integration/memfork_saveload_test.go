//go:build linux

package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/client/oci"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestMemoryCheckpointSaveLoad saves a checkpoint taken with memory to a
// file and loads it as a new sandbox: the archive holds the index a push
// sends (the image's manifest and the memory image beside it), containerd's
// own import of it gets the runnable image, and a branch forked with
// memory from the loaded checkpoint continues the REPL from the
// checkpoint. A damaged memory image, and one holding what a memory image
// may not, are refused and leave the node as it was.
func TestMemoryCheckpointSaveLoad(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=saved; echo saved >&3`)
	ck, err := sc.Checkpoint(ctx, "", "warm", client.CheckpointWithMemory())
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox goes on: the loaded checkpoint must not be its present.
	replIn(t, ctx, env, sc, branch.RootID, 1, `mem=later; echo later >&3`)
	dir := t.TempDir()
	file := filepath.Join(dir, "mem.tar")
	const name = "docker.io/branchbox/mem:v1"
	if out, errOut, code := branchctl(t, ctx, env, "", "save", "sb@warm", file, "--name", name); code != 0 {
		t.Fatalf("save: exit %d: %s%s", code, out, errOut)
	}
	files := readArchive(t, file)
	root, memory := checkSavedIndex(t, files, name)
	// A path of two checkpoints, the second without memory: an archive
	// of it whose lineage names warm twice fails the load once warm is
	// restored, with its memory image.
	if _, err := sc.Checkpoint(ctx, "", "later"); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := branchctl(t, ctx, env, "", "save", "sb@later", file+".later", "--name", name); code != 0 {
		t.Fatalf("save: exit %d: %s%s", code, out, errOut)
	}
	twice := renameCheckpoint(t, readArchive(t, file+".later"), "later", "warm")

	cc, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	checkSavedIsPushed(t, ctx, env, cc, files, root)

	// containerd's import takes the image for its platform and runs it.
	if out, err := env.Ctr(ctx, "images", "import", "--snapshotter", "branch", file); err != nil {
		t.Fatalf("ctr images import of the archive: %v: %s", err, out)
	}
	if out, err := env.Ctr(ctx, "run", "--rm", "--snapshotter", "branch", name, "imported", "cat", "/data.log"); err != nil || out != "before\nsaved\n" {
		t.Fatalf("the image ctr imported reads %q (%v), want the checkpoint's /data.log", out, err)
	}
	if _, err := env.Ctr(ctx, "images", "rm", name); err != nil {
		t.Fatal(err)
	}

	refusedLoads(t, ctx, env, cc, files, memory, twice)

	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := oci.LoadSandbox(ctx, cc, f, "sb2", "sh", "-c", replScript)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { removeContainer(t, env, "sb2") })
	if res.Ref != name || len(res.Checkpoints) != 1 || res.Checkpoints[0] != "warm" {
		t.Fatalf("load made %+v, want sandbox sb2 of %s with checkpoint warm", res, name)
	}
	forkLoadedMemory(t, ctx, env, ck.MemoryBytes)
}

// forkLoadedMemory starts the loaded sandbox sb2 and forks a branch of it
// with memory from its checkpoint warm, whose REPL must continue from the
// checkpoint's state.
func forkLoadedMemory(t *testing.T, ctx context.Context, env *daemons.Env, memoryBytes int64) {
	t.Helper()
	if _, err := env.Ctr(ctx, "tasks", "start", "-d", "sb2"); err != nil {
		t.Fatal(err)
	}
	waitReplReady(t, ctx, env, "sb2")
	sc2, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "sb2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc2.Close() })
	list, err := sc2.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "warm" || list[0].MemoryBytes != memoryBytes {
		t.Fatalf("loaded checkpoints %+v, want warm with %d bytes of memory", list, memoryBytes)
	}
	kids, err := sc2.Fork(ctx, client.ForkOptions{Count: 1, From: "warm", WithMemory: true})
	if err != nil {
		o, _ := env.Ctr(ctx, "tasks", "ls")
		t.Fatalf("fork --from a loaded checkpoint with memory: %v\n%s", err, o)
	}
	if got := replIn(t, ctx, env, sc2, kids[0].ID, 1, `echo "mem=$mem k=$k"`); got != "mem=saved k=1\n" {
		t.Fatalf("branch of the loaded checkpoint continues with %q, want mem=saved k=1", got)
	}
	if got := mustRun(t, ctx, sc2, kids[0].ID, "cat", "/data.log"); got != "before\nsaved\n" {
		t.Fatalf("branch of the loaded checkpoint: /data.log %q", got)
	}
	if _, err := sc2.Abort(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
}

// checkSavedIsPushed pushes the state saved in files (sb@warm): the
// index pushed is the one saved (its manifest differs only by its config,
// whose history entry has the time of the push).
func checkSavedIsPushed(t *testing.T, ctx context.Context, env *daemons.Env, cc *containerd.Client, files []archiveFile, root ocispec.Descriptor) {
	t.Helper()
	reg := startRegistry(t, daemons.RegistryConfig{})
	out, errOut, code := branchctl(t, ctx, env, "", "push", "sb@warm", reg.Ref("branchbox/mem:v1"), "--plain-http", "--json")
	var pushed struct{ Root, Manifest string }
	if code != 0 || json.Unmarshal([]byte(out), &pushed) != nil {
		t.Fatalf("push of the saved checkpoint: exit %d: %s%s", code, out, errOut)
	}
	b, err := content.ReadBlob(ctx, cc.ContentStore(), ocispec.Descriptor{Digest: digest.Digest(pushed.Root)})
	if err != nil {
		t.Fatal(err)
	}
	var saved ocispec.Index
	unmarshalFile(t, files, blobName(root.Digest), &saved)
	b = bytes.ReplaceAll(b, []byte(pushed.Manifest), []byte(saved.Manifests[0].Digest))
	if got := fileOf(files, blobName(root.Digest)).data; !bytes.Equal(b, got) {
		t.Fatalf("the index pushed (its manifest's digest replaced by the saved one's) is\n%s\nthe saved one\n%s", b, got)
	}
	// Without the record of the push, nothing of the image is left on
	// the node: loads below get the memory image from the archive only.
	if _, err := env.Ctr(ctx, "images", "rm", reg.Ref("branchbox/mem:v1")); err != nil {
		t.Fatal(err)
	}
}

// refusedLoads loads files (a saved archive) with its memory layer
// (memory) damaged, and replaced by one holding a symlink (its digests
// all made right), and loads twice (an archive whose second checkpoint
// has the first's name): each is refused, and leaves the node as it was
// (no sandbox, rootfs or checkpoint, nor a checkpoint's memory image),
// with no memory image unpacked left in the temporary directory.
func refusedLoads(t *testing.T, ctx context.Context, env *daemons.Env, cc *containerd.Client, files []archiveFile, memory ocispec.Descriptor, twice []archiveFile) {
	t.Helper()
	collectGarbage(t, ctx, cc)
	before := stateOf(t, ctx, env, cc)
	tmpBefore := memoryTempDirs(t)
	damaged := replaceBlob(t, files, memory.Digest, nil)
	symlink := replaceBlob(t, files, memory.Digest, memoryLayer(t, &tar.Header{Typeflag: tar.TypeSymlink, Name: "checkpoint/pages-1.img", Linkname: "/etc/shadow"}))
	for _, c := range []struct {
		name  string
		files []archiveFile
		kind  func(error) bool
		want  string
	}{
		{"a damaged memory image", damaged, errdefs.IsDataLoss, "the memory image of checkpoint warm), or holds it damaged"},
		{"a memory image holding a symlink", symlink, errdefs.IsInvalidArgument, "regular files under checkpoint/ only"},
		{"a checkpoint named twice", twice, errdefs.IsAlreadyExists, `a checkpoint named "warm" already exists`},
	} {
		path := filepath.Join(t.TempDir(), "bad.tar")
		writeArchive(t, path, c.files)
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = oci.LoadSandbox(ctx, cc, f, "bad", "sh")
		f.Close()
		if err == nil || !c.kind(err) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("load of %s: %v, want an error with %q", c.name, err, c.want)
		}
		t.Logf("load of %s: %v", c.name, err)
		assertUnchanged(t, ctx, env, cc, before, "a load of "+c.name)
		if left := memoryTempDirs(t); len(left) != len(tmpBefore) {
			t.Fatalf("after a load of %s the temporary directory holds %v, before %v", c.name, left, tmpBefore)
		}
	}
}

// checkSavedIndex checks the archive names the image as an index of its
// manifest and one memory image, as a push sends them, with every blob
// they refer to, and returns the index and the memory image's layer.
func checkSavedIndex(t *testing.T, files []archiveFile, name string) (root, memory ocispec.Descriptor) {
	t.Helper()
	var top ocispec.Index
	unmarshalFile(t, files, "index.json", &top)
	if len(top.Manifests) != 1 || top.Manifests[0].Annotations["io.containerd.image.name"] != name || top.Manifests[0].MediaType != ocispec.MediaTypeImageIndex {
		t.Fatalf("the archive's index.json names %+v, want one index named %s", top.Manifests, name)
	}
	root = top.Manifests[0]
	var idx ocispec.Index
	unmarshalFile(t, files, blobName(root.Digest), &idx)
	if len(idx.Manifests) != 2 || idx.Manifests[1].ArtifactType != oci.ArtifactTypeMemory || idx.Manifests[1].Platform == nil ||
		idx.Manifests[1].Platform.OS != "unknown" || idx.Manifests[1].Annotations[oci.AnnotationCheckpoint] != "warm" ||
		idx.Manifests[1].Annotations["vnd.docker.reference.digest"] != idx.Manifests[0].Digest.String() {
		t.Fatalf("the saved index holds %+v, want the image's manifest and the memory image of warm", idx.Manifests)
	}
	var img, art ocispec.Manifest
	unmarshalFile(t, files, blobName(idx.Manifests[0].Digest), &img)
	unmarshalFile(t, files, blobName(idx.Manifests[1].Digest), &art)
	for _, d := range append(append([]ocispec.Descriptor{img.Config, art.Config}, img.Layers...), art.Layers...) {
		if fileOf(files, blobName(d.Digest)) == nil {
			t.Fatalf("the archive lacks blob %s (%s)", d.Digest, d.MediaType)
		}
	}
	if len(art.Layers) != 1 || art.Layers[0].MediaType != oci.MediaTypeMemoryLayer {
		t.Fatalf("the memory image's layers: %+v", art.Layers)
	}
	return root, art.Layers[0]
}

// replaceBlob returns files with blob old replaced by data (or damaged,
// for nil data) and, for new data, every manifest, index and lineage
// annotation up to index.json rewritten to refer to it, so that only its
// content is wrong.
func replaceBlob(t *testing.T, files []archiveFile, old digest.Digest, data []byte) []archiveFile {
	t.Helper()
	out := append([]archiveFile{}, files...)
	at := fileOf(out, blobName(old))
	if data == nil {
		damaged := bytes.Clone(at.data)
		damaged[len(damaged)/2] ^= 0xff
		at.data = damaged
		return out
	}
	at.name, at.data = blobName(digest.FromBytes(data)), data
	renamed := map[string]ocispec.Descriptor{old.String(): {Digest: digest.FromBytes(data), Size: int64(len(data))}}
	// Until nothing changes: the artifact's manifest names the layer, the
	// image's manifest names the artifact (its lineage), the index both.
	for changed := true; changed; {
		changed = false
		for i := range out {
			f := &out[i]
			if f.name != "index.json" && (!strings.HasPrefix(f.name, "blobs/") || f.data[0] != '{') {
				continue
			}
			b := renameDigests(t, f.data, renamed)
			if bytes.Equal(b, f.data) {
				continue
			}
			changed = true
			f.data = b
			if f.name != "index.json" {
				was := digest.Digest("sha256:" + strings.TrimPrefix(f.name, "blobs/sha256/"))
				renamed[was.String()] = ocispec.Descriptor{Digest: digest.FromBytes(b), Size: int64(len(b))}
				f.name = blobName(digest.FromBytes(b))
			}
		}
	}
	return out
}

// renameDigests rewrites a JSON document: each descriptor of a digest in
// renamed gets the new digest and size, and each string naming one (a
// lineage annotation) the new digest. A document naming none is returned
// as it is.
func renameDigests(t *testing.T, doc []byte, renamed map[string]ocispec.Descriptor) []byte {
	t.Helper()
	found := false
	for o := range renamed {
		found = found || bytes.Contains(doc, []byte(o))
	}
	if !found {
		return doc
	}
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	// A blob renamed twice (the index names two renamed blobs) is named
	// by its last name.
	final := func(d string) (ocispec.Descriptor, bool) {
		n, ok := renamed[d]
		for ok {
			next, again := renamed[n.Digest.String()]
			if !again {
				break
			}
			n = next
		}
		return n, ok
	}
	var walk func(v any) any
	walk = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			if n, ok := final(fmtString(v["digest"])); ok {
				v["digest"], v["size"] = n.Digest.String(), n.Size
			}
			for k, e := range v {
				v[k] = walk(e)
			}
		case []any:
			for i, e := range v {
				v[i] = walk(e)
			}
		case string:
			for o := range renamed {
				n, _ := final(o)
				v = strings.ReplaceAll(v, o, n.Digest.String())
			}
			return v
		}
		return v
	}
	b, err := json.Marshal(walk(v))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fmtString(v any) string { s, _ := v.(string); return s }

// renameCheckpoint returns files (a saved archive) with checkpoint from
// renamed to to in its manifest's lineage, every digest made right.
func renameCheckpoint(t *testing.T, files []archiveFile, from, to string) []archiveFile {
	t.Helper()
	var top, idx ocispec.Index
	unmarshalFile(t, files, "index.json", &top)
	unmarshalFile(t, files, blobName(top.Manifests[0].Digest), &idx)
	var m ocispec.Manifest
	unmarshalFile(t, files, blobName(idx.Manifests[0].Digest), &m)
	lineage, ok := oci.LineageOf(m.Annotations)
	if !ok || len(lineage.Checkpoints) != 2 || lineage.Checkpoints[1].Name != from || lineage.Checkpoints[0].Memory == "" {
		t.Fatalf("the saved lineage is %+v, want warm with memory, then %s", lineage.Checkpoints, from)
	}
	lineage.Checkpoints[1].Name = to
	m.Annotations[oci.AnnotationCheckpoints] = lineage.Annotations()[oci.AnnotationCheckpoints]
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return replaceBlob(t, files, idx.Manifests[0].Digest, b)
}

// memoryLayer is a memory image's layer (a gzipped tar) of one entry h.
func memoryLayer(t *testing.T, h *tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// memoryTempDirs lists the memory images unpacked in the temporary
// directory.
func memoryTempDirs(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(os.TempDir(), "branchbox-memory-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// readArchive reads the files of a tar.
func readArchive(t *testing.T, path string) []archiveFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var files []archiveFile
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, archiveFile{h.Name, b})
	}
}

func blobName(d digest.Digest) string { return "blobs/" + d.Algorithm().String() + "/" + d.Encoded() }

func fileOf(files []archiveFile, name string) *archiveFile {
	for i := range files {
		if files[i].name == name {
			return &files[i]
		}
	}
	return nil
}

func unmarshalFile(t *testing.T, files []archiveFile, name string, v any) {
	t.Helper()
	f := fileOf(files, name)
	if f == nil {
		t.Fatalf("the archive has no %s", name)
	}
	if err := json.Unmarshal(f.data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}
