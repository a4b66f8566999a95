package rls

import (
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// ServiceName is the gRPC service the rate limit service serves, and the
// name its health is reported under.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Register registers s on g: the gRPC door's server (package grpcdoor),
// which authenticates each call and puts its caller in the call's context
// before ShouldRateLimit runs. Call it before the door serves.
func (s *Server) Register(g *grpc.Server) { pb.RegisterRateLimitServiceServer(g, s) }
