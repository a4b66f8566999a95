package service

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// TestTakeMatchesDecide holds take.lua, the plain decision's cheap path, to
// the general one (bucket.lua and decide.lua) on random timelines and
// records, on miniredis with the clock held still while both run from the
// same record:
//   - take.lua alone either declines (a nil reply) and writes nothing, or
//     answers with the general part's reply, record and expiry, exactly;
//   - it answers every plain decision (one bucket, no refund, no delay, no
//     period) whose record is missing or one the scripts wrote without a
//     ledger, and declines every other decision;
//   - records nobody should find there (debts past the floor, times ahead,
//     NaN, infinities, ledgers of both layouts, malformed text), records at
//     an edge (within the forgiven shortfall of the cost, a hair short of
//     full), and limits and costs at the wire's bounds are in the draw too:
//     it answers for them only as the general part does.
//
// TestRedisDifferential holds the whole script, take.lua first, to package
// bucket.
func TestTakeMatchesDecide(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	take, general := redis.NewScript(takeLua), redis.NewScript(bucketLua+decidePart)
	r := rand.New(rand.NewPCG(7, 43))
	nowUs := t0.UnixMicro()
	const key = "k"
	steps, answered := 6000, 0
	scriptWritten := true // the record at key is missing or one a script wrote
	if testing.Short() {
		steps = 2000
	}
	for step := range steps {
		l := randomLimit(r)
		if r.IntN(8) == 0 {
			l = edgeLimit(r)
		}
		nowUs += randomStep(r, l, 1, true)
		m.SetTime(time.UnixMicro(nowUs))
		cost := randomCost(r, l)
		if r.IntN(10) == 0 {
			cost = []float64{0, 1e-9, l.Burst, l.Burst * (1 + 1e-15), wire.MaxAmount}[r.IntN(5)]
		}
		switch p := r.IntN(10); {
		case p == 0:
			m.Del(key)
			scriptWritten = true
		case p == 1:
			scriptWritten = false
			m.Set(key, hostileRecord(r, nowUs))
			if r.IntN(2) == 0 {
				m.SetTTL(key, time.Duration(1+r.IntN(5000))*time.Millisecond)
			}
		case p == 2:
			// At an edge: within the forgiven shortfall of the cost, or a
			// hair short of full.
			tok := cost - l.Rate*1e-9*r.Float64()
			if r.IntN(2) == 0 {
				tok = l.Burst * (1 - 3e-12*r.Float64())
			}
			m.Set(key, fmt.Sprintf("%s %d", strconv.FormatFloat(tok, 'g', 17, 64), nowUs-int64(r.IntN(3))))
		}
		keys := []string{key}
		args := []any{formatFloat(l.Rate), formatFloat(l.Burst), formatFloat(cost), "0", "0", "0", "0", "caller", "60000000"}
		plain := false
		switch p := r.IntN(12); {
		case p == 0:
			args[3] = "1" // refundable
		case p == 1:
			args[4] = strconv.FormatInt(randomDelay(r, l)+1, 10)
		case p == 2:
			args[5], args[6] = strconv.FormatInt(nowUs/1000-1000, 10), strconv.FormatInt(nowUs/1000+86_400_000, 10)
		case p == 3:
			keys = []string{key, "other"}
			args = append(args[:5:5], formatFloat(l.Rate), formatFloat(l.Burst), "1", "0", "0", "0", "0", "0", "0", "caller", "60000000")
		default:
			plain = true
		}
		v0, ttl0 := record(m, key)
		got, err := take.Run(ctx, c, keys, args...).Result()
		v1, ttl1 := record(m, key)
		if errors.Is(err, redis.Nil) {
			if v1 != v0 || ttl1 != ttl0 {
				t.Fatalf("step %d: take.lua declined but wrote %q (ttl %v) over %q (ttl %v)", step, v1, ttl1, v0, ttl0)
			}
			if plain && scriptWritten && len(strings.Fields(v0)) == 2 { // scripts write one space between fields
				t.Fatalf("step %d: take.lua declined a plain decision on the record %q", step, v0)
			}
			if plain && v0 == "" {
				t.Fatalf("step %d: take.lua declined a plain decision on a missing record", step)
			}
		} else if err != nil {
			t.Fatalf("step %d: take.lua on %q: %v", step, v0, err)
		} else if !plain {
			t.Fatalf("step %d: take.lua answered %v for a decision that is not plain (%v)", step, got, args)
		} else {
			answered++
		}
		restore(m, key, v0, ttl0)
		want, werr := general.Run(ctx, c, keys, args...).Result()
		v2, ttl2 := record(m, key)
		if v2 != v0 || v2 == "" {
			scriptWritten = true
		}
		if err == nil && (werr != nil || !reflect.DeepEqual(got, want) || v1 != v2 || ttl1 != ttl2) {
			t.Fatalf("step %d: on %q with %v:\ntake.lua: %v, stored %q ttl %v\ngeneral:  %v (%v), stored %q ttl %v",
				step, v0, args, got, v1, ttl1, want, werr, v2, ttl2)
		}
	}
	if answered < steps/3 {
		t.Fatalf("take.lua answered %d of %d decisions: the cheap path goes untested", answered, steps)
	}
	t.Logf("take.lua answered %d of %d decisions", answered, steps)
}

// record returns key's value ("" when missing) and time to live.
func record(m *miniredis.Miniredis, key string) (string, time.Duration) {
	v, err := m.Get(key)
	if err != nil {
		return "", 0
	}
	return v, m.TTL(key)
}

// restore puts key back as record found it.
func restore(m *miniredis.Miniredis, key, v string, ttl time.Duration) {
	m.Del(key)
	if v != "" {
		m.Set(key, v)
		if ttl > 0 {
			m.SetTTL(key, ttl)
		}
	}
}

// edgeLimit draws a limit at the wire's bounds (wire.MaxAmount, and
// wire.MaxFill between burst and rate).
func edgeLimit(r *rand.Rand) bucket.Limit {
	fill := wire.MaxFill.Seconds()
	switch r.IntN(4) {
	case 0:
		return bucket.Limit{Rate: wire.MaxAmount, Burst: wire.MaxAmount}
	case 1:
		return bucket.Limit{Rate: wire.MaxAmount / fill, Burst: wire.MaxAmount}
	case 2:
		return bucket.Limit{Rate: 1e-6, Burst: 1e-6 * fill}
	}
	return bucket.Limit{Rate: wire.MaxAmount, Burst: 1e-3}
}

// hostileRecord draws a record nobody should find at a bucket's key.
func hostileRecord(r *rand.Rand, nowUs int64) string {
	at := strconv.FormatInt(nowUs-int64(r.IntN(5_000_000)), 10)
	switch r.IntN(14) {
	case 0:
		return "-1e300 " + at // a debt past any floor
	case 1:
		return "1e308 " + at
	case 2:
		return "nan " + at
	case 3:
		return "inf " + at
	case 4:
		return "-inf " + at
	case 5:
		return "3 " + strconv.FormatInt(nowUs+int64(r.IntN(5_000_000)), 10) // written ahead of now
	case 6:
		return fmt.Sprintf("3 %s %d 0 0 0 caller 1 0 0 0", at, nowUs/60_000_000) // a ledger
	case 7:
		return fmt.Sprintf("3 %s %d 1 0 0 0 0", at, nowUs/60_000_000) // an older limitd's ledger
	case 8:
		return "x " + at
	case 9:
		return "3"
	case 10:
		return "3  " + at
	case 11:
		return " 3 " + at
	case 12:
		return "3 " + at + " "
	}
	return "3.5 " + at + ".5" // a fractional time
}
