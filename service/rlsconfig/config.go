// Package rlsconfig reads the configuration of Envoy's rate limit service in
// envoyproxy/ratelimit's YAML format and finds the limit of a descriptor the
// way envoyproxy/ratelimit does (see docs/rate-limit-service.md for the fields
// supported and refused). It is pure: it decides nothing and keeps no
// state; package rls serves it over gRPC on the service's store.
//
// A configuration is one or more files, each one domain. Parse checks every
// file completely and fails on the first error, naming the file, the line
// and the field:
//
//	rlsconfig: config.yaml:12: descriptors[0].rate_limit.unit: invalid rate limit unit "fortnight"
//
// Inputs are bounded before they are parsed: a file holds at most
// MaxFileBytes bytes, a folder at most MaxFiles files, descriptors nest at
// most MaxDepth levels, and a file's YAML has at most MaxNodes nodes
// (aliases counted each time they are used).
package rlsconfig

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/ratelimit-wasm/tokenbucket/calendar"
)

// Bounds on what Parse and Load read.
const (
	// MaxFileBytes bounds one configuration file.
	MaxFileBytes = 4 << 20
	// MaxFiles bounds the files of a configuration folder.
	MaxFiles = 1024
	// MaxDepth bounds the nesting of descriptors.
	MaxDepth = 32
	// MaxNodes bounds the YAML nodes of one file, aliases expanded.
	MaxNodes = 1 << 20
)

// Unit is the unit of requests_per_unit. Its values are those of
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
type Unit int32

// The units envoyproxy/ratelimit accepts.
const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
	Month  Unit = 5
	Year   Unit = 6
	Week   Unit = 7
	// Quarter is this service's, counted only under calendar (an
	// extension): Envoy's enum has none, so answers name it UNKNOWN (Envoy).
	Quarter Unit = 8
)

// Envoy is u as Envoy's enum names it: u, or 0 (UNKNOWN) for Quarter.
func (u Unit) Envoy() int32 {
	if u == Quarter {
		return 0
	}
	return int32(u)
}

// Seconds is the length of u in seconds as envoyproxy/ratelimit counts it
// (a month is 30 days, a year 365), or 0 for an unknown unit and Quarter (a
// calendar's, whose windows are the calendar's).
func (u Unit) Seconds() int64 {
	switch u {
	case Second:
		return 1
	case Minute:
		return 60
	case Hour:
		return 3600
	case Day:
		return 86400
	case Week:
		return 7 * 86400
	case Month:
		return 30 * 86400
	case Year:
		return 365 * 86400
	}
	return 0
}

// String is u's name in the YAML, lower case.
func (u Unit) String() string {
	if u == Quarter {
		return "quarter"
	}
	for name, v := range units {
		if v == u {
			return name
		}
	}
	return fmt.Sprintf("unit(%d)", int32(u))
}

var units = map[string]Unit{
	"second": Second, "minute": Minute, "hour": Hour, "day": Day,
	"week": Week, "month": Month, "year": Year,
}

// Algorithm is how a limit counts.
type Algorithm uint8

// Algorithms. Default is the service's (package rls's Options.Algorithm).
const (
	Default Algorithm = iota
	// TokenBucket: a bucket of Burst tokens (RequestsPerUnit unless set)
	// refilled continuously at RequestsPerUnit per unit.
	TokenBucket
	// FixedWindow: envoyproxy/ratelimit's counter per window of one unit.
	FixedWindow
)

// String is a's name in the YAML.
func (a Algorithm) String() string {
	switch a {
	case TokenBucket:
		return "token_bucket"
	case FixedWindow:
		return "fixed_window"
	}
	return "default"
}

// ParseAlgorithm reads an algorithm's name ("token_bucket", "fixed_window").
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "token_bucket":
		return TokenBucket, nil
	case "fixed_window":
		return FixedWindow, nil
	}
	return Default, fmt.Errorf("rlsconfig: algorithm: want token_bucket or fixed_window, got %q", s)
}

// RateLimit is the limit of one descriptor of the configuration.
type RateLimit struct {
	// RequestsPerUnit per Unit is the limit (0 refuses every hit).
	RequestsPerUnit uint32
	Unit            Unit
	// Unlimited: the descriptor is never limited (Unit is then 0).
	Unlimited bool
	// Name, when set, lets other limits replace this one.
	Name string
	// Replaces names the limits this one replaces in a request that
	// matches both.
	Replaces []string
	// ShadowMode: over the limit is counted, never refused.
	ShadowMode bool
	// QuotaMode: over the limit is answered OK per descriptor and never
	// refuses the request; it is counted as over the limit.
	QuotaMode bool
	// DetailedMetric: the statistics of this limit name the request's
	// values.
	DetailedMetric bool
	// Algorithm is this limit's own (an extension; Default: the service's).
	Algorithm Algorithm
	// Burst is the token bucket's capacity apart from the rate (an
	// extension; 0: RequestsPerUnit).
	Burst uint32
	// Calendar, when set (an extension), counts the limit in calendar
	// windows of Unit in its zone (a FixedWindow whose window is
	// Calendar.Window's, not the Unix clock divided by the unit).
	Calendar *calendar.Spec
	// Key is the descriptor's path as envoyproxy/ratelimit names its
	// statistics: "<domain>.<key>_<value>.<key>..." (without the value for
	// a descriptor that has none).
	Key string
}

// Capacity is the bucket's capacity: Burst, or RequestsPerUnit when unset.
func (r *RateLimit) Capacity() uint32 {
	if r.Burst > 0 {
		return r.Burst
	}
	return r.RequestsPerUnit
}

// File is one configuration file's name (as errors show it) and content.
type File struct {
	Name string
	Data []byte
}

// Config is a parsed configuration: its domains' descriptor trees.
type Config struct {
	domains map[string]*node
	// Files are the names of the files it was read from, in order.
	Files []string
}

// node is a level of a domain's descriptor tree.
type node struct {
	key       string           // the descriptor's key
	children  map[string]*node // by "<key>_<value>", or "<key>" when no value
	order     []string         // the children's names in file order
	wildcards []string         // the children's names ending in "*", in file order
	limit     *RateLimit

	valueToMetric   bool
	shareThreshold  bool
	wildcardPattern string // this node's name, when share_threshold is set
}

// Domains lists the configuration's domains, sorted.
func (c *Config) Domains() []string {
	ds := make([]string, 0, len(c.domains))
	for d := range c.domains {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds
}

// Parse reads files, each holding one domain; a domain named in two files
// is refused (envoyproxy/ratelimit's default, MERGE_DOMAIN_CONFIG off).
func Parse(files []File) (*Config, error) { return parse(files, MaxNodes) }

func parse(files []File, maxNodes int) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	where := map[string]string{}
	for _, f := range files {
		if len(f.Data) > MaxFileBytes {
			return nil, &Error{File: f.Name, Msg: fmt.Sprintf("larger than %d bytes", MaxFileBytes)}
		}
		root, err := parseFile(f, maxNodes)
		if err != nil {
			return nil, err
		}
		if prev, dup := where[root.domain]; dup {
			return nil, &Error{File: f.Name, Line: root.domainLine, Field: "domain",
				Msg: fmt.Sprintf("duplicate domain %q (also in %s)", root.domain, prev)}
		}
		where[root.domain] = f.Name
		c.domains[root.domain] = root.tree
		c.Files = append(c.Files, f.Name)
	}
	return c, nil
}

// Load reads the configuration at path: one YAML file, or every regular
// file of a folder whose name ends in .yaml or .yml (not its subfolders),
// in name order. It returns the files read too, for a caller that watches
// them.
func Load(path string) (*Config, []File, error) {
	files, _, err := ReadFiles(path)
	if err != nil {
		return nil, nil, err
	}
	c, err := Parse(files)
	return c, files, err
}

// ReadFiles reads the configuration files at path, as Load does, bounded by
// MaxFiles and MaxFileBytes. Only regular files are read (a symbolic link
// is followed): a folder's other entries named *.yaml or *.yml (a FIFO, a
// socket, a device) are skipped and returned in skipped, for the caller to
// log; a path that is itself one is refused. A FIFO is opened without
// waiting for a writer, so none blocks the reader.
func ReadFiles(path string) (files []File, skipped []string, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("rlsconfig: %w", err)
	}
	if !st.IsDir() {
		data, err := readBounded(path)
		if err != nil {
			return nil, nil, err
		}
		return []File{{Name: path, Data: data}}, nil, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, nil, fmt.Errorf("rlsconfig: %w", err)
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			continue
		}
		full := filepath.Join(path, n)
		if fi, err := os.Stat(full); err != nil || fi.IsDir() {
			continue // a dangling link or a folder: not a file to read
		}
		names = append(names, full)
	}
	if len(names) > MaxFiles {
		return nil, nil, fmt.Errorf("rlsconfig: %s: more than %d configuration files", path, MaxFiles)
	}
	slices.SortFunc(names, cmp.Compare)
	for _, n := range names {
		data, err := readBounded(n)
		switch {
		case errors.Is(err, errNotRegular):
			skipped = append(skipped, n)
		case err != nil:
			return nil, nil, err
		default:
			files = append(files, File{Name: n, Data: data})
		}
	}
	return files, skipped, nil
}

// errNotRegular is readBounded's refusal of a file that is not a regular
// file.
var errNotRegular = errors.New("not a regular file")

// readBounded reads a regular file of at most MaxFileBytes. It opens the
// file without blocking (O_NONBLOCK: opening a FIFO for reading would wait
// for a writer) and checks what it opened, so a file swapped for a FIFO
// between a look and the open is refused too.
func readBounded(name string) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("rlsconfig: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, fmt.Errorf("rlsconfig: %w", err)
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("rlsconfig: %s: %w (%s)", name, errNotRegular, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("rlsconfig: %s: %w", name, err)
	}
	if len(data) > MaxFileBytes {
		return nil, &Error{File: name, Msg: fmt.Sprintf("larger than %d bytes", MaxFileBytes)}
	}
	return data, nil
}

// Error is a configuration refused: the file, the line (0 when unknown),
// the field's path from the file's root, and why.
type Error struct {
	File  string
	Line  int
	Field string
	Msg   string
}

// Error implements error: "rlsconfig: <file>:<line>: <field>: <msg>".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("rlsconfig: ")
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Digest is a digest of files, their names and bytes in order: two sets of
// files with the same digest load the same configuration.
func Digest(files []File) [sha256.Size]byte {
	h := sha256.New()
	for _, f := range files {
		h.Write([]byte(f.Name))
		h.Write([]byte{0})
		h.Write(f.Data)
		h.Write([]byte{0})
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
