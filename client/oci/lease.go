//go:build linux

package oci

import (
	"context"
	"fmt"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/log"
)

// holdLease takes a lease for one image operation (load, pull, push,
// save) and returns ctx carrying it: every blob and snapshot the
// operation makes is held by it, and by nothing else until the operation
// records its images, so containerd's collector takes nothing halfway.
//
// end releases the lease. Given the operation's error, it collects the
// garbage before it returns: what a failed operation made is gone when its
// caller sees the error (the node is as before), not whenever the
// collector next runs. The lease expires on its own after an hour, for an
// operation killed before it could end it.
func holdLease(ctx context.Context, client *containerd.Client) (_ context.Context, end func(error), _ error) {
	lm := client.LeasesService()
	l, err := lm.Create(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		return nil, nil, fmt.Errorf("take a lease: %w", err)
	}
	end = func(opErr error) {
		var opts []leases.DeleteOpt
		if opErr != nil {
			opts = append(opts, leases.SynchronousDelete)
		}
		// Released whatever became of the operation's own context.
		if err := lm.Delete(context.WithoutCancel(ctx), l, opts...); err != nil {
			log.G(ctx).WithError(err).WithField("lease", l.ID).Warn("release the lease of an image operation (it expires in an hour)")
		}
	}
	return leases.WithLease(ctx, l.ID), end, nil
}
