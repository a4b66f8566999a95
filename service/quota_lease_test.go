package service

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// TestQuotaLeaseReturnAfterBoundary: a gateway's return of what it held
// of a period that ended (the call carries that period) never credits the
// next period, even when the same gateway already holds a lease of the
// next one (its grants in the record's ledger): on a real redis-server
// (lease.lua, by Redis's own clock: the periods are placed around it) and
// on the memory store.
func TestQuotaLeaseReturnAfterBoundary(t *testing.T) {
	now := time.Now().Truncate(time.Millisecond)
	p1 := wire.Period{PeriodStartMs: now.Add(-20 * time.Second).UnixMilli(), PeriodEndMs: now.Add(-10 * time.Second).UnixMilli()}
	p2 := wire.Period{PeriodStartMs: p1.PeriodEndMs, PeriodEndMs: now.Add(50 * time.Second).UnixMilli()}
	srv := redistest.Start(t)
	stores := map[string]Store{
		"redis":  realStore(t, realClient(t, srv.Addr()), 0),
		"memory": NewMemoryStore(MemoryOptions{Now: func() int64 { return now.UnixNano() }}),
	}
	for name, st := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := WithCaller(context.Background(), "gw-a")
			lease := func(p wire.Period, want, lo, ret float64) wire.LeaseAnswer {
				t.Helper()
				a, err := st.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{Key: "q", Burst: 10, Want: want, Min: lo, Return: ret, Period: p}}})
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			if a := lease(p1, 6, 1, 0); !a.Granted || a.Buckets[0].Tokens != 6 {
				t.Fatalf("lease of the first period = %+v, want 6 granted", a)
			}
			if a := lease(p2, 6, 1, 0); !a.Granted || a.Buckets[0].Tokens != 6 || a.Buckets[0].Remaining != 4 {
				t.Fatalf("lease of the next period = %+v, want 6 granted of a fresh 10, 4 left", a)
			}
			// The first period's 4 unspent tokens given back late.
			if a := lease(p1, 0, 0, 4); a.Buckets[0].Returned != 0 || a.Buckets[0].Remaining != 4 {
				t.Fatalf("return of the ended period = %+v, want nothing taken back, 4 left", a)
			}
			if a := lease(p2, 10, 1, 0); !a.Granted || a.Buckets[0].Tokens != 4 || a.Buckets[0].Remaining != 0 {
				t.Fatalf("the rest of the next period = %+v, want 4 granted (6 + 4 = its limit), 0 left", a)
			}
			// A return of the next period's own lease is taken back.
			if a := lease(p2, 0, 0, 3); a.Buckets[0].Returned != 3 || a.Buckets[0].Remaining != 3 {
				t.Fatalf("return within the period = %+v, want 3 taken back", a)
			}
		})
	}
}
