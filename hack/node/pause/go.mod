module posttrain.dev/hack/node/pause

go 1.26.0
