//go:build linux

package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
)

// Save makes an image of src (Build) and writes it, with every blob it
// needs, as an OCI image layout tar at path, named name: a move without a
// registry. The archive holds what a push sends: the image's manifest or,
// for a path with checkpoints taken with memory, the index of it and their
// memory images (memory.go), which LoadSandbox restores. The file appears
// whole or not at all (written beside it and renamed into place).
func Save(ctx context.Context, client *containerd.Client, src Source, name, path string) (_ Image, retErr error) {
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return Image{}, fmt.Errorf("image name %q: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	name = reference.TagNameOnly(named).String()
	ctx, end, err := holdLease(ctx, client)
	if err != nil {
		return Image{}, fmt.Errorf("save %s: %w", src, err)
	}
	// Nothing records the image: its blobs go when the lease ends.
	defer func() { end(retErr) }()
	img, err := Build(ctx, client, src)
	if err != nil {
		return Image{}, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return Image{}, fmt.Errorf("save %s: %w", src, err)
	}
	defer os.Remove(tmp.Name())
	// Every platform's blobs: the memory images are listed for the
	// platform unknown/unknown, which the platform alone would leave
	// out. The platform still picks the manifest that Docker's
	// manifest.json names, for `docker load`.
	err = client.Export(ctx, tmp, archive.WithManifest(img.Root, name),
		archive.WithPlatform(platforms.Default()), archive.WithAllPlatforms())
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Image{}, fmt.Errorf("save %s to %s: %w", src, path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return Image{}, fmt.Errorf("save %s: %w", src, err)
	}
	return img, nil
}
