//go:build linux

package oci

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// recordImages creates or updates an image record for each of imgs (of
// an existing record, the fields named: "target", "labels"), the last step of an operation that made them, so
// that an image name points at nothing half made. All or nothing: if one
// fails, those already written are put back as they were (deleted if
// new, their old fields if not).
func recordImages(ctx context.Context, is images.Store, imgs []images.Image, fields ...string) (retErr error) {
	type undo struct {
		prev    images.Image
		existed bool
	}
	var done []undo
	defer func() {
		if retErr == nil {
			return
		}
		ctx := context.WithoutCancel(ctx)
		for _, u := range done {
			var err error
			if u.existed {
				_, err = is.Update(ctx, u.prev, fields...)
			} else {
				err = is.Delete(ctx, u.prev.Name)
			}
			if err != nil {
				log.G(ctx).WithError(err).WithField("image", u.prev.Name).Warn("put back the image record of a failed operation")
			}
		}
	}()
	for _, img := range imgs {
		prev, err := is.Get(ctx, img.Name)
		switch {
		case err == nil:
			if _, err := is.Update(ctx, img, fields...); err != nil {
				return fmt.Errorf("update image %s: %w", img.Name, err)
			}
			done = append(done, undo{prev: prev, existed: true})
		case errdefs.IsNotFound(err):
			if _, err := is.Create(ctx, img); err != nil {
				return fmt.Errorf("record image %s: %w", img.Name, err)
			}
			done = append(done, undo{prev: img})
		default:
			return fmt.Errorf("look up image %s: %w", img.Name, err)
		}
	}
	return nil
}
