package service

// Concurrency slots across a fleet: the store's side of a "concurrency"
// rule of scope "cluster" (wire/slots.go is the contract).
//
// Model. A slot table is a key's set of slots out, each a lease: a member
// named by its caller and its id, with the time its lease ends. Every call
// first drops the table's expired slots, so an expired slot counts nowhere;
// an acquire takes a slot in each of its tables when each has fewer than
// its max_in_flight live slots (or already holds the id), else none; a renew
// pushes a held slot's lease, and takes again a slot found gone when the
// table has room; a release removes a held slot. A caller renews and
// releases only its own slots (the member carries its name). A table with
// nothing out is gone; one with slots expires after its last lease.
//
// Guarantees. A table never holds more than its max_in_flight live slots:
// each acquire and restoring renew is one atomic step that checks the live
// count first (one Lua script on Redis, under the store's mutex in memory);
// an acquire over tables of different Redis Cluster slots takes them in
// turn and gives back the ones taken when a later one refuses (under,
// never over). So the requests a fleet runs under slots number at most
// max_in_flight, plus the requests whose slot was lost: a slot is lost only
// when its gateway did not renew it within its TTL (a gateway cut off from
// the service that long) or when the store lost the table (a Redis restart
// without persistence, a failover that lost writes, an eviction); the next
// renewal of a running request takes its slot again when there is room, so
// after a loss the fleet may run up to max_in_flight more than the limit,
// until the requests admitted meanwhile end. A gateway that vanishes
// (kill -9) leaves its slots to block others until their leases end: at
// most one TTL after their last renewal, never allowing more than the limit.
// Acquiring again an id the caller holds renews it and takes nothing more,
// so a retried acquire never takes two slots; releasing twice gives back
// once.

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

//go:embed slots.lua
var slotsLua string

var slotsScript = redis.NewScript(slotsLua)

// SlotStore holds concurrency slots. Implementations are safe for
// concurrent use; errors are as Store.Decide's (an error means nothing is
// known of the call).
type SlotStore interface {
	// Acquire takes a slot named req.ID in every table of req, or none.
	Acquire(ctx context.Context, req *wire.AcquireRequest) (wire.AcquireAnswer, error)
	// Renew pushes the lease of each slot of req to req.TTLMs from now,
	// taking again a slot found gone when its table has room.
	Renew(ctx context.Context, req *wire.SlotsRequest) (wire.SlotsAnswer, error)
	// Release gives back each slot of req that its caller holds.
	Release(ctx context.Context, req *wire.SlotsRequest) (wire.SlotsAnswer, error)
}

var (
	_ SlotStore = (*RedisStore)(nil)
	_ SlotStore = (*MemoryStore)(nil)
)

// slotKey is the name under which a slot table is stored:
//
//	prefix + "{" + tag + "}:slots/" + max_in_flight + ":" + key
//
// with tag as storageKey's, so a table's Redis Cluster slot depends on its
// key alone. Its max_in_flight is part of its identity, as a bucket's limit
// is of a bucket's: a caller that names another limit for the key addresses
// another table, so none can fill a table past the limit its other callers
// share; a rule whose limit changes starts an empty table while the old
// one's slots run out.
func slotKey(prefix, key string, max int64) string {
	var sb strings.Builder
	sb.WriteString(prefix)
	sb.WriteByte('{')
	sb.WriteString(defaultTag(key))
	sb.WriteString("}:slots/")
	sb.WriteString(strconv.FormatInt(max, 10))
	sb.WriteByte(':')
	sb.WriteString(key)
	return sb.String()
}

// Acquire implements SlotStore with one run of slots.lua per Redis Cluster
// slot of its tables (one run on a single Redis); when a later run refuses,
// the earlier ones' slots are released.
func (s *RedisStore) Acquire(ctx context.Context, req *wire.AcquireRequest) (wire.AcquireAnswer, error) {
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.AcquireAnswer{}, err
	}
	keys := make([]string, len(req.Keys))
	for i, k := range req.Keys {
		keys[i] = slotKey(s.prefix, k.Key, k.MaxInFlight)
	}
	groups := s.groups(keys)
	a := wire.AcquireAnswer{Acquired: true, InFlight: make([]int64, len(keys))}
	taken := 0
	for _, idx := range groups {
		gkeys := make([]string, len(idx))
		args := make([]any, 0, 3+2*len(idx))
		args = append(args, "acquire", caller, strconv.FormatInt(req.TTLMs, 10))
		for j, i := range idx {
			gkeys[j] = keys[i]
			args = append(args, req.ID, strconv.FormatInt(req.Keys[i].MaxInFlight, 10))
		}
		vals, err := s.run(ctx, slotsScript, "slots", gkeys, args, 1+len(idx))
		if err == nil {
			err = slotCounts(vals, idx, req, a.InFlight)
		}
		if err != nil {
			s.giveBackSlots(caller, req, keys, groups[:taken])
			return wire.AcquireAnswer{}, err
		}
		if all, _ := vals[0].(int64); all != 1 {
			a.Acquired = false
			break
		}
		taken++
	}
	if !a.Acquired {
		s.giveBackSlots(caller, req, keys, groups[:taken])
		for _, idx := range groups[:taken] {
			for _, i := range idx {
				a.InFlight[i] = max(a.InFlight[i]-1, 0)
			}
		}
	}
	return a, nil
}

// slotCounts reads acquire's in-flight counts for the tables idx into out.
func slotCounts(vals []any, idx []int, req *wire.AcquireRequest, out []int64) error {
	for j, i := range idx {
		n, ok := vals[1+j].(int64)
		if !ok || n < 0 || n > req.Keys[i].MaxInFlight {
			return fmt.Errorf("service: redis: slots script reply: key %d: malformed %v", i, vals[1+j])
		}
		out[i] = n
	}
	return nil
}

// giveBackSlots releases the slots an acquire took in groups before
// another refused or failed. A release that fails leaves them out until
// their lease ends: under, never over.
func (s *RedisStore) giveBackSlots(caller string, req *wire.AcquireRequest, keys []string, groups [][]int) {
	if len(groups) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, idx := range groups {
		gkeys := make([]string, len(idx))
		args := []any{"release", caller, "0"}
		for j, i := range idx {
			gkeys[j] = keys[i]
			args = append(args, req.ID, strconv.FormatInt(req.Keys[i].MaxInFlight, 10))
		}
		_, _ = s.run(ctx, slotsScript, "slots", gkeys, args, len(idx))
	}
}

// Renew implements SlotStore with one run of slots.lua per Redis Cluster
// slot of its tables.
func (s *RedisStore) Renew(ctx context.Context, req *wire.SlotsRequest) (wire.SlotsAnswer, error) {
	return s.slots(ctx, "renew", req)
}

// Release implements SlotStore with one run of slots.lua per Redis Cluster
// slot of its tables.
func (s *RedisStore) Release(ctx context.Context, req *wire.SlotsRequest) (wire.SlotsAnswer, error) {
	return s.slots(ctx, "release", req)
}

func (s *RedisStore) slots(ctx context.Context, op string, req *wire.SlotsRequest) (wire.SlotsAnswer, error) {
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.SlotsAnswer{}, err
	}
	keys := make([]string, len(req.Slots))
	for i, sl := range req.Slots {
		keys[i] = slotKey(s.prefix, sl.Key, sl.MaxInFlight)
	}
	a := wire.SlotsAnswer{Slots: make([]wire.SlotState, len(keys))}
	for _, idx := range s.groups(keys) {
		gkeys := make([]string, len(idx))
		args := make([]any, 0, 3+2*len(idx))
		args = append(args, op, caller, strconv.FormatInt(req.TTLMs, 10))
		for j, i := range idx {
			gkeys[j] = keys[i]
			args = append(args, req.Slots[i].ID, strconv.FormatInt(req.Slots[i].MaxInFlight, 10))
		}
		vals, err := s.run(ctx, slotsScript, "slots", gkeys, args, len(idx))
		if err != nil {
			return wire.SlotsAnswer{}, err
		}
		for j, i := range idx {
			st, ok := vals[j].(int64)
			if !ok || st < 1 || st > 3 || op == "release" && st == 2 {
				return wire.SlotsAnswer{}, fmt.Errorf("service: redis: slots script reply: slot %d: malformed %v", i, vals[j])
			}
			a.Slots[i] = wire.SlotState(st - 1)
		}
	}
	return a, nil
}

// slotTable is a MemoryStore's slot table: each slot's member ("<caller>
// <id>") and the Unix ns its lease ends.
type slotTable map[string]int64

// live drops t's slots whose lease ended by now.
func (t slotTable) live(now int64) {
	for m, end := range t {
		if end <= now {
			delete(t, m)
		}
	}
}

// slotTables returns m's slot tables, made on first use (m.mu held).
func (m *MemoryStore) slotTables() map[string]slotTable {
	if m.slots == nil {
		m.slots = map[string]slotTable{}
	}
	return m.slots
}

// Acquire implements SlotStore with the semantics of slots.lua, under the
// store's mutex. A new table beyond MaxKeys tables first drops the tables
// with nothing live, then fails with ErrMemoryFull.
func (m *MemoryStore) Acquire(ctx context.Context, req *wire.AcquireRequest) (wire.AcquireAnswer, error) {
	if err := ctx.Err(); err != nil {
		return wire.AcquireAnswer{}, err
	}
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.AcquireAnswer{}, err
	}
	a := wire.AcquireAnswer{Acquired: true, InFlight: make([]int64, len(req.Keys))}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	tables := m.slotTables()
	held := make([]bool, len(req.Keys))
	added := 0
	for i, k := range req.Keys {
		t := tables[slotKey(DefaultKeyPrefix, k.Key, k.MaxInFlight)]
		t.live(now)
		_, held[i] = t[caller+" "+req.ID]
		a.InFlight[i] = int64(len(t))
		if t == nil {
			added++
		}
		if !held[i] && a.InFlight[i] >= k.MaxInFlight {
			a.Acquired = false
		}
	}
	if !a.Acquired {
		return a, nil
	}
	if added > 0 && len(tables)+added > m.maxKeys {
		for key, t := range tables {
			if t.live(now); len(t) == 0 {
				delete(tables, key)
			}
		}
		if len(tables)+added > m.maxKeys {
			return wire.AcquireAnswer{}, fmt.Errorf("%w: %d slot tables in use", ErrMemoryFull, len(tables))
		}
	}
	end := now + req.TTLMs*int64(time.Millisecond)
	for i, k := range req.Keys {
		key := slotKey(DefaultKeyPrefix, k.Key, k.MaxInFlight)
		t := tables[key]
		if t == nil {
			t = slotTable{}
			tables[key] = t
		}
		t[caller+" "+req.ID] = end
		if !held[i] {
			a.InFlight[i]++
		}
	}
	return a, nil
}

// Renew implements SlotStore as slots.lua does.
func (m *MemoryStore) Renew(ctx context.Context, req *wire.SlotsRequest) (wire.SlotsAnswer, error) {
	return m.slotCall(ctx, req, true)
}

// Release implements SlotStore as slots.lua does; a table left empty is
// dropped.
func (m *MemoryStore) Release(ctx context.Context, req *wire.SlotsRequest) (wire.SlotsAnswer, error) {
	return m.slotCall(ctx, req, false)
}

func (m *MemoryStore) slotCall(ctx context.Context, req *wire.SlotsRequest, renew bool) (wire.SlotsAnswer, error) {
	if err := ctx.Err(); err != nil {
		return wire.SlotsAnswer{}, err
	}
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.SlotsAnswer{}, err
	}
	a := wire.SlotsAnswer{Slots: make([]wire.SlotState, len(req.Slots))}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	tables := m.slotTables()
	end := now + req.TTLMs*int64(time.Millisecond)
	for i, sl := range req.Slots {
		key := slotKey(DefaultKeyPrefix, sl.Key, sl.MaxInFlight)
		t := tables[key]
		t.live(now)
		mem := caller + " " + sl.ID
		_, held := t[mem]
		switch {
		case !renew && held:
			delete(t, mem)
		case !renew:
			a.Slots[i] = wire.SlotLost
		case held:
			t[mem] = end
		case int64(len(t)) < sl.MaxInFlight && (t != nil || len(tables) < m.maxKeys):
			if t == nil {
				t = slotTable{}
				tables[key] = t
			}
			t[mem] = end
			a.Slots[i] = wire.SlotRestored
		default:
			a.Slots[i] = wire.SlotLost
		}
		if t != nil && len(t) == 0 {
			delete(tables, key)
		}
	}
	return a, nil
}
