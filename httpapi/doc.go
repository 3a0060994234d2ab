// Package httpapi serves the sandbox and branch operations over HTTP/JSON,
// for programs that are not written in Go: the TypeScript and Python SDKs
// (sdk/), agent frameworks, curl. It is `branchctl serve`, a thin layer over
// the Go client (client, client/oci) and containerd's, with the contract in
// api/openapi/branchbox.json.
//
// Every route is under /v1/namespaces/{ns}/: a request is scoped to one
// containerd namespace, and a bearer token names the namespaces it may
// reach (auth.go). Errors are one JSON document, {"error": {kind, message,
// hint}}, with the kinds of `branchctl --json` (client.ErrorKind). Request
// bodies, concurrent execs and concurrent streams are bounded per client
// (limits.go).
package httpapi
