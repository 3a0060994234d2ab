//go:build linux

package oci

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
)

// Save makes an image of src (Build) and writes it, with every blob it
// needs, as an OCI image layout tar at path, named name: a move without a
// registry. The file appears whole or not at all (written beside it and
// renamed into place).
func Save(ctx context.Context, client *containerd.Client, src Source, name, path string) (Image, error) {
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return Image{}, fmt.Errorf("image name %q: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	name = reference.TagNameOnly(named).String()
	ctx, done, err := client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		return Image{}, fmt.Errorf("save %s: take a lease: %w", src, err)
	}
	defer done(context.WithoutCancel(ctx))
	img, err := Build(ctx, client, src)
	if err != nil {
		return Image{}, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return Image{}, fmt.Errorf("save %s: %w", src, err)
	}
	defer os.Remove(tmp.Name())
	err = client.Export(ctx, tmp, archive.WithManifest(img.Manifest, name), archive.WithPlatform(platforms.Default()))
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

// Load imports an image layout tar Save (or any OCI exporter) wrote and
// unpacks its images into the named snapshotter, ready to run.
func Load(ctx context.Context, client *containerd.Client, r io.Reader, snapshotter string) ([]string, error) {
	ctx, done, err := client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		return nil, fmt.Errorf("load: take a lease: %w", err)
	}
	defer done(context.WithoutCancel(ctx))
	imgs, err := client.Import(ctx, r, containerd.WithImportPlatform(platforms.Default()), containerd.WithSkipDigestRef(func(string) bool { return true }))
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	var names []string
	for _, i := range imgs {
		img := containerd.NewImageWithPlatform(client, i, platforms.Default())
		if err := img.Unpack(ctx, snapshotter); err != nil {
			return names, fmt.Errorf("load: unpack %s into snapshotter %s: %w", i.Name, snapshotter, err)
		}
		names = append(names, i.Name)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("load: the archive names no image: %w", errdefs.ErrInvalidArgument)
	}
	return names, nil
}
