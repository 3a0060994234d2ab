// Package client is branchbox's Go client for users: SandboxClient drives
// the branches of a live sandbox through its shim (fork, exec,
// commit, abort, tree, checkpoints), SelfClient does the same from inside a
// sandbox through its branch socket. The snapshotter's branch API has its
// own client, client/branchapi; pushing and pulling branches as OCI images
// is client/oci; the exploration patterns over a sandbox are in patterns/.
package client
