package rlsconfig

import (
	"errors"
	"slices"
	"testing"
)

// An unordered bucket_id is read as the one path of the domain's tree its
// keys make, refused when one level names two of its keys, and no match
// when a key is left over or a level has none.
func TestOrder(t *testing.T) {
	c, err := Parse([]File{{Name: "c.yaml", Data: []byte(`
domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /a
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: path
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: other
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: user
    value: "p*"
    rate_limit: {unit: second, requests_per_unit: 4}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in        map[string]string
		want      []Entry
		ambiguous bool
	}{
		{map[string]string{"path": "/a", "tenant": "t"}, []Entry{{"tenant", "t"}, {"path", "/a"}}, false},
		{map[string]string{"path": "/b", "tenant": "t"}, []Entry{{"tenant", "t"}, {"path", "/b"}}, false},
		{map[string]string{"other": "o"}, []Entry{{"other", "o"}}, false},
		{map[string]string{"user": "pat"}, []Entry{{"user", "pat"}}, false},
		{map[string]string{"user": "bob"}, nil, false},          // no wildcard match
		{map[string]string{"path": "/a"}, nil, false},           // not at the root
		{map[string]string{"other": "o", "x": "y"}, nil, false}, // a key left over
		{map[string]string{"tenant": "t", "other": "o"}, nil, true},
	} {
		got, err := c.Order("d", tc.in)
		if tc.ambiguous != errors.Is(err, ErrAmbiguous) || (!tc.ambiguous && err != nil) {
			t.Errorf("%v: error %v, ambiguous %v", tc.in, err, tc.ambiguous)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%v: %v, want %v", tc.in, got, tc.want)
		}
	}
	if got, err := c.Order("nope", map[string]string{"other": "o"}); got != nil || err != nil {
		t.Errorf("an unknown domain: %v %v", got, err)
	}
}
