package oci

import (
	"encoding/json"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Version is branchbox's version, recorded in every image it makes.
const Version = "0.1.0-dev"

// The manifest annotations that record where an image came from. The base
// image is named with the OCI standard annotations (base.name and
// base.digest); the rest are branchbox's own.
const (
	AnnotationSandbox      = "io.branchbox.source.sandbox"
	AnnotationBranch       = "io.branchbox.source.branch"
	AnnotationParentLayers = "io.branchbox.parent.layers"
	AnnotationChangeLayer  = "io.branchbox.change.layer"
	// AnnotationCheckpoints is a JSON list of the checkpoints on the path,
	// oldest first, each with its layer's digest.
	AnnotationCheckpoints = "io.branchbox.checkpoints"
	AnnotationVersion     = "io.branchbox.version"
)

// Lineage is what an image's annotations say of its origin.
type Lineage struct {
	Sandbox string
	// Branch is the branch the change layer holds: "0" for the sandbox's
	// root.
	Branch string
	// BaseName and BaseDigest are the sandbox's image (its name and
	// manifest digest).
	BaseName   string
	BaseDigest digest.Digest
	// ParentLayers are the base image's layers, bottom first: the layers
	// a node that has the base need not pull.
	ParentLayers []digest.Digest
	// ChangeLayer is the image's top layer: the branch's change since its
	// last checkpoint, or the named checkpoint's.
	ChangeLayer digest.Digest
	// Checkpoints are the checkpoints on the path, oldest first, each one
	// layer of the image, right above the base's.
	Checkpoints []CheckpointLayer
	Version     string
}

// CheckpointLayer is a checkpoint on an image's path and its layer.
type CheckpointLayer struct {
	Name  string        `json:"name"`
	Layer digest.Digest `json:"layer"`
	// Memory is the manifest of the checkpoint's memory image, for one
	// taken with memory: an artifact beside the image in its index
	// (memory.go).
	Memory digest.Digest `json:"memory,omitempty"`
}

// Annotations renders l as manifest annotations.
func (l Lineage) Annotations() map[string]string {
	parents := make([]string, len(l.ParentLayers))
	for i, d := range l.ParentLayers {
		parents[i] = d.String()
	}
	cks, _ := json.Marshal(l.Checkpoints)
	if l.Checkpoints == nil {
		cks = []byte("[]")
	}
	return map[string]string{
		AnnotationCheckpoints:             string(cks),
		AnnotationSandbox:                 l.Sandbox,
		AnnotationBranch:                  l.Branch,
		ocispec.AnnotationBaseImageName:   l.BaseName,
		ocispec.AnnotationBaseImageDigest: l.BaseDigest.String(),
		AnnotationParentLayers:            strings.Join(parents, ","),
		AnnotationChangeLayer:             l.ChangeLayer.String(),
		AnnotationVersion:                 l.Version,
	}
}

// LineageOf reads the lineage back from manifest annotations; ok is false
// when the manifest was not made by branchbox.
func LineageOf(a map[string]string) (l Lineage, ok bool) {
	if a[AnnotationVersion] == "" {
		return Lineage{}, false
	}
	l = Lineage{
		Sandbox: a[AnnotationSandbox], Branch: a[AnnotationBranch], BaseName: a[ocispec.AnnotationBaseImageName],
		BaseDigest: digest.Digest(a[ocispec.AnnotationBaseImageDigest]), ChangeLayer: digest.Digest(a[AnnotationChangeLayer]),
		Version: a[AnnotationVersion],
	}
	if c := a[AnnotationCheckpoints]; c != "" {
		_ = json.Unmarshal([]byte(c), &l.Checkpoints)
	}
	if p := a[AnnotationParentLayers]; p != "" {
		for _, d := range strings.Split(p, ",") {
			l.ParentLayers = append(l.ParentLayers, digest.Digest(d))
		}
	}
	return l, true
}
