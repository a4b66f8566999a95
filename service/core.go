package service

import (
	"context"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Decide is the decision core that every front door of the service calls
// (the HTTP API's /v1/decide, and the rate limit service of package rls):
// req's enforced buckets are one atomic decision of st, each shadow bucket a
// decision of its own beside it. The second result counts the shadow
// buckets whose own decision failed (answered allowed); only the enforced
// decision's error is returned.
func Decide(ctx context.Context, st Store, req *wire.Request) (wire.Answer, int, error) {
	return decide(ctx, st, req)
}
