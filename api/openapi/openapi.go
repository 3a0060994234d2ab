// Package openapi holds the contract of branchbox's HTTP API
// (`branchctl serve`, package httpapi): an OpenAPI 3 document, served at
// GET /v1/openapi.json and checked against the server by
// integration/httpapi_test.go.
package openapi

import _ "embed"

// Spec is branchbox.json.
//
//go:embed branchbox.json
var Spec []byte
