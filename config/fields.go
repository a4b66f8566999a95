package config

import (
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
	"github.com/ratelimit-wasm/tokenbucket/internal/jsonlimit"
)

// The configuration's field policy, over the reading layer of package
// internal/jsonfield: every field name is checked (duplicates first, then
// unknown names) before any value is read; a null value is present, and
// refused by the typed getters like any value of the wrong type.

// object is a JSON object whose field names were checked against a list.
type object struct {
	path   string
	fields map[string]gjson.Result
	order  []string // field names in document order
}

// member is one field of an object: its name, its JSON path and its value.
type member struct {
	key   string
	at    string
	value gjson.Result
}

// members returns the fields of the object v in document order, rejecting
// a name that appears twice.
func members(path string, v gjson.Result) ([]member, error) {
	var ms []member
	seen := make(map[string]bool)
	err := jsonfield.Members(path, v, func(name, at string, val gjson.Result) *jsonfield.Error {
		if seen[name] {
			return jsonfield.Refuse(at, "duplicate field")
		}
		seen[name] = true
		ms = append(ms, member{key: name, at: at, value: val})
		return nil
	})
	return ms, fieldError(err)
}

// fields returns the object v, rejecting unknown and duplicate fields.
func fields(path string, v gjson.Result, known ...string) (object, error) {
	ms, err := members(path, v)
	if err != nil {
		return object{}, err
	}
	o := object{path: path, fields: make(map[string]gjson.Result, len(ms))}
	for _, m := range ms {
		if !slices.Contains(known, m.key) {
			return object{}, errorf(m.at, "unknown field")
		}
		o.fields[m.key] = m.value
		o.order = append(o.order, m.key)
	}
	return o, nil
}

// at is the JSON path of the field name.
func (o object) at(name string) string { return jsonlimit.Join(o.path, name) }

func (o object) get(name string) (gjson.Result, bool) {
	v, ok := o.fields[name]
	return v, ok
}

// optString returns the string field name, or nil when it is absent. Unlike
// text, any string is accepted, the empty one included.
func (o object) optString(name string) (*string, error) {
	v, ok := o.get(name)
	if !ok {
		return nil, nil
	}
	s, err := str(o.at(name), v)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// text returns the string field name, def when absent; a present value must
// be non-empty and free of control characters.
func (o object) text(name, def string) (string, error) {
	v, ok := o.get(name)
	if !ok {
		return def, nil
	}
	p := o.at(name)
	s, err := str(p, v)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", errorf(p, "must not be empty")
	}
	if hasControl(s) {
		return "", errorf(p, "must not hold control characters")
	}
	return s, nil
}

func (o object) boolean(name string, def bool) (bool, error) {
	v, ok := o.get(name)
	if !ok {
		return def, nil
	}
	return boolean(o.at(name), v)
}

// enum returns the index in names of the string field name, def when
// absent.
func (o object) enum(name string, names []string, def int) (int, error) {
	v, ok := o.get(name)
	if !ok {
		return def, nil
	}
	p := o.at(name)
	s, err := str(p, v)
	if err != nil {
		return 0, err
	}
	if i := slices.Index(names, s); i >= 0 {
		return i, nil
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = strconv.Quote(n)
	}
	return 0, errorf(p, "must be one of "+strings.Join(quoted, ", ")+", got "+strconv.Quote(s))
}

// integer returns the integer field name, def when absent; a present value
// must be a whole number in [lo, hi] (1.0 and 1e2 are whole numbers).
func (o object) integer(name string, def, lo, hi int) (int, error) {
	v, ok := o.get(name)
	if !ok {
		return def, nil
	}
	p := o.at(name)
	if v.Type != gjson.Number {
		return 0, typeError(p, "an integer", v)
	}
	if !integral(v.Raw) {
		return 0, errorf(p, "must be an integer, got "+shorten(v.Raw))
	}
	f, err := strconv.ParseFloat(v.Raw, 64)
	if err != nil || f < float64(lo) || f > float64(hi) {
		return 0, errorf(p, "must be between "+strconv.Itoa(lo)+" and "+strconv.Itoa(hi)+", got "+shorten(v.Raw))
	}
	return int(f), nil
}

// positive returns the number field name, which must be present, > 0 and
// <= hi.
func (o object) positive(name string, hi float64) (float64, error) {
	v, _ := o.get(name)
	p := o.at(name)
	if v.Type != gjson.Number {
		return 0, typeError(p, "a number", v)
	}
	f, err := strconv.ParseFloat(v.Raw, 64)
	switch {
	case f <= 0: // also -Inf from a huge negative number
		return 0, errorf(p, "must be > 0, got "+shorten(v.Raw))
	case err != nil || f > hi:
		return 0, errorf(p, "must be at most "+fmtFloat(hi)+", got "+shorten(v.Raw))
	}
	return f, nil
}

func str(path string, v gjson.Result) (string, error) {
	s, err := jsonfield.String(path, v)
	return s, fieldError(err)
}

func boolean(path string, v gjson.Result) (bool, error) {
	b, err := jsonfield.Bool(path, v)
	return b, fieldError(err)
}

// array returns the elements of the array v.
func array(path string, v gjson.Result) ([]gjson.Result, error) {
	a, err := jsonfield.Array(path, v)
	return a, fieldError(err)
}

func typeError(path, want string, v gjson.Result) error {
	return fieldError(jsonfield.TypeError(path, want, v))
}

// integral reports whether the JSON number raw is a whole number, exactly
// (not after rounding to float64): 10, 1.0, 1e2 and 1500e-2 are; 1.5 is not.
func integral(raw string) bool {
	s := strings.TrimPrefix(raw, "-")
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant = s[:i]
		e, err := strconv.Atoi(s[i+1:])
		switch {
		case err == nil:
			exp = max(min(e, 1<<30), -1<<30)
		case strings.HasPrefix(s[i+1:], "-"):
			exp = -1 << 30
		default:
			exp = 1 << 30
		}
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(whole+frac, "0")
	if digits == "" {
		return true // zero
	}
	trimmed := strings.TrimRight(digits, "0")
	// The value is trimmed × 10^(exp − len(frac) + trailing zeros).
	return exp-len(frac)+len(digits)-len(trimmed) >= 0
}

// shorten keeps a number's text short enough for an error message.
func shorten(raw string) string {
	if len(raw) > 40 {
		return raw[:37] + "..."
	}
	return raw
}

// fmtFloat formats f as briefly as it round-trips, in positional notation
// unless that would be long (as JavaScript prints numbers).
func fmtFloat(f float64) string { return string(appendFloat(nil, f)) }

func appendFloat(b []byte, f float64) []byte {
	if a := math.Abs(f); a == 0 || (a >= 1e-6 && a < 1e21) {
		return strconv.AppendFloat(b, f, 'f', -1, 64)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}
