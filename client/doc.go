// Package client is branchbox's Go client for users: SandboxClient drives
// the branch contexts of a live sandbox through its shim (fork, exec,
// commit, abort, tree, checkpoints), SelfClient does the same from inside a
// sandbox through its branch socket. The snapshotter's branch API has its
// own client, client/branchapi; pushing and pulling contexts as OCI images
// is client/oci; the exploration patterns over a sandbox are in patterns/.
package client
