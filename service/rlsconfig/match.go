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
	children, prev := d.children, d
	var detailed, metric strings.Builder
	detailed.WriteString(domain)
	metric.WriteString(domain)
	var share []string // per entry: the share_threshold wildcard value, or ""
	var limit *RateLimit
	for i, e := range entries {
		final := e.Key + "_" + e.Value
		detailed.WriteByte('.')
		detailed.WriteString(final)
		next := children[final]
		wildcard := ""
		if next == nil {
			for _, w := range prev.wildcards {
				if strings.HasPrefix(final, strings.TrimSuffix(w, "*")) {
					next, wildcard = children[w], w
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = children[e.Key]
		}
		if wildcard != "" && next != nil && next.shareThreshold && next.wildcardPattern != "" {
			if share == nil {
				share = make([]string, len(entries))
			}
			share[i] = strings.TrimPrefix(next.wildcardPattern, e.Key+"_")
		}
		metric.WriteByte('.')
		metric.WriteString(e.Key)
		if next != nil {
			val := ""
			switch {
			case wildcard != "" && share != nil && share[i] != "":
				val = share[i]
			case wildcard != "" && next.valueToMetric:
				val = e.Value
			case wildcard != "":
				val = strings.TrimPrefix(wildcard, e.Key+"_")
			case byValue, next.valueToMetric:
				val = e.Value
			}
			if val != "" {
				metric.WriteByte('_')
				metric.WriteString(val)
			}
		}
		if next != nil && next.limit != nil && i == len(entries)-1 {
			l := *next.limit
			limit = &l
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		children, prev = next.children, next
	}
	if limit == nil {
		return Match{}, true
	}
	m = Match{Limit: limit, Values: make([]string, len(entries))}
	for i, e := range entries {
		m.Values[i] = e.Value
		if share != nil && share[i] != "" {
			m.Values[i] = share[i]
		}
	}
	switch {
	case limit.DetailedMetric && share != nil:
		var b strings.Builder
		b.WriteString(domain)
		for i, e := range entries {
			b.WriteByte('.')
			b.WriteString(e.Key)
			if share[i] != "" {
				b.WriteByte('_')
				b.WriteString(share[i])
			} else if e.Value != "" {
				b.WriteByte('_')
				b.WriteString(e.Value)
			}
		}
		limit.Key = b.String()
	case limit.DetailedMetric:
		limit.Key = detailed.String()
	default:
		limit.Key = metric.String()
	}
	return m, true
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
