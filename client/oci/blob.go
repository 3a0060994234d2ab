//go:build linux

package oci

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// commitHeld commits w, whose content has digest dgst, so that the blob is
// in the lease of ctx whether the commit made it or found it there.
//
// It names no expected digest in the commit: containerd's content service
// (2.2, contentserver.go) answers a commit naming one it already has with
// AlreadyExists before the metadata store sees it, so the blob is not
// added to the lease, and the garbage collector may take it before the
// caller refers to it (a push made the same layer as the push just before
// it, whose lease had ended, and found it gone). Without one, the metadata
// store commits, or finds the blob there, and leases it in one
// transaction; the store still checks the digest it was opened with.
func commitHeld(ctx context.Context, w content.Writer, size int64, dgst digest.Digest, opts ...content.Opt) error {
	if err := w.Commit(ctx, size, "", opts...); err != nil {
		if errdefs.IsAlreadyExists(err) {
			return nil
		}
		return err
	}
	return madeAs(w.Digest(), dgst)
}

// madeAs checks the digest the content store gives a committed write
// against the content's own.
func madeAs(got, want digest.Digest) error {
	if got != want {
		return fmt.Errorf("the content store made %s of content whose digest is %s: %w", got, want, errdefs.ErrDataLoss)
	}
	return nil
}

// writeBlob writes blob, described by desc, into the content store, held
// by the lease of ctx (see commitHeld) whether it was there or not.
func writeBlob(ctx context.Context, cs content.Ingester, desc ocispec.Descriptor, blob []byte, lbls map[string]string) error {
	return writeBlobFrom(ctx, cs, desc, bytes.NewReader(blob), lbls)
}

// writeBlobFrom is writeBlob of a blob read from r.
func writeBlobFrom(ctx context.Context, cs content.Ingester, desc ocispec.Descriptor, r io.Reader, lbls map[string]string) error {
	var opts []content.Opt
	if lbls != nil {
		opts = append(opts, content.WithLabels(lbls))
	}
	// Opened with its digest, a blob the store has is leased there and then.
	w, err := content.OpenWriter(ctx, cs, content.WithRef("branchbox-"+desc.Digest.String()), content.WithDescriptor(desc))
	if err != nil {
		if errdefs.IsAlreadyExists(err) {
			return nil
		}
		return fmt.Errorf("open a content writer: %w", err)
	}
	defer w.Close()
	// A write of the same ref left unfinished is resumed from its offset
	// by content.Copy, so it is given no expected digest and checked here.
	if err := content.Copy(ctx, w, r, desc.Size, "", opts...); err != nil {
		return err
	}
	if got := w.Digest(); got != "" {
		return madeAs(got, desc.Digest)
	}
	return nil
}
