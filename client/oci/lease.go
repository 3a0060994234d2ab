//go:build linux

package oci

import (
	"context"
	"fmt"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
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
		// Released whatever became of the operation's own context.
		ctx := context.WithoutCancel(ctx)
		var opts []leases.DeleteOpt
		if opErr != nil {
			settleIngests(ctx, client, l)
			opts = append(opts, leases.SynchronousDelete)
		}
		if err := lm.Delete(ctx, l, opts...); err != nil {
			log.G(ctx).WithError(err).WithField("lease", l.ID).Warn("release the lease of an image operation (it expires in an hour)")
		}
	}
	return leases.WithLease(ctx, l.ID), end, nil
}

// settleIngests aborts each write in progress that lease l holds once
// containerd is done with it. A write that failed (an archive cut short, a
// transfer broken off) is closed at the client's end before containerd's:
// its content store still writes the ingest's updatedat file as it closes
// it, and a collection removing the ingest's directory at that moment
// leaves the directory behind, holding that file. A writer of the same ref
// opens only once the other is gone (the store locks a ref while a writer
// has it); the ingest is aborted while that one holds it, and nothing else
// writes there.
func settleIngests(ctx context.Context, client *containerd.Client, l leases.Lease) {
	rs, err := client.LeasesService().ListResources(ctx, l)
	if err != nil {
		log.G(ctx).WithError(err).WithField("lease", l.ID).Warn("list the writes of a failed image operation")
		return
	}
	cs := client.ContentStore()
	for _, r := range rs {
		if r.Type != "ingests" {
			continue
		}
		abortIngest(ctx, cs, r.ID)
	}
}

// abortIngest aborts the write ref once it holds it (see settleIngests).
func abortIngest(ctx context.Context, cs content.Store, ref string) {
	// The writer lives with this context: cancelled before the abort,
	// its end in containerd would write the ingest's files meanwhile.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w, err := content.OpenWriter(ctx, cs, content.WithRef(ref))
	if err != nil {
		log.G(ctx).WithError(err).WithField("ref", ref).Warn("wait for a write of a failed image operation to end")
		return
	}
	defer w.Close()
	if err := cs.Abort(ctx, ref); err != nil && !errdefs.IsNotFound(err) {
		log.G(ctx).WithError(err).WithField("ref", ref).Warn("abort a write of a failed image operation")
	}
}
