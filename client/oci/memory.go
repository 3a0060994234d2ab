//go:build linux

package oci

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// A checkpoint taken with memory carries its memory image (CRIU's files)
// beside the image, not in it: the image stays an ordinary one (its layers
// are its rootfs, which a memory image is not), and the tag names an OCI
// index holding the image's manifest, for its platform, and one artifact
// manifest per memory image, for the platform "unknown/unknown" that
// platform-matching pullers (containerd, nerdctl, the kubelet) skip, as
// they skip BuildKit's attestations. Each artifact's one layer is a
// gzipped tar of the image's files under checkpoint/, as CRI-O's
// checkpoint images hold them.
const (
	// ArtifactTypeMemory is the artifact type of a memory image.
	ArtifactTypeMemory = "application/vnd.branchbox.checkpoint.memory.v1"
	// MediaTypeMemoryLayer is the media type of its layer.
	MediaTypeMemoryLayer = "application/vnd.branchbox.checkpoint.memory.v1.tar+gzip"
	// AnnotationCheckpoint names the checkpoint, on the artifact's manifest
	// and on its entry in the index.
	AnnotationCheckpoint = "io.branchbox.checkpoint"
	// memoryDirInLayer is where the layer holds the image's files.
	memoryDirInLayer = "checkpoint"
	// maxMemoryFiles bounds what a pulled memory image may hold (CRIU
	// writes a few files per process).
	maxMemoryFiles = 100000
)

// referenceType marks an index entry that is not an image, as BuildKit's
// attestations are marked (vnd.docker.reference.type).
const (
	annotationReferenceType   = "vnd.docker.reference.type"
	annotationReferenceDigest = "vnd.docker.reference.digest"
	referenceTypeMemory       = "branchbox-memory"
)

// unknownPlatform is the platform of an index entry that is not an image.
var unknownPlatform = ocispec.Platform{OS: "unknown", Architecture: "unknown"}

// memoryArtifact stores the memory image in dir as an artifact of
// checkpoint name in the content store and returns its manifest.
func memoryArtifact(ctx context.Context, cs content.Store, name, dir string) (ocispec.Descriptor, error) {
	tmp, err := os.CreateTemp("", "branchbox-memory-*.tar.gz")
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	dg := digest.Canonical.Digester()
	if err := tarMemory(io.MultiWriter(tmp, dg.Hash()), dir); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("pack the memory image of checkpoint %s: %w", name, err)
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return ocispec.Descriptor{}, err
	}
	layer := ocispec.Descriptor{MediaType: MediaTypeMemoryLayer, Digest: dg.Digest(), Size: size,
		Annotations: map[string]string{AnnotationCheckpoint: name}}
	if err := writeBlobFrom(ctx, cs, layer, tmp, nil); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("store the memory image of checkpoint %s: %w", name, err)
	}
	empty := ocispec.DescriptorEmptyJSON
	if err := writeBlob(ctx, cs, empty, empty.Data, nil); err != nil {
		return ocispec.Descriptor{}, err
	}
	m := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactTypeMemory, Config: ocispec.Descriptor{MediaType: empty.MediaType, Digest: empty.Digest, Size: empty.Size},
		Layers: []ocispec.Descriptor{layer}, Annotations: map[string]string{AnnotationCheckpoint: name},
	}
	blob, err := json.Marshal(m)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: ArtifactTypeMemory, Digest: digest.FromBytes(blob), Size: int64(len(blob))}
	gc := map[string]string{"containerd.io/gc.ref.content.config": empty.Digest.String(), "containerd.io/gc.ref.content.l.0": layer.Digest.String()}
	if err := writeBlob(ctx, cs, desc, blob, gc); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("store the memory manifest of checkpoint %s: %w", name, err)
	}
	return desc, nil
}

// tarMemory writes the regular files of dir (flat, as CRIU writes an
// image) as a gzipped tar under checkpoint/.
func tarMemory(w io.Writer, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == "stats-restore" {
			continue // a restore's statistics are no part of the image
		}
		if err := tarFile(tw, filepath.Join(dir, e.Name()), path.Join(memoryDirInLayer, e.Name())); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

func tarFile(tw *tar.Writer, src, name string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// memoryIndex stores an index of the image's manifest and its memory
// artifacts (memories, by checkpoint name) and returns it.
func memoryIndex(ctx context.Context, cs content.Store, image ocispec.Descriptor, memories map[string]ocispec.Descriptor, order []string) (ocispec.Descriptor, error) {
	idx := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{image}}
	for _, name := range order {
		d := memories[name]
		p := unknownPlatform
		d.Platform = &p
		d.Annotations = map[string]string{
			AnnotationCheckpoint: name, annotationReferenceType: referenceTypeMemory, annotationReferenceDigest: image.Digest.String(),
		}
		idx.Manifests = append(idx.Manifests, d)
	}
	blob, err := json.Marshal(idx)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(blob), Size: int64(len(blob))}
	gc := map[string]string{}
	for i, m := range idx.Manifests {
		gc["containerd.io/gc.ref.content.m."+strconv.Itoa(i)] = m.Digest.String()
	}
	if err := writeBlob(ctx, cs, desc, blob, gc); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("store the image index: %w", err)
	}
	return desc, nil
}

// fetchMemory gets the memory artifacts the lineage names from the index
// root (in the content store already) with get, which puts a blob in the
// content store (a pull fetches it from the registry, a load finds it
// imported from the archive), and unpacks each into a new directory; it
// returns the directories by checkpoint name and a function that removes
// them. On an error it has removed them already.
func fetchMemory(ctx context.Context, cs content.Store, get images.Handler, root ocispec.Descriptor, lineage Lineage) (_ map[string]string, _ func(), retErr error) {
	dirs := map[string]string{}
	cleanup := func() {
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	defer func() {
		if retErr != nil {
			cleanup()
		}
	}()
	var idx *ocispec.Index
	for _, ck := range lineage.Checkpoints {
		if ck.Memory == "" {
			continue
		}
		if idx == nil {
			if !images.IsIndexType(root.MediaType) {
				return nil, nil, fmt.Errorf("its lineage names memory images but its root is not an index: %w", errdefs.ErrDataLoss)
			}
			idx = &ocispec.Index{}
			if err := readJSON(ctx, cs, root, idx); err != nil {
				return nil, nil, err
			}
		}
		if _, dup := dirs[ck.Name]; dup {
			// (Its directory would be lost to cleanup.)
			return nil, nil, fmt.Errorf("its lineage names checkpoint %s with memory twice: %w", ck.Name, errdefs.ErrDataLoss)
		}
		dir, err := os.MkdirTemp("", "branchbox-memory-")
		if err != nil {
			return nil, nil, err
		}
		dirs[ck.Name] = dir
		if err := memoryInto(ctx, cs, get, idx, ck, dir); err != nil {
			return nil, nil, err
		}
	}
	return dirs, cleanup, nil
}

// memoryInto gets the memory artifact of checkpoint ck, listed in idx,
// checks it is one branchbox made, and unpacks its files into dir.
func memoryInto(ctx context.Context, cs content.Store, get images.Handler, idx *ocispec.Index, ck CheckpointLayer, dir string) error {
	var entry *ocispec.Descriptor
	for i := range idx.Manifests {
		if idx.Manifests[i].Digest == ck.Memory {
			entry = &idx.Manifests[i]
		}
	}
	if entry == nil {
		return fmt.Errorf("the memory image of checkpoint %s (%s) is not in its index: %w", ck.Name, ck.Memory, errdefs.ErrDataLoss)
	}
	h := images.Handlers(get, images.SetChildrenMappedLabels(cs, images.ChildrenHandler(cs), nil))
	if err := images.Dispatch(ctx, h, nil, *entry); err != nil {
		return fmt.Errorf("get the memory image of checkpoint %s: %w", ck.Name, err)
	}
	var m ocispec.Manifest
	if err := readJSON(ctx, cs, *entry, &m); err != nil {
		return err
	}
	if m.ArtifactType != ArtifactTypeMemory || len(m.Layers) != 1 || m.Layers[0].MediaType != MediaTypeMemoryLayer {
		return fmt.Errorf("the memory image of checkpoint %s is not one branchbox made (artifact type %q, %d layers): %w", ck.Name, m.ArtifactType, len(m.Layers), errdefs.ErrInvalidArgument)
	}
	if err := untarMemory(ctx, cs, m.Layers[0], dir); err != nil {
		return fmt.Errorf("unpack the memory image of checkpoint %s: %w", ck.Name, err)
	}
	return nil
}

// untarMemory unpacks a memory layer into dir: regular files directly
// under checkpoint/, nothing else (the layer came from a registry or an
// archive, and is trusted no more than they are).
func untarMemory(ctx context.Context, cs content.Provider, desc ocispec.Descriptor, dir string) error {
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return err
	}
	defer ra.Close()
	return unpackMemory(content.NewReader(ra), dir)
}

// unpackMemory is untarMemory of the gzipped tar read from r.
func unpackMemory(r io.Reader, dir string) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if n >= maxMemoryFiles {
			return fmt.Errorf("more than %d files: %w", maxMemoryFiles, errdefs.ErrInvalidArgument)
		}
		d, base := path.Split(path.Clean(h.Name))
		if h.Typeflag != tar.TypeReg || d != memoryDirInLayer+"/" || base == "" || base == "." || base == ".." || strings.ContainsRune(base, '/') {
			return fmt.Errorf("entry %q: a memory layer holds regular files under %s/ only: %w", h.Name, memoryDirInLayer, errdefs.ErrInvalidArgument)
		}
		f, err := os.OpenFile(filepath.Join(dir, base), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}
