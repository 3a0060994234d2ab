//go:build linux

package oci

import (
	"context"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// PushResult is what a push made and sent.
type PushResult struct {
	Ref   string
	Image Image
	Sent  *Transfer
}

// Push makes an image of src (Build) and pushes it to ref through
// containerd's remotes, as `ctr images push` does: a blob the registry has
// already (the base image's layers) is not sent again. The image is also
// recorded in containerd under ref. A lease holds everything until the
// image record does, so containerd collects nothing halfway; a push that
// fails, at any point, leaves the node as it was (no image record, or
// that of an earlier push as it was; what it made collected when the
// lease ends) and the tag in the registry as it was (the manifest goes
// last, once every blob is there).
func Push(ctx context.Context, client *containerd.Client, src Source, ref string, remote Remote) (_ PushResult, retErr error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return PushResult{}, fmt.Errorf("image reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	ref = reference.TagNameOnly(named).String()
	ctx, end, err := holdLease(ctx, client)
	if err != nil {
		return PushResult{}, fmt.Errorf("push %s: %w", src, err)
	}
	defer func() { end(retErr) }()
	img, err := Build(ctx, client, src)
	if err != nil {
		return PushResult{}, err
	}
	sent := &Transfer{}
	resolver := countingResolver{Resolver: remote.resolver(ctx), t: sent}
	if err := client.Push(ctx, ref, img.Root, containerd.WithResolver(resolver)); err != nil {
		return PushResult{}, fmt.Errorf("push %s to %s: %w", src, ref, remoteError(ref, err))
	}
	rec := images.Image{Name: ref, Target: img.Root, Labels: map[string]string{
		AnnotationSandbox: img.Lineage.Sandbox, AnnotationBranch: img.Lineage.Branch,
	}}
	if err := recordImages(ctx, client.ImageService(), []images.Image{rec}, "target", "labels"); err != nil {
		return PushResult{}, fmt.Errorf("push %s: record image %s: %w", src, ref, err)
	}
	return PushResult{Ref: ref, Image: img, Sent: sent}, nil
}
