package service

import (
	"context"
	_ "embed"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// encScript runs bucket.lua's enc on each ARGV but the last two (the
// caller and the window, which bucket.lua reads) and returns, for each, m,
// e and whether math.ldexp(m, e) reads back the same float.
var encScript = bucketLua + `
local out = {}
for i = 1, #ARGV - 2 do
  local x = tonumber(ARGV[i])
  local m, e = string.match(enc(x), '^(%-?%d+) (%-?%d+)$')
  out[#out + 1] = tonumber(m)
  out[#out + 1] = tonumber(e)
  out[#out + 1] = math.ldexp(tonumber(m), tonumber(e)) == x and 1 or 0
end
return out
`

// randomTokens is a bucket's tokens as the scripts hold them: a debt or a
// level from a tiny fraction to a huge burst, integers and halves among
// them.
func randomTokens(r *rand.Rand) float64 {
	x := math.Ldexp(r.Float64(), r.IntN(90)-40)
	switch r.IntN(4) {
	case 0:
		x = math.Floor(x)
	case 1:
		x = math.Floor(x) + 0.5
	}
	if r.IntN(3) == 0 {
		x = -x
	}
	return x
}

// TestRecordEncodingExact is the property the integer record rests on: a
// bucket's tokens written as m × 2^e (bucket.lua's enc) read back bit for
// bit, in real Redis's Lua (C doubles, printf's %d) and miniredis's alike:
// the record rounds nothing, so it cannot change a decision.
func TestRecordEncodingExact(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 1))
	xs := []float64{0, 1, -1, 0.1, 1e-12, 123456789.123, 1<<53 - 1, -(1<<53 - 1), 1 << 53, 1e15 + 0.5, math.SmallestNonzeroFloat64 * (1 << 60)}
	for len(xs) < 2000 {
		xs = append(xs, randomTokens(r))
	}
	args := make([]any, 0, len(xs)+2)
	for _, x := range xs {
		args = append(args, formatFloat(x))
	}
	args = append(args, DefaultCaller, "60000000")
	check := func(t *testing.T, res any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		vals, ok := res.([]any)
		if !ok || len(vals) != 3*len(xs) {
			t.Fatalf("reply %T of %d values, want %d", res, len(vals), 3*len(xs))
		}
		for i, x := range xs {
			m, _ := vals[3*i].(int64)
			e, _ := vals[3*i+1].(int64)
			if got := math.Ldexp(float64(m), int(e)); math.Float64bits(got) != math.Float64bits(x) && !(x == 0 && got == 0) || vals[3*i+2] != int64(1) {
				t.Fatalf("%v written as %d × 2^%d reads back %v in Go, Lua's ldexp equal: %v", x, m, e, got, vals[3*i+2])
			}
			if m <= -1<<53 || m >= 1<<53 {
				t.Fatalf("%v: significand %d out of the exact integers", x, m)
			}
		}
	}
	ctx := context.Background()
	t.Run("miniredis", func(t *testing.T) {
		_, c, _ := newMini(t, RedisOptions{})
		res, err := c.Eval(ctx, encScript, nil, args...).Result()
		check(t, res, err)
	})
	t.Run("redis-server", func(t *testing.T) {
		srv := redistest.Start(t)
		c := realClient(t, srv.Addr())
		res, err := c.Eval(ctx, encScript, nil, args...).Result()
		check(t, res, err)
	})
}

// TestIntegrationRecordUpgrade writes an older limitd's records ("<tokens>
// <at>", the tokens printed with 17 significant digits) into redis-server and
// decides on them with this one: every decision is package bucket's on the
// state the old record holds, to the bit, and the bucket is then stored as
// the integer record.
func TestIntegrationRecordUpgrade(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	s := realStore(t, c, 0)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(43, 2))
	checked := 0
	for i := range 200 {
		lim := bucket.Limit{Rate: math.Ldexp(1+r.Float64(), r.IntN(20)-4), Burst: 0}
		lim.Burst = math.Floor(lim.Rate*(1+10*r.Float64())) + 1
		tok := math.Min(randomTokens(r), lim.Burst)
		if tok < -lim.Burst {
			tok = -lim.Burst * r.Float64()
		}
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		// Written a little before now, or ahead of it (a clock that went back).
		at := now.UnixMicro() - int64(r.IntN(2000)) + int64(r.IntN(3))*1_000_000*int64(i%2)
		key := "upgrade-" + strconv.Itoa(i)
		skey := storageKey(DefaultKeyPrefix, key, lim.Rate, lim.Burst)
		old := strconv.FormatFloat(tok, 'g', 17, 64) + " " + strconv.FormatInt(at, 10)
		if err := c.Set(ctx, skey, old, 0).Err(); err != nil {
			t.Fatal(err)
		}
		cost := float64(r.IntN(3))
		d, err := s.Decide(ctx, one(key, lim.Rate, lim.Burst, cost))
		if err != nil {
			t.Fatalf("old record %q: %v", old, err)
		}
		after, err := c.Get(ctx, skey).Result()
		if err != nil {
			continue // deleted: full at once, which the reference must agree with below only when admitted
		}
		if !d.Allowed {
			if after != old {
				t.Fatalf("refused, yet %q became %q", old, after)
			}
			continue
		}
		cur, err := parseStored(after)
		if err != nil || len(strings.Fields(after)) != 3 {
			t.Fatalf("old %q became %q (%v): want the integer record", old, after, err)
		}
		next, dec := lim.Take(bucket.State{Tokens: tok, At: at * 1000}, max(cur.At, at*1000), cost)
		if !dec.Allowed || math.Float64bits(next.Tokens) != math.Float64bits(cur.Tokens) || math.Float64bits(d.Buckets[0].Tokens) != math.Float64bits(cur.Tokens) {
			t.Fatalf("limit %+v, old %q -> %q, cost %g: bucket says %+v %+v, script %+v", lim, old, after, cost, next, dec, d.Buckets[0])
		}
		checked++
	}
	if checked < 100 {
		t.Fatalf("only %d decisions on old records checked", checked)
	}
}

// decideFloatRecord is the decision script of a limitd from before the
// integer record.
//
//go:embed testdata/decide-float-record.lua
var decideFloatRecord string

// TestIntegrationOldLimitdOnNewRecord shows what an older limitd does with a
// bucket this one stored: its script refuses the record as malformed (an
// error, never a decision on misread tokens), until the key expires (at the
// latest when the bucket would be full again); a bucket this one deleted
// (full) it reads as full, as before.
func TestIntegrationOldLimitdOnNewRecord(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	s := realStore(t, c, 0)
	ctx := context.Background()
	if _, err := s.Decide(ctx, one("mixed", 1, 10, 3)); err != nil {
		t.Fatal(err)
	}
	skey := storageKey(DefaultKeyPrefix, "mixed", 1, 10)
	args := []any{"1", "10", "1", "0", "0", DefaultCaller, "60000000"}
	_, err := c.Eval(ctx, decideFloatRecord, []string{skey}, args...).Result()
	if err == nil || !strings.Contains(err.Error(), "malformed bucket value") {
		t.Fatalf("old script on the integer record: %v, want its malformed-value error", err)
	}
	if _, err := c.Eval(ctx, decideFloatRecord, []string{skey + "-none"}, args...).Result(); err != nil {
		t.Fatalf("old script on a missing key: %v", err)
	}
}
