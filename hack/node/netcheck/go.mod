module posttrain.dev/hack/node/netcheck

go 1.26.0
