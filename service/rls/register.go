package rls

import "google.golang.org/grpc"

// Register lets another service (such as the rate limit quota service,
// package rlqs) be served on the same gRPC server, listener, bounds and
// bearer tokens. Call it before Serve.
func (g *GRPC) Register(fn func(*grpc.Server)) { fn(g.srv) }
