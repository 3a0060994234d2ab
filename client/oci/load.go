//go:build linux

package oci

import (
	"context"
	"fmt"
	"io"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Load imports an image layout tar Save (or any OCI exporter) wrote and
// unpacks its images into the named snapshotter, ready to run.
//
// The archive's blobs are imported and every image unpacked (which checks
// each layer against the diff id its config gives) under a lease, before
// any image record is written: an archive that fails at any point, a
// damaged blob, a wrong diff id, an archive cut short, a cancelled load,
// leaves an image of the same name as it was, and the lease's end takes
// the content and snapshots the load made. The records come last, all or
// none.
func Load(ctx context.Context, client *containerd.Client, r io.Reader, snapshotter string) ([]string, error) {
	names, _, err := load(ctx, client, r, snapshotter, "", nil)
	return names, err
}

// LoadSandbox is Load of an archive of one image into the branch
// snapshotter, which then becomes a sandbox container named sandbox
// (running args, or the image's command), not started, as Pull makes one:
// with the checkpoints on its path restored, those taken with memory with
// their memory images (Save puts them in the archive), so that rollback,
// fork --from and fork --from --memory work here. Its result's Ref is the
// image's name. A load that fails, at any point, leaves the node as it was
// (Load), with no sandbox, rootfs or checkpoint of it.
func LoadSandbox(ctx context.Context, client *containerd.Client, r io.Reader, sandbox string, args ...string) (PullResult, error) {
	_, res, err := load(ctx, client, r, snapshotterName, sandbox, args)
	return res, err
}

// load is Load, and LoadSandbox when sandbox is not empty.
func load(ctx context.Context, client *containerd.Client, r io.Reader, snapshotter, sandbox string, args []string) (_ []string, _ PullResult, retErr error) {
	if sandbox != "" {
		if err := sandboxNameFree(ctx, client, sandbox); err != nil {
			return nil, PullResult{}, fmt.Errorf("load: %w", err)
		}
	}
	ctx, end, err := holdLease(ctx, client)
	if err != nil {
		return nil, PullResult{}, fmt.Errorf("load: %w", err)
	}
	defer func() { end(retErr) }()
	imgs, err := importArchive(ctx, client, r, snapshotter)
	if err != nil {
		return nil, PullResult{}, fmt.Errorf("load: %w", err)
	}
	var res PullResult
	if sandbox != "" {
		if len(imgs) != 1 {
			return nil, PullResult{}, fmt.Errorf("load: the archive holds %d images; a sandbox is made of one: %w", len(imgs), errdefs.ErrInvalidArgument)
		}
		var undo func()
		// The memory images were imported with the rest: got from the
		// content store, and checked there.
		res, undo, err = newSandbox(ctx, client, imgs[0], sandbox, archiveBlob(client.ContentStore()), args)
		if err != nil {
			return nil, PullResult{}, fmt.Errorf("load %s: %w", imgs[0].Name, err)
		}
		defer func() {
			if retErr != nil {
				undo()
			}
		}()
		res.Ref = imgs[0].Name
	}
	// An image of the same name keeps its labels, as containerd's import
	// keeps them.
	if err := recordImages(ctx, client.ImageService(), imgs, "target"); err != nil {
		return nil, PullResult{}, fmt.Errorf("load: %w", err)
	}
	names := make([]string, len(imgs))
	for i, img := range imgs {
		names[i] = img.Name
	}
	return names, res, nil
}

// importArchive imports the archive's blobs and unpacks the images it
// names into snapshotter, and returns them (not recorded).
func importArchive(ctx context.Context, client *containerd.Client, r io.Reader, snapshotter string) ([]images.Image, error) {
	cs := client.ContentStore()
	index, err := archive.ImportIndex(ctx, cs, r)
	if err != nil {
		return nil, fmt.Errorf("import the archive: %w", err)
	}
	imgs, err := archiveImages(ctx, cs, index, platforms.Default())
	if err != nil {
		return nil, err
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("the archive names no image: %w", errdefs.ErrInvalidArgument)
	}
	for _, i := range imgs {
		img := containerd.NewImageWithPlatform(client, i, platforms.Default())
		if err := img.Unpack(ctx, snapshotter); err != nil {
			return nil, fmt.Errorf("unpack %s into snapshotter %s: %w", i.Name, snapshotter, err)
		}
	}
	return imgs, nil
}

// archiveImages walks an imported archive's index as containerd's import
// does (Client.Import, which also writes the image records, and so cannot
// be used here): the images its index names, by the
// io.containerd.image.name annotation or the OCI ref name, and the
// garbage collector's labels from each blob to its children, for the
// platform's manifests and branchbox's memory images beside them (which
// containerd's import leaves out, and so collects).
func archiveImages(ctx context.Context, cs content.Store, index ocispec.Descriptor, platform platforms.MatchComparer) ([]images.Image, error) {
	var imgs []images.Image
	blob := archiveBlob(cs)
	var handler images.HandlerFunc = func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		if desc.Digest != index.Digest {
			if _, err := blob(ctx, desc); err != nil {
				return nil, err
			}
			return images.Children(ctx, cs, desc)
		}
		var idx ocispec.Index
		if err := readJSON(ctx, cs, desc, &idx); err != nil {
			return nil, fmt.Errorf("read the archive's index: %w", err)
		}
		for _, m := range idx.Manifests {
			name := m.Annotations[images.AnnotationImageName]
			if name == "" {
				name = m.Annotations[ocispec.AnnotationRefName]
			}
			if name != "" {
				imgs = append(imgs, images.Image{Name: name, Target: m})
			}
		}
		return idx.Manifests, nil
	}
	h := images.SetChildrenLabels(cs, platformOrMemory(handler, platform))
	if err := images.WalkNotEmpty(ctx, h, index); err != nil {
		return nil, err
	}
	return imgs, nil
}

// platformOrMemory is images.FilterPlatforms that also keeps the entries
// of an index that are branchbox's memory images (platform unknown/unknown).
func platformOrMemory(h images.Handler, platform platforms.MatchComparer) images.HandlerFunc {
	return func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		children, err := h.Handle(ctx, desc)
		if err != nil {
			return children, err
		}
		var kept []ocispec.Descriptor
		for _, d := range children {
			if d.Platform == nil || platform.Match(*d.Platform) || d.Annotations[annotationReferenceType] == referenceTypeMemory {
				kept = append(kept, d)
			}
		}
		return kept, nil
	}
}

// archiveBlob finds a blob in the content store, where the archive's
// blobs were imported under the digests of their bytes, whatever their
// file names say: a damaged one is missing there.
func archiveBlob(cs content.InfoProvider) images.HandlerFunc {
	return func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		_, err := cs.Info(ctx, desc.Digest)
		if err == nil || !errdefs.IsNotFound(err) {
			return nil, err
		}
		what := desc.MediaType
		if ck := desc.Annotations[AnnotationCheckpoint]; ck != "" {
			what = "the memory image of checkpoint " + ck
		}
		return nil, fmt.Errorf("the archive lacks blob %s (%s), or holds it damaged: %w", desc.Digest, what, errdefs.ErrDataLoss)
	}
}
