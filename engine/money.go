package engine

import (
	"math"
	"math/bits"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

// A rule with a price table (config.Money) counts money in micro-units
// (config.MicroUnits). At the request it reserves the most the response
// can cost (moneyReserve): its reserve value times its model's price, or
// default_cost. The response's usage values (one body target per term,
// settleHeaders) are charged at finishBody: the sum over the terms of
// usage × price, over per, rounded up to a whole micro-unit (moneyCost),
// so the ledger is exact to a millionth. A term the response lacks counts
// 0; a response with none of them keeps the reservation (cost_missing); a
// model the table does not price, with no "*", keeps the reservation and
// counts in price_missing; a response cut short (or encoded) is charged
// its reservation (cost_truncated), unless an event stream marked its
// usage final first.

// maxUsage bounds a usage value: a larger one, a fraction or a negative
// number is not a usage, and its term counts 0.
const maxUsage = 1 << 53

// moneyReserve returns the request's model's prices and what the request
// reserves, in micro-units.
func moneyReserve(ru *rule, r *requestValues) ([]uint64, float64) {
	m := ru.Cost.Money
	model, found := r.value(m.Model)
	prices, ok := m.Prices(model, found)
	if !ok {
		ru.priceMissing.Increment(1)
		return nil, ru.Cost.Default
	}
	if !m.Reserve.Set {
		return prices, ru.Cost.Default
	}
	v, found := r.value(m.Reserve.Source)
	if !found {
		return prices, ru.Cost.Default
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n > maxUsage {
		return prices, ru.Cost.Default
	}
	var u [1]uint64
	var pr [1]uint64
	u[0], pr[0] = n, prices[m.Reserve.Price]
	cost := moneyCost(u[:], pr[:], m.Per)
	return prices, float64(max(cost, 1)) // a reservation of 0 would hold nothing
}

// moneyCost is Σ usage[i] × price[i] / per, rounded up to a whole
// micro-unit, computed in 128 bits; a result past 2^53 micro-units (far
// beyond any burst) is 2^53.
func moneyCost(usage, price []uint64, per uint64) uint64 {
	var hi, lo uint64
	for i := range usage {
		h, l := bits.Mul64(usage[i], price[i])
		var c uint64
		lo, c = bits.Add64(lo, l, 0)
		hi, _ = bits.Add64(hi, h, c)
	}
	// Round up: add per − 1 before dividing.
	var c uint64
	lo, c = bits.Add64(lo, per-1, 0)
	hi += c
	if hi >= per {
		return maxUsage // the quotient would not fit in 64 bits
	}
	q, _ := bits.Div64(hi, lo, per)
	return min(q, maxUsage)
}

// usageOf is a body target's value as a usage: a whole number from 0 to
// maxUsage, else false (the term counts 0).
func usageOf(tg *bodyTarget) (uint64, bool) {
	if !tg.found || !tg.ok || tg.cost != math.Trunc(tg.cost) || tg.cost < 0 || tg.cost > maxUsage {
		return 0, false
	}
	return uint64(tg.cost), true
}

// chargeMoney sets the amount of a money take t from its terms' targets
// (tgs, parallel to its rule's terms) at the end of the body. cut: the
// body was cut short, so the usage counts only if an event stream marked
// it final. It reports whether the cost was known; an unknown cost keeps
// the reservation.
func chargeMoney(t *take, tgs []bodyTarget, failed, stream, cut bool) {
	ru := t.rule
	m := ru.Cost.Money
	var usageBuf, priceBuf [config.MaxCostTerms]uint64
	usage, price := usageBuf[:len(tgs)], priceBuf[:len(tgs)]
	seen, final := false, true
	for i := range tgs {
		u, ok := usageOf(&tgs[i])
		if ok && !failed {
			usage[i], seen = u, true
			final = final && tgs[i].final
		}
		price[i] = t.prices[m.Terms[i].Price]
	}
	switch {
	case cut && !(stream && seen && final):
		t.amount = 0 // charged its reservation
		ru.costTruncated.Increment(1)
	case !seen:
		ru.costMissing.Increment(1)
	default:
		t.amount = float64(moneyCost(usage, price, m.Per)) - t.cost
	}
}
