package rlsconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-wasm/tokenbucket/calendar"
)

// fileRoot is one parsed file: its domain and descriptor tree.
type fileRoot struct {
	domain     string
	domainLine int
	tree       *node
}

// parser walks one file's YAML nodes.
type parser struct {
	file     string
	domain   string
	nodes    int
	maxNodes int // MaxNodes; less in tests
}

// Fields of each level: envoyproxy/ratelimit's, plus this service's
// extensions (algorithm, burst and calendar in rate_limit).
var (
	rootFields       = []string{"domain", "descriptors"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold"}
	rateLimitFields  = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "calendar"}
	calendarFields   = []string{"time_zone", "anchor", "week_start"}
	replacesFields   = []string{"name"}
)

func (p *parser) fail(n *yaml.Node, field, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &Error{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// parseFile parses one file. Only its first YAML document is read, as
// envoyproxy/ratelimit reads it.
func parseFile(f File, maxNodes int) (*fileRoot, error) {
	p := &parser{file: f.Name, maxNodes: maxNodes}
	var doc yaml.Node
	err := yaml.NewDecoder(bytes.NewReader(f.Data)).Decode(&doc)
	if errors.Is(err, io.EOF) {
		return nil, p.fail(nil, "domain", "config file cannot have empty domain")
	}
	if err != nil {
		return nil, &Error{File: f.Name, Line: yamlErrorLine(err), Msg: "error loading config file: " + yamlErrorText(err)}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	root, err = p.deref(root, "")
	if err != nil {
		return nil, err
	}
	if isNull(root) {
		return nil, p.fail(root, "domain", "config file cannot have empty domain")
	}
	fields, err := p.mapping(root, "", rootFields)
	if err != nil {
		return nil, err
	}
	out := &fileRoot{tree: &node{children: map[string]*node{}}}
	dn := fields["domain"]
	if out.domain, err = p.str(dn, "domain"); err != nil {
		return nil, err
	}
	if out.domain == "" {
		return nil, p.fail(orNode(dn, root), "domain", "config file cannot have empty domain")
	}
	out.domainLine = orNode(dn, root).Line
	p.domain = out.domain
	if err := p.descriptors(out.tree, fields["descriptors"], "descriptors", out.domain+".", 1); err != nil {
		return nil, err
	}
	return out, nil
}

func orNode(n, other *yaml.Node) *yaml.Node {
	if n != nil {
		return n
	}
	return other
}

// yamlErrorLine is the line a YAML syntax error names ("yaml: line 3: ..."),
// or 0.
func yamlErrorLine(err error) int {
	s := err.Error()
	i := strings.Index(s, "line ")
	if i < 0 {
		return 0
	}
	s = s[i+len("line "):]
	j := 0
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	n, _ := strconv.Atoi(s[:j])
	return n
}

// yamlErrorText is a YAML error's text without its "yaml: line N: " prefix.
func yamlErrorText(err error) string {
	s := strings.TrimPrefix(err.Error(), "yaml: ")
	if strings.HasPrefix(s, "line ") {
		if i := strings.Index(s, ": "); i > 0 {
			s = s[i+2:]
		}
	}
	return s
}

// deref follows aliases and counts the node against MaxNodes.
func (p *parser) deref(n *yaml.Node, field string) (*yaml.Node, error) {
	for hops := 0; n != nil && n.Kind == yaml.AliasNode; hops++ {
		if hops > MaxDepth {
			return nil, p.fail(n, field, "aliases nest more than %d deep", MaxDepth)
		}
		n = n.Alias
	}
	p.nodes++
	if p.nodes > p.maxNodes {
		return nil, p.fail(n, field, "more than %d YAML nodes (aliases counted each time they are used)", p.maxNodes)
	}
	return n, nil
}

func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// mapping checks that n is a mapping whose keys are all in allowed, each
// once, and returns their values (aliases followed) by key.
func (p *parser) mapping(n *yaml.Node, field string, allowed []string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, p.fail(n, field, "want a mapping, got %s", kindName(n))
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := p.deref(n.Content[i], field)
		if err != nil {
			return nil, err
		}
		name := k.Value
		at := join(field, name)
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			if k.Tag == "!!merge" {
				return nil, p.fail(k, at, "merge keys (<<) are not supported")
			}
			return nil, p.fail(k, field, "config error, key is not of type string: %s", k.Value)
		}
		known := false
		for _, a := range allowed {
			known = known || a == name
		}
		if !known {
			if _, valid := validKeys[name]; valid {
				return nil, p.fail(k, at, "not a field here (fields here: %s)", strings.Join(allowed, ", "))
			}
			return nil, p.fail(k, at, "config error, unknown key '%s'", name)
		}
		if _, dup := out[name]; dup {
			return nil, p.fail(k, at, "defined twice")
		}
		v, err := p.deref(n.Content[i+1], at)
		if err != nil {
			return nil, err
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!float" {
			return nil, p.fail(v, at, "error checking config: a float (%s) is not a value of the configuration", v.Value)
		}
		out[name] = v
	}
	return out, nil
}

// validKeys are every field name of the format, at any level.
var validKeys = func() map[string]struct{} {
	m := map[string]struct{}{}
	for _, l := range [][]string{rootFields, descriptorFields, rateLimitFields, replacesFields} {
		for _, f := range l {
			m[f] = struct{}{}
		}
	}
	return m
}()

func join(field, name string) string {
	if field == "" {
		return name
	}
	return field + "." + name
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "an unexpected node"
}

// str reads a string field: any scalar's text (YAML 1.1 decoders give an
// integer or boolean scalar's text to a string field), "" when absent.
func (p *parser) str(n *yaml.Node, field string) (string, error) {
	if isNull(n) {
		return "", nil
	}
	if n.Kind != yaml.ScalarNode {
		return "", p.fail(n, field, "want a string, got %s", kindName(n))
	}
	return n.Value, nil
}

// boolean reads a bool field as YAML 1.1 does (true/false, yes/no, on/off,
// y/n in their usual cases), false when absent. A quoted scalar is a string,
// not a bool.
func (p *parser) boolean(n *yaml.Node, field string) (bool, error) {
	if isNull(n) {
		return false, nil
	}
	if n.Kind == yaml.ScalarNode && n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
		switch n.Value {
		case "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON":
			return true, nil
		case "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF":
			return false, nil
		}
	}
	return false, p.fail(n, field, "want true or false, got %s", kindName(n))
}

// uint32Field reads an unsigned integer field (decimal, 0x hex, 0o or
// leading-0 octal, 0b binary, "_" separators), 0 when absent.
func (p *parser) uint32Field(n *yaml.Node, field string) (uint32, error) {
	if isNull(n) {
		return 0, nil
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		return 0, p.fail(n, field, "want an integer from 0 to %d, got %s", uint32(math.MaxUint32), kindName(n))
	}
	s := strings.ReplaceAll(strings.TrimPrefix(n.Value, "+"), "_", "")
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return 0, p.fail(n, field, "want an integer from 0 to %d, got %s", uint32(math.MaxUint32), n.Value)
	}
	return uint32(v), nil
}

// list returns the items of a list field (nil when absent), each a mapping.
func (p *parser) list(n *yaml.Node, field string) ([]*yaml.Node, error) {
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, p.fail(n, field, "want a list, got %s", kindName(n))
	}
	items := make([]*yaml.Node, len(n.Content))
	for i, c := range n.Content {
		at := fmt.Sprintf("%s[%d]", field, i)
		c, err := p.deref(c, at)
		if err != nil {
			return nil, err
		}
		if c.Kind != yaml.MappingNode {
			return nil, p.fail(c, at, "config error, yaml file contains list of type other than map: %s", kindName(c))
		}
		items[i] = c
	}
	return items, nil
}

// descriptors loads the descriptors of list n into parent, whose stats key
// is parentKey (ending with "."), at nesting depth.
func (p *parser) descriptors(parent *node, n *yaml.Node, field, parentKey string, depth int) error {
	items, err := p.list(n, field)
	if err != nil {
		return err
	}
	if len(items) > 0 && depth > MaxDepth {
		return p.fail(n, field, "descriptors nest more than %d levels", MaxDepth)
	}
	for i, item := range items {
		at := fmt.Sprintf("%s[%d]", field, i)
		f, err := p.mapping(item, at, descriptorFields)
		if err != nil {
			return err
		}
		key, err := p.str(f["key"], at+".key")
		if err != nil {
			return err
		}
		if key == "" {
			return p.fail(orNode(f["key"], item), at+".key", "descriptor has empty key")
		}
		value, err := p.str(f["value"], at+".value")
		if err != nil {
			return err
		}
		final := key
		if value != "" {
			final += "_" + value
		}
		full := parentKey + final
		if _, dup := parent.children[final]; dup {
			return p.fail(item, at, "duplicate descriptor composite key '%s'", full)
		}
		var flags [5]bool
		for j, name := range []string{"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold"} {
			if flags[j], err = p.boolean(f[name], at+"."+name); err != nil {
				return err
			}
		}
		nd := &node{key: key, children: map[string]*node{}, valueToMetric: flags[3], shareThreshold: flags[4]}
		if rl := f["rate_limit"]; !isNull(rl) {
			if nd.limit, err = p.rateLimit(rl, at+".rate_limit"); err != nil {
				return err
			}
			nd.limit.ShadowMode, nd.limit.QuotaMode, nd.limit.DetailedMetric = flags[0], flags[1], flags[2]
			nd.limit.Key = full
		}
		wild := strings.HasSuffix(final, "*")
		if nd.shareThreshold {
			if !wild {
				return p.fail(f["share_threshold"], at+".share_threshold",
					"share_threshold can only be used with wildcard values (ending with '*'), but found key '%s'", final)
			}
			nd.wildcardPattern = final
		}
		if wild {
			parent.wildcards = append(parent.wildcards, final)
		}
		if err := p.descriptors(nd, f["descriptors"], at+".descriptors", full+".", depth+1); err != nil {
			return err
		}
		parent.children[final] = nd
		parent.order = append(parent.order, final)
	}
	return nil
}

// calendar reads a rate_limit's calendar mapping (time_zone, anchor,
// week_start, each optional) for a limit of unit (its name, lower case),
// refusing what package calendar refuses at the field it names.
func (p *parser) calendar(n *yaml.Node, field, unit string) (*calendar.Spec, error) {
	f, err := p.mapping(n, field, calendarFields)
	if err != nil {
		return nil, err
	}
	var v [3]string
	for i, name := range calendarFields {
		if v[i], err = p.str(f[name], field+"."+name); err != nil {
			return nil, err
		}
	}
	spec, err := calendar.Parse(unit, v[0], v[2], v[1])
	if err != nil {
		name, msg, _ := strings.Cut(strings.TrimPrefix(err.Error(), "calendar: "), ": ")
		return nil, p.fail(orNode(f[name], n), field+"."+name, "%s", msg)
	}
	return &spec, nil
}

// rateLimit reads a rate_limit mapping.
func (p *parser) rateLimit(n *yaml.Node, field string) (*RateLimit, error) {
	f, err := p.mapping(n, field, rateLimitFields)
	if err != nil {
		return nil, err
	}
	r := &RateLimit{}
	if r.Unlimited, err = p.boolean(f["unlimited"], field+".unlimited"); err != nil {
		return nil, err
	}
	unitName, err := p.str(f["unit"], field+".unit")
	if err != nil {
		return nil, err
	}
	cal := f["calendar"]
	lower := strings.ToLower(unitName)
	unit, valid := units[lower]
	if lower == "quarter" && !isNull(cal) {
		unit, valid = Quarter, true
	}
	switch {
	case r.Unlimited && !isNull(cal):
		return nil, p.fail(cal, field+".calendar", "an unlimited descriptor has no calendar")
	case r.Unlimited && valid:
		return nil, p.fail(f["unit"], field+".unit", "should not specify rate limit unit when unlimited")
	case !r.Unlimited && lower == "quarter" && !valid:
		return nil, p.fail(f["unit"], field+".unit", "invalid rate limit unit '%s' (a quarter is counted only with calendar)", unitName)
	case !r.Unlimited && !valid:
		return nil, p.fail(orNode(f["unit"], n), field+".unit", "invalid rate limit unit '%s'", unitName)
	case unit == Second && !isNull(cal):
		return nil, p.fail(f["unit"], field+".unit", "a calendar counts minute, hour, day, week, month, quarter or year, not '%s'", unitName)
	}
	if !r.Unlimited {
		r.Unit = unit
	}
	if r.RequestsPerUnit, err = p.uint32Field(f["requests_per_unit"], field+".requests_per_unit"); err != nil {
		return nil, err
	}
	if r.Name, err = p.str(f["name"], field+".name"); err != nil {
		return nil, err
	}
	reps, err := p.list(f["replaces"], field+".replaces")
	if err != nil {
		return nil, err
	}
	for i, rep := range reps {
		at := fmt.Sprintf("%s.replaces[%d]", field, i)
		rf, err := p.mapping(rep, at, replacesFields)
		if err != nil {
			return nil, err
		}
		name, err := p.str(rf["name"], at+".name")
		if err != nil {
			return nil, err
		}
		if name == "" {
			return nil, p.fail(rep, at+".name", "should not have an empty replaces entry")
		}
		if name == r.Name {
			return nil, p.fail(orNode(rf["name"], rep), at+".name", "replaces should not contain name of same descriptor")
		}
		r.Replaces = append(r.Replaces, name)
	}
	if an := f["algorithm"]; !isNull(an) {
		s, err := p.str(an, field+".algorithm")
		if err != nil {
			return nil, err
		}
		if r.Algorithm, err = ParseAlgorithm(s); err != nil {
			return nil, p.fail(an, field+".algorithm", "want token_bucket or fixed_window, got %q", s)
		}
		if r.Unlimited {
			return nil, p.fail(an, field+".algorithm", "an unlimited descriptor has no algorithm")
		}
		if r.Algorithm == TokenBucket && !isNull(cal) {
			return nil, p.fail(an, field+".algorithm", "a calendar limit counts in fixed windows, not token_bucket")
		}
	}
	if !isNull(cal) {
		if r.Calendar, err = p.calendar(cal, field+".calendar", lower); err != nil {
			return nil, err
		}
		r.Algorithm = FixedWindow
	}
	if bn := f["burst"]; !isNull(bn) {
		if r.Burst, err = p.uint32Field(bn, field+".burst"); err != nil {
			return nil, err
		}
		switch {
		case r.Unlimited:
			return nil, p.fail(bn, field+".burst", "an unlimited descriptor has no burst")
		case r.Algorithm == FixedWindow:
			return nil, p.fail(bn, field+".burst", "a fixed window has no burst apart from requests_per_unit")
		case r.Burst == 0:
			return nil, p.fail(bn, field+".burst", "must be at least 1")
		case r.RequestsPerUnit == 0:
			return nil, p.fail(bn, field+".burst", "requests_per_unit 0 refuses every hit: a burst would never refill")
		case float64(r.Burst) < float64(r.RequestsPerUnit)/float64(r.Unit.Seconds()):
			return nil, p.fail(bn, field+".burst", "must be >= requests_per_unit per second (%g), got %d",
				float64(r.RequestsPerUnit)/float64(r.Unit.Seconds()), r.Burst)
		}
	}
	return r, nil
}
