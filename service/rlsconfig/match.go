package rlsconfig

import (
	"slices"
	"strings"
)

// Entry is one entry of a request's descriptor.
type Entry struct {
	Key, Value string
}

// Match is the limit a descriptor found.
type Match struct {
	// Limit is the descriptor's limit, nil when none applies. Its Key is
	// the name its statistics are counted under: the configuration's path,
	// with the request's values when detailed_metric, value_to_metric or
	// share_threshold say so, as envoyproxy/ratelimit names them.
	Limit *RateLimit
	// Values are the values that name the descriptor's counter, one per
	// entry: the request's, or for an entry matched by a share_threshold
	// wildcard the wildcard itself (so every value it matches shares one
	// counter). Nil when Limit is nil.
	Values []string
}

// Lookup finds the limit of a descriptor of domain made of entries, as
// envoyproxy/ratelimit does: at each level the entry's "<key>_<value>" is
// looked up, then the level's wildcards ("<key>_<prefix>*", in file order,
// the first whose prefix the entry's starts with), then "<key>" alone; the
// limit is that of the level the last entry reaches, if any, and none when
// the configuration ends before the entries do. known is false for a domain
// the configuration does not have.
func (c *Config) Lookup(domain string, entries []Entry) (m Match, known bool) {
	d := c.domains[domain]
	if d == nil {
		return Match{}, false
	}
	w := lookup{domain: domain, entries: entries}
	w.detailed.WriteString(domain)
	w.metric.WriteString(domain)
	limit := w.walk(d)
	if limit == nil {
		return Match{}, true
	}
	m = Match{Limit: limit, Values: make([]string, len(entries))}
	for i, e := range entries {
		m.Values[i] = e.Value
		if w.share != nil && w.share[i] != "" {
			m.Values[i] = w.share[i]
		}
	}
	limit.Key = w.statsKey(limit)
	return m, true
}

// lookup is one Lookup under way: the statistics names it builds entry by
// entry, and the share_threshold wildcards it meets.
type lookup struct {
	domain           string
	entries          []Entry
	detailed, metric strings.Builder
	share            []string // per entry: the share_threshold wildcard value, or ""; nil: none
}

// walk follows the entries down the tree from the domain's root d and
// returns a copy of the limit the last entry reaches (nil: none).
func (w *lookup) walk(d *node) *RateLimit {
	children, prev := d.children, d
	var limit *RateLimit
	for i, e := range w.entries {
		final := e.Key + "_" + e.Value
		w.detailed.WriteByte('.')
		w.detailed.WriteString(final)
		next, wildcard := children[final], ""
		if next == nil {
			for _, p := range prev.wildcards {
				if strings.HasPrefix(final, strings.TrimSuffix(p, "*")) {
					next, wildcard = children[p], p
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = children[e.Key]
		}
		if wildcard != "" && next != nil && next.shareThreshold && next.wildcardPattern != "" {
			if w.share == nil {
				w.share = make([]string, len(w.entries))
			}
			w.share[i] = strings.TrimPrefix(next.wildcardPattern, e.Key+"_")
		}
		w.metric.WriteByte('.')
		w.metric.WriteString(e.Key)
		if next != nil {
			if val := w.metricValue(i, next, wildcard, byValue); val != "" {
				w.metric.WriteByte('_')
				w.metric.WriteString(val)
			}
		}
		if next != nil && next.limit != nil && i == len(w.entries)-1 {
			l := *next.limit
			limit = &l
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		children, prev = next.children, next
	}
	return limit
}

// metricValue is what the statistics name says of entry i, which found
// next (by its value when byValue, or through wildcard): the share_threshold
// wildcard, the request's value, the wildcard's value, or nothing.
func (w *lookup) metricValue(i int, next *node, wildcard string, byValue bool) string {
	e := w.entries[i]
	switch {
	case wildcard != "" && w.share != nil && w.share[i] != "":
		return w.share[i]
	case wildcard != "" && next.valueToMetric:
		return e.Value
	case wildcard != "":
		return strings.TrimPrefix(wildcard, e.Key+"_")
	case byValue, next.valueToMetric:
		return e.Value
	}
	return ""
}

// statsKey is the name limit's statistics are counted under.
func (w *lookup) statsKey(limit *RateLimit) string {
	switch {
	case limit.DetailedMetric && w.share != nil:
		var b strings.Builder
		b.WriteString(w.domain)
		for i, e := range w.entries {
			b.WriteByte('.')
			b.WriteString(e.Key)
			if w.share[i] != "" {
				b.WriteByte('_')
				b.WriteString(w.share[i])
			} else if e.Value != "" {
				b.WriteByte('_')
				b.WriteString(e.Value)
			}
		}
		return b.String()
	case limit.DetailedMetric:
		return w.detailed.String()
	}
	return w.metric.String()
}

// OverrideKey is the statistics name of a descriptor whose request carries
// its own limit: "<domain>.<key>_<value>..." ("<key>" for an empty value).
func OverrideKey(domain string, entries []Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte('.')
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}

// Path is one limit of a configuration and the entries that reach it: a
// value "" where the configuration names the key alone, a value ending in
// "*" where it names a wildcard.
type Path struct {
	Entries []Entry
	Limit   *RateLimit
}

// Limits lists the limits of domain, sorted by their statistics key.
func (c *Config) Limits(domain string) []Path {
	var out []Path
	var walk func(n *node, entries []Entry)
	walk = func(n *node, entries []Entry) {
		for name, child := range n.children {
			e := Entry{Key: name}
			if k, v, ok := child.split(name); ok {
				e = Entry{Key: k, Value: v}
			}
			path := append(slices.Clone(entries), e)
			if child.limit != nil {
				out = append(out, Path{Entries: path, Limit: child.limit})
			}
			walk(child, path)
		}
	}
	if d := c.domains[domain]; d != nil {
		walk(d, nil)
	}
	slices.SortFunc(out, func(a, b Path) int { return strings.Compare(a.Limit.Key, b.Limit.Key) })
	return out
}

// split returns the key and value of a child named name ("<key>_<value>"),
// from the key the node was loaded with.
func (n *node) split(name string) (string, string, bool) {
	if n.key == "" || n.key == name {
		return "", "", false
	}
	return n.key, strings.TrimPrefix(name, n.key+"_"), true
}
