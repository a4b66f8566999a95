package rls

import (
	"google.golang.org/grpc"
)

// ServiceName is the gRPC service the rate limit service serves, and the
// name its health is reported under.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Register registers s on g: the gRPC door's server (package grpcdoor),
// which authenticates each call and puts its caller in the call's context
// before ShouldRateLimit runs. Call it before the door serves. The service
// decodes its requests itself (decode.go), so that a descriptor value that
// is not UTF-8 is decided rather than failing the call.
func (s *Server) Register(g *grpc.Server) { s.register(g) }
