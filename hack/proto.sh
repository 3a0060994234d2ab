#!/usr/bin/env bash
# Regenerates the Go code for api/. The generated files are committed, so
# only changing a .proto needs this (and Debian's protobuf-compiler).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v protoc >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler; }
export GOBIN=$PWD/bin
go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.10
go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
go install github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc@v1.2.7
# The branch API is served over gRPC on the snapshotter's socket and, as
# containerd serves its own API, over ttrpc beside it (SOCKET.ttrpc): its
# ttrpc names take the prefix TTRPC, as containerd's do.
PATH=$GOBIN:$PATH protoc -I . -I /usr/include \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	--go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative,prefix=TTRPC \
	$(find api/branch -name '*.proto')
# The shim's API is served over ttrpc, on the shim's own socket.
PATH=$GOBIN:$PATH protoc -I . -I /usr/include \
	--go_out=. --go_opt=paths=source_relative \
	--go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative \
	$(find api/shim -name '*.proto')
