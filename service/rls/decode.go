package rls

import (
	"context"
	"errors"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ratelimit-wasm/tokenbucket/internal/protomend"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// Lenient decoding. Go's protobuf refuses a proto3 string that is not valid
// UTF-8, and Envoy sends one when a header it puts in a descriptor holds
// such bytes: decoded by the generated handler, the call fails before the
// service sees it, and Envoy's default (failure_mode_deny false) admits it.
// So the service is registered with its own handler (serviceDesc): the
// request's bytes arrive as the unknown fields of an empty message, are
// decoded strictly when they can be, and otherwise once more after every
// string of the request (domain, entry keys and values) that is not valid
// UTF-8 is replaced by rlsconfig.InvalidUTF8 of its bytes. Such a request is
// decided like any other; a value in that form matches no configured value
// and is a bucket of its own.

// serviceDesc is RateLimitService with the lenient handler.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*pb.RateLimitServiceServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: shouldRateLimitHandler}},
	Metadata:    pb.RateLimitService_ServiceDesc.Metadata,
}

// register serves s on r with the lenient handler.
func (s *Server) register(r grpc.ServiceRegistrar) { r.RegisterService(&serviceDesc, s) }

// shouldRateLimitHandler is the gRPC handler of ShouldRateLimit: it decodes
// the request with decodeRequest and hands it to the interceptor chain and
// Server.ShouldRateLimit as the generated handler would.
func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s, ok := srv.(*Server)
	if !ok {
		return nil, status.Error(codes.Internal, "rls: handler: not a *Server")
	}
	raw := &emptypb.Empty{}
	if err := dec(raw); err != nil {
		return nil, err
	}
	req, err := decodeRequest(raw.ProtoReflect().GetUnknown())
	if err != nil {
		s.metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if interceptor == nil {
		return s.ShouldRateLimit(ctx, req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: pb.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		r, ok := req.(*pb.RateLimitRequest)
		if !ok {
			return nil, status.Error(codes.Internal, "rls: handler: not a RateLimitRequest")
		}
		return s.ShouldRateLimit(ctx, r)
	})
}

// decodeRequest decodes the wire form of a RateLimitRequest: what
// proto.Unmarshal gives when it accepts b; else, when b is a well-formed
// message whose only fault is strings that are not UTF-8, the request with
// those strings in rlsconfig.InvalidUTF8's form; else an error.
func decodeRequest(b []byte) (*pb.RateLimitRequest, error) {
	req := &pb.RateLimitRequest{}
	strict := proto.Unmarshal(b, req)
	if strict == nil {
		return req, nil
	}
	mended, _, err := protomend.Mend(nil, b, requestFields, invalidUTF8)
	if err != nil {
		return nil, errors.New("rls: request: " + strict.Error())
	}
	req.Reset()
	if err := proto.Unmarshal(mended, req); err != nil {
		return nil, errors.New("rls: request: " + err.Error())
	}
	return req, nil
}

// The strings of a RateLimitRequest: its domain (1), and in each descriptor
// (2) each entry's (1) key (1) and value (2).
var requestFields = &protomend.Fields{Strings: []protowire.Number{1}, Messages: map[protowire.Number]*protomend.Fields{
	2: {Messages: map[protowire.Number]*protomend.Fields{1: {Strings: []protowire.Number{1, 2}}}},
}}

// invalidUTF8 is rlsconfig.InvalidUTF8 of a string's bytes.
func invalidUTF8(b []byte) string { return rlsconfig.InvalidUTF8(string(b)) }
