package engine

// What the behaviour tests (package engine_test, on fakehost) read of a
// Plugin's state that no host sees: the bounds a Plugin keeps on its own
// memory and its owed work, and a rule's local bucket identity.

// MaxExcerpt bounds the excerpt of a limit service's answer in a log line.
const MaxExcerpt = maxExcerpt

// SlotsOwed is how many slot releases p owes (their write failed; the next
// tick writes them).
func SlotsOwed(p *Plugin) int { return len(p.slotsOwed) }

// LeaseLines is how many leases p keeps a line of held requests for.
func LeaseLines(p *Plugin) int { return len(p.leaseLine) }

// IdentityOf returns the local bucket identity of p's first rule for a
// request whose values of the rule's limit keys are values, in order: a
// function, so a benchmark reads the values once.
func IdentityOf(p *Plugin, values ...string) func() uint64 {
	ru := p.rules[0]
	r := &requestValues{}
	for i, k := range ru.LimitKeys {
		r.values = append(r.values, cachedValue{k, values[i], true})
	}
	return func() uint64 { id, _, _ := identity(ru, r); return id }
}
