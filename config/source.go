package config

import (
	"errors"
	"strconv"
	"strings"
)

// parseSource parses a request-value reference as written in "limit_keys"
// and as a key of "match": header:<name>, query:<name>, ip:address, path,
// method, authority, jwt:<claim> (dots for nesting), cookie:<name> or
// request_json:<path> (a value of the request's JSON body). Header
// names are lower-cased; every other name is kept as written. "fixed" is not a
// source of request values: it is accepted only as a cost_source, by Parse.
// Its error is a bare reason, for Parse to put a path on.
func parseSource(s string) (Source, error) {
	kind, name, hasName := strings.Cut(s, ":")
	switch kind {
	case "path", "method", "authority":
		if hasName {
			return Source{}, errors.New("source " + strconv.Quote(s) + ": " + kind + " takes no name")
		}
		k := map[string]SourceKind{"path": SourcePath, "method": SourceMethod, "authority": SourceAuthority}[kind]
		return Source{Kind: k}, nil
	case "ip":
		if name != "address" {
			return Source{}, errors.New("source " + strconv.Quote(s) + ": the only ip source is ip:address")
		}
		return Source{Kind: SourceIP, Name: name}, nil
	case "header":
		if err := checkHeaderName(name); err != nil {
			return Source{}, &wrapError{"source " + strconv.Quote(s) + ": ", err}
		}
		return Source{Kind: SourceHeader, Name: strings.ToLower(name)}, nil
	case "cookie":
		if !isToken(name) {
			return Source{}, errors.New("source " + strconv.Quote(s) + ": cookie name must be a non-empty HTTP token")
		}
		return Source{Kind: SourceCookie, Name: name}, nil
	case "query":
		if name == "" || hasControl(name) {
			return Source{}, errors.New("source " + strconv.Quote(s) + ": query parameter name must be non-empty, without control characters")
		}
		return Source{Kind: SourceQuery, Name: name}, nil
	case "jwt":
		if name == "" || hasControl(name) || strings.HasPrefix(name, ".") ||
			strings.HasSuffix(name, ".") || strings.Contains(name, "..") {
			return Source{}, errors.New("source " + strconv.Quote(s) + ": claim must be non-empty dot-separated names, without control characters")
		}
		return Source{Kind: SourceJWT, Name: name}, nil
	case "request_json":
		if err := checkJSONPath(name); err != nil {
			return Source{}, &wrapError{"source " + strconv.Quote(s) + ": ", err}
		}
		return Source{Kind: SourceRequestJSON, Name: name}, nil
	}
	if s == "" {
		return Source{}, errors.New("empty source")
	}
	return Source{}, errors.New("unknown source " + strconv.Quote(s) + " (want header:<name>, query:<name>, ip:address, path, method, authority, jwt:<claim>, cookie:<name> or request_json:<path>)")
}

// parseCostSource parses a cost_source: "fixed", header:<name>,
// query:<name>, response_header:<name> or response_json:<path>.
func parseCostSource(s string) (Source, error) {
	if s == "fixed" {
		return Source{Kind: SourceFixed}, nil
	}
	kind, name, _ := strings.Cut(s, ":")
	switch kind {
	case "header", "query":
		return parseSource(s)
	case "response_header":
		if err := checkHeaderName(name); err != nil {
			return Source{}, &wrapError{"source " + strconv.Quote(s) + ": ", err}
		}
		return Source{Kind: SourceResponseHeader, Name: strings.ToLower(name)}, nil
	case "response_json":
		if err := checkJSONPath(name); err != nil {
			return Source{}, &wrapError{"source " + strconv.Quote(s) + ": ", err}
		}
		return Source{Kind: SourceResponseJSON, Name: name}, nil
	}
	return Source{}, errors.New(`must be "fixed", header:<name>, query:<name>, response_header:<name> or response_json:<path>, got ` + strconv.Quote(s))
}

// MaxRequestBodyBytes bounds the request body read for request_json
// sources: a body larger than this is decided as if it held none of their
// values. It is half Envoy's default buffer limit (1 MiB): Envoy counts a
// chunk into the buffer it holds before the filter sees it, and answers
// 413 past the limit, so the bound leaves a chunk's room below it.
const MaxRequestBodyBytes = 512 << 10

// MaxJSONPath bounds the length of a response_json or request_json path.
const MaxJSONPath = 256

// checkJSONPath accepts a plain gjson path: dot-separated object keys and
// array indexes, each of A-Z a-z 0-9 _ -, at most MaxJSONPath bytes. No
// wildcards, queries, modifiers or escapes: the path is looked up in
// untrusted bodies on every response, and a plain path costs one pass.
func checkJSONPath(p string) error {
	if p == "" || len(p) > MaxJSONPath {
		return errors.New("path must be 1 to " + strconv.Itoa(MaxJSONPath) + " bytes")
	}
	for _, seg := range strings.Split(p, ".") {
		if seg == "" {
			return errors.New("path must be dot-separated names of A-Z a-z 0-9 _ - (no empty name)")
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
				return errors.New("path must be dot-separated names of A-Z a-z 0-9 _ - (no wildcards, queries, modifiers or escapes), got " + strconv.Quote(string(c)))
			}
		}
	}
	return nil
}

// parseStatus parses one entry of charge_on: a class "1xx" to "5xx"
// (class 1 to 5, code 0) or an exact status "100" to "599" (class 0).
func parseStatus(s string) (class, code int, err error) {
	if len(s) == 3 && s[0] >= '1' && s[0] <= '5' {
		switch {
		case s[1] == 'x' && s[2] == 'x':
			return int(s[0] - '0'), 0, nil
		case s[1] >= '0' && s[1] <= '9' && s[2] >= '0' && s[2] <= '9':
			return 0, int(s[0]-'0')*100 + int(s[1]-'0')*10 + int(s[2]-'0'), nil
		}
	}
	return 0, 0, errors.New(`must be a status class "1xx" to "5xx" or a status "100" to "599", got ` + strconv.Quote(s))
}

// String returns the source as the configuration writes it, for example
// "header:x-api-key", "ip:address" or "fixed".
func (s Source) String() string {
	switch s.Kind {
	case SourceFixed:
		return "fixed"
	case SourceHeader:
		return "header:" + s.Name
	case SourceQuery:
		return "query:" + s.Name
	case SourceIP:
		return "ip:address"
	case SourcePath:
		return "path"
	case SourceMethod:
		return "method"
	case SourceAuthority:
		return "authority"
	case SourceJWT:
		return "jwt:" + s.Name
	case SourceCookie:
		return "cookie:" + s.Name
	case SourceResponseHeader:
		return "response_header:" + s.Name
	case SourceResponseJSON:
		return "response_json:" + s.Name
	case SourceRequestJSON:
		return "request_json:" + s.Name
	}
	return "SourceKind(" + strconv.Itoa(int(s.Kind)) + ")"
}

// checkHeaderName reports whether name is usable as an HTTP header name: a
// non-empty token (RFC 9110), which excludes pseudo-headers such as :path.
func checkHeaderName(name string) error {
	if strings.HasPrefix(name, ":") {
		return errors.New("pseudo-headers are not allowed (use path, method or authority)")
	}
	if !isToken(name) {
		return errors.New("header name must be a non-empty HTTP token (letters, digits and !#$%&'*+-.^_`|~)")
	}
	return nil
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// hasControl reports whether s holds an ASCII control character (including
// DEL).
func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// Enumerations as the configuration spells them; the index is the Go value.
var (
	actionNames      = []string{"limit", "allow"}
	modeNames        = []string{"enforce", "shadow"}
	missingKeyNames  = []string{"skip", "shared", "deny"}
	scopeNames       = []string{"local", "cluster"}
	syncNames        = []string{"per_request", "lease"}
	failureModeNames = []string{"allow", "deny"}
	headerStyleNames = []string{"both", "draft", "legacy", "none"}
)

func enumName(names []string, v int, typ string) string {
	if v >= 0 && v < len(names) {
		return names[v]
	}
	return typ + "(" + strconv.Itoa(v) + ")"
}

// String returns "limit" or "allow".
func (a Action) String() string { return enumName(actionNames, int(a), "Action") }

// String returns "enforce" or "shadow".
func (m Mode) String() string { return enumName(modeNames, int(m), "Mode") }

// String returns "skip", "shared" or "deny".
func (m MissingKey) String() string { return enumName(missingKeyNames, int(m), "MissingKey") }

// String returns "local" or "cluster".
func (s Scope) String() string { return enumName(scopeNames, int(s), "Scope") }

// String returns "allow" or "deny".
func (s Sync) String() string { return enumName(syncNames, int(s), "Sync") }

func (f FailureMode) String() string { return enumName(failureModeNames, int(f), "FailureMode") }

// String returns "both", "draft", "legacy" or "none".
func (h HeaderStyle) String() string { return enumName(headerStyleNames, int(h), "HeaderStyle") }
