package rlsconfig

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrAmbiguous is returned by Order when an unordered set of entries can be
// read as more than one path of the domain's descriptor tree.
var ErrAmbiguous = errors.New("rlsconfig: entries: ambiguous")

// Order reads an unordered set of entries (key to value, as an RLQS
// bucket_id carries them) as a descriptor of domain: it walks the domain's
// tree from its root, and at each level takes the one entry whose key is a
// key of that level's descriptors. It returns the entries in that order,
// every entry used; nil and no error when the set is no path of the tree
// (the domain is unknown, a level has none of the remaining keys, or entries
// are left when the tree ends). When a level names two or more of the
// remaining keys (its descriptors have different keys and the set holds
// both), the set could be two descriptors and Order refuses it with
// ErrAmbiguous.
func (c *Config) Order(domain string, entries map[string]string) ([]Entry, error) {
	d := c.domains[domain]
	if d == nil {
		return nil, nil
	}
	left := len(entries)
	used := make(map[string]bool, len(entries))
	var out []Entry
	n := d
	for left > 0 {
		var found []string
		for _, k := range n.levelKeys() {
			if _, ok := entries[k]; ok && !used[k] {
				found = append(found, k)
			}
		}
		switch len(found) {
		case 0:
			return nil, nil
		case 1:
		default:
			slices.Sort(found)
			return nil, fmt.Errorf("%w: keys %s are all descriptors of one level", ErrAmbiguous, strings.Join(found, ", "))
		}
		k := found[0]
		e := Entry{Key: k, Value: entries[k]}
		used[k] = true
		left--
		out = append(out, e)
		next := n.childFor(e)
		if next == nil {
			return nil, nil
		}
		n = next
	}
	return out, nil
}

// levelKeys lists the distinct keys of n's children.
func (n *node) levelKeys() []string {
	var keys []string
	for _, name := range n.order {
		k := n.children[name].key
		if k == "" {
			k = name
		}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// childFor is the child of n that e reaches, as Lookup finds it: by value,
// by the first wildcard, then by key alone.
func (n *node) childFor(e Entry) *node {
	final := e.Key + "_" + e.Value
	if c := n.children[final]; c != nil {
		return c
	}
	for _, w := range n.wildcards {
		if strings.HasPrefix(final, strings.TrimSuffix(w, "*")) {
			return n.children[w]
		}
	}
	return n.children[e.Key]
}
