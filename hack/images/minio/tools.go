//go:build tools

// Pins MinIO, the S3 server manifests/base deploys, for the dev cluster's image (hack/build-images.sh):
// there is no registry to pull quay.io/minio/minio from.
package tools

import _ "github.com/minio/minio"
