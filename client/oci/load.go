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
func Load(ctx context.Context, client *containerd.Client, r io.Reader, snapshotter string) (_ []string, retErr error) {
	ctx, end, err := holdLease(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	defer func() { end(retErr) }()
	cs := client.ContentStore()
	index, err := archive.ImportIndex(ctx, cs, r)
	if err != nil {
		return nil, fmt.Errorf("load: import the archive: %w", err)
	}
	imgs, err := archiveImages(ctx, cs, index, platforms.Default())
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("load: the archive names no image: %w", errdefs.ErrInvalidArgument)
	}
	var names []string
	for _, i := range imgs {
		img := containerd.NewImageWithPlatform(client, i, platforms.Default())
		if err := img.Unpack(ctx, snapshotter); err != nil {
			return nil, fmt.Errorf("load: unpack %s into snapshotter %s: %w", i.Name, snapshotter, err)
		}
		names = append(names, i.Name)
	}
	// An image of the same name keeps its labels, as containerd's import
	// keeps them.
	if err := recordImages(ctx, client.ImageService(), imgs, "target"); err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	return names, nil
}

// archiveImages walks an imported archive's index as containerd's import
// does (Client.Import, which also writes the image records, and so cannot
// be used here): the images its index names, by the
// io.containerd.image.name annotation or the OCI ref name, and the
// garbage collector's labels from each blob to its children, for the
// platform's manifests.
func archiveImages(ctx context.Context, cs content.Store, index ocispec.Descriptor, platform platforms.MatchComparer) ([]images.Image, error) {
	var imgs []images.Image
	var handler images.HandlerFunc = func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		if desc.Digest != index.Digest {
			// The archive's blobs are stored under the digests of
			// their bytes, whatever their file names say: a damaged
			// one is missing here.
			if _, err := cs.Info(ctx, desc.Digest); err != nil {
				if errdefs.IsNotFound(err) {
					return nil, fmt.Errorf("the archive lacks blob %s (%s), or holds it damaged: %w", desc.Digest, desc.MediaType, errdefs.ErrDataLoss)
				}
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
	h := images.SetChildrenLabels(cs, images.FilterPlatforms(handler, platform))
	if err := images.WalkNotEmpty(ctx, h, index); err != nil {
		return nil, err
	}
	return imgs, nil
}
