// The length check of make lint (hack/funclen.sh): its own module, as
// hack/walk, so that it builds on the standard library alone.
module github.com/branchbox/branchbox/hack/funclen

go 1.26.0
