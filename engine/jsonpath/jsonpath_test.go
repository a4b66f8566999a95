package jsonpath

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand"
	"strconv"
	"strings"
	"testing"
)

// reference is the answer the package doc promises: encoding/json decodes
// the document (numbers as json.Number) and the path is walked.
func reference(doc []byte, path string) Value {
	if !json.Valid(doc) {
		return Value{}
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return Value{}
	}
	for _, seg := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[seg]; !ok {
				return Value{}
			}
		case []any:
			i := arrayIndex(seg)
			if i < 0 || i >= len(x) {
				return Value{}
			}
			v = x[i]
		default:
			return Value{}
		}
	}
	var kind Kind
	var text string
	switch x := v.(type) {
	case json.Number:
		kind, text = Number, string(x)
	case string:
		kind, text = String, x
	default:
		return Value{Kind: Other}
	}
	if len(text) > MaxValue {
		return Value{Kind: Other}
	}
	return Value{Kind: kind, Text: []byte(text)}
}

// scan feeds doc to a fresh Scanner in the pieces cuts gives and checks the
// bytes it retains after every piece.
func scan(t *testing.T, doc []byte, path string, cuts []int) Value {
	t.Helper()
	var s Scanner
	s.Reset(NewPath(path))
	prev := 0
	for _, c := range append(cuts, len(doc)) {
		s.Write(doc[prev:c])
		prev = c
		if r := s.Retained(); r > MaxValue {
			t.Fatalf("retained %d bytes, more than MaxValue", r)
		}
	}
	return s.End()
}

// same compares answers: a string's text only when it is ASCII (the
// reference replaces invalid UTF-8, the scanner keeps bytes).
func same(got, want Value) bool {
	if got.Kind != want.Kind {
		return false
	}
	if want.Kind == String && !isASCII(want.Text) {
		return !isASCII(got.Text)
	}
	return bytes.Equal(got.Text, want.Text)
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

func randomCuts(r *rand.Rand, n int) []int {
	k := r.Intn(6)
	if n > 0 && r.Intn(8) == 0 {
		k = n // byte by byte
	}
	cuts := make([]int, 0, k)
	for i := 0; i < k; i++ {
		cuts = append(cuts, r.Intn(n+1))
	}
	for i := 1; i < len(cuts); i++ { // sort, small n
		for j := i; j > 0 && cuts[j] < cuts[j-1]; j-- {
			cuts[j], cuts[j-1] = cuts[j-1], cuts[j]
		}
	}
	return cuts
}

// gen writes random JSON biased toward the segments of a path.
type gen struct {
	r    *rand.Rand
	segs []string
	b    []byte
}

func (g *gen) ws() {
	for g.r.Intn(4) == 0 {
		g.b = append(g.b, " \t\n\r"[g.r.Intn(4)])
	}
}

func (g *gen) key() string {
	switch g.r.Intn(4) {
	case 0, 1:
		return g.segs[g.r.Intn(len(g.segs))]
	case 2:
		return []string{"x", "usag", "usage_", "0", "1", "total_tokens", ""}[g.r.Intn(7)]
	}
	return strconv.Itoa(g.r.Intn(3))
}

func (g *gen) str(s string) {
	g.b = append(g.b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch g.r.Intn(8) {
		case 0:
			g.b = append(g.b, `\u00`...)
			g.b = append(g.b, "0123456789abcdef"[c>>4], "0123456789ABCDEF"[c&15])
		default:
			switch c {
			case '"', '\\':
				g.b = append(g.b, '\\', c)
			default:
				g.b = append(g.b, c)
			}
		}
	}
	g.b = append(g.b, '"')
}

var numbers = []string{"0", "-0", "5", "5000", "1.5", "-3", "1e3", "2E-2", "0.001", "12345678901234567890",
	"1e400", "-1.25e+2", strings.Repeat("9", 70), "3.0", "0.0000001"}

var strs = []string{"", "5000", "12.5", "abc", "-1", " 7", "1e2", "\x01", `é`, "\u2028", "inf", "0x10",
	strings.Repeat("1", 70), "a\"b\\c/d\b\f\n\r\t"}

func (g *gen) value(depth int) {
	g.ws()
	n := g.r.Intn(10)
	if depth > 6 {
		n = 5 + g.r.Intn(5)
	}
	switch n {
	case 0, 1, 2:
		g.b = append(g.b, '{')
		for i, m := 0, g.r.Intn(5); i < m; i++ {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.ws()
			g.str(g.key())
			g.ws()
			g.b = append(g.b, ':')
			g.value(depth + 1)
		}
		g.ws()
		g.b = append(g.b, '}')
	case 3, 4:
		g.b = append(g.b, '[')
		for i, m := 0, g.r.Intn(4); i < m; i++ {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.value(depth + 1)
		}
		g.ws()
		g.b = append(g.b, ']')
	case 5, 6:
		g.b = append(g.b, numbers[g.r.Intn(len(numbers))]...)
	case 7:
		g.str(strs[g.r.Intn(len(strs))])
	default:
		g.b = append(g.b, []string{"true", "false", "null"}[g.r.Intn(3)]...)
	}
	g.ws()
}

// mutate spoils or alters doc at one place, most often making it invalid.
func mutate(r *rand.Rand, doc []byte) []byte {
	if len(doc) == 0 {
		return doc
	}
	i := r.Intn(len(doc))
	const alphabet = `{}[],:"\ 0123456789-+.eEtrufalsn` + "\x00\x1f\xff"
	switch r.Intn(3) {
	case 0:
		return append(doc[:i:i], doc[i+1:]...)
	case 1:
		out := append(doc[:i:i], alphabet[r.Intn(len(alphabet))])
		return append(out, doc[i:]...)
	}
	out := append([]byte(nil), doc...)
	out[i] = alphabet[r.Intn(len(alphabet))]
	return out
}

var paths = []string{"usage.total_tokens", "usage", "a.0", "choices.0.usage.total_tokens", "0", "x.1.x", "usage.0"}

// TestScannerMatchesReference: on generated documents, valid and spoiled,
// cut at random places, the scanner's answer is the reference's.
func TestScannerMatchesReference(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 40000; i++ {
		path := paths[i%len(paths)]
		g := gen{r: r, segs: strings.Split(path, ".")}
		g.value(0)
		doc := g.b
		if r.Intn(4) == 0 {
			doc = mutate(r, doc)
		}
		want := reference(doc, path)
		cuts := randomCuts(r, len(doc))
		if got := scan(t, doc, path, cuts); !same(got, want) {
			t.Fatalf("case %d: path %q, doc %q, cuts %v: got %v %q, want %v %q",
				i, path, doc, cuts, got.Kind, got.Text, want.Kind, want.Text)
		}
	}
}

// TestScannerCases pins the answers the issue names.
func TestScannerCases(t *testing.T) {
	for _, tc := range []struct {
		doc, path string
		want      Value
	}{
		{`{"usage":{"total_tokens":5000}}`, "usage.total_tokens", Value{Number, []byte("5000")}},
		{`{"usage":{"total_tokens":1},"usage":{"total_tokens":7}}`, "usage.total_tokens", Value{Number, []byte("7")}},
		{`{"usage":{"total_tokens":1,"total_tokens":9}}`, "usage.total_tokens", Value{Number, []byte("9")}},
		// The last "usage" replaces the first, and does not hold the path.
		{`{"usage":{"total_tokens":1},"usage":{}}`, "usage.total_tokens", Value{}},
		{`{"usage":{"total_tokens":1},"usage":5}`, "usage.total_tokens", Value{}},
		{`{"choices":[{"i":0},{"i":"12"}]}`, "choices.1.i", Value{String, []byte("12")}},
		{`{"a":{"0":3}}`, "a.0", Value{Number, []byte("3")}},
		{`{"\u0075sage":{"total_tokens":2}}`, "usage.total_tokens", Value{Number, []byte("2")}},
		{`{"usage":{"total_tokens":2}} x`, "usage.total_tokens", Value{}},
		{`{"usage":{"total_tokens":2}`, "usage.total_tokens", Value{}},
		{`{"usage":{"total_tokens":null}}`, "usage.total_tokens", Value{Kind: Other}},
		{`{"usage":{"total_tokens":[1]}}`, "usage.total_tokens", Value{Kind: Other}},
		{`{"usage":{"total_tokens":01}}`, "usage.total_tokens", Value{}},
		{`{"usage":{"total_tokens":2}}` + "\n\t ", "usage.total_tokens", Value{Number, []byte("2")}},
		{`[1,2]`, "usage", Value{}},
		{`7`, "usage", Value{}},
		{``, "usage", Value{}},
	} {
		for cut := 0; cut <= len(tc.doc); cut++ {
			got := scan(t, []byte(tc.doc), tc.path, []int{cut})
			if !same(got, tc.want) {
				t.Errorf("%s at %q cut at %d: got %v %q, want %v %q", tc.doc, tc.path, cut, got.Kind, got.Text, tc.want.Kind, tc.want.Text)
			}
			if ref := reference([]byte(tc.doc), tc.path); !same(ref, tc.want) {
				t.Errorf("%s: the reference says %v %q", tc.doc, ref.Kind, ref.Text)
			}
		}
	}
}

// TestScannerDeepNesting: nesting far past any recursive parser's limit
// neither voids the cost nor grows the scanner's state.
func TestScannerDeepNesting(t *testing.T) {
	const n = 200000
	doc := `{"deep":` + strings.Repeat(`[{"a":`, n) + `1` + strings.Repeat(`}]`, n) + `,"usage":{"total_tokens":42}}`
	got := scan(t, []byte(doc), "usage.total_tokens", []int{len(doc) / 3, len(doc) / 2})
	if !same(got, Value{Number, []byte("42")}) {
		t.Fatalf("got %v %q, want 42", got.Kind, got.Text)
	}
	// Unbalanced past KnownDepth: still invalid.
	bad := `{"deep":` + strings.Repeat(`[`, n) + strings.Repeat(`]`, n-1) + `,"usage":{"total_tokens":42}}`
	if got := scan(t, []byte(bad), "usage.total_tokens", nil); got.Kind != Absent {
		t.Fatalf("unbalanced: got %v, want Absent", got.Kind)
	}
	// Within KnownDepth, a mismatched closer is seen.
	mis := `{"deep":` + strings.Repeat(`[`, 100) + strings.Repeat(`]`, 99) + `},"usage":{"total_tokens":42}}`
	if got := scan(t, []byte(mis), "usage.total_tokens", nil); got.Kind != Absent {
		t.Fatalf("mismatched: got %v, want Absent", got.Kind)
	}
}

// TestScannerLongValues: values past MaxValue are Other, and never kept.
func TestScannerLongValues(t *testing.T) {
	long := strings.Repeat("7", 1<<20)
	for _, doc := range []string{`{"n":` + long + `}`, `{"n":"` + long + `"}`} {
		if got := scan(t, []byte(doc), "n", []int{10, 1000, 500000}); got.Kind != Other {
			t.Errorf("got %v, want Other", got.Kind)
		}
	}
}

// FuzzScanner: any input, cut anywhere, gets the reference's answer, as
// long as it is nested within KnownDepth.
func FuzzScanner(f *testing.F) {
	f.Add([]byte(`{"usage":{"total_tokens":5000}}`), uint16(7))
	f.Add([]byte(`{"a":[1,{"0":"2"}],"a":[3]}`), uint16(3))
	f.Fuzz(func(t *testing.T, doc []byte, cut uint16) {
		if bytes.Count(doc, []byte("["))+bytes.Count(doc, []byte("{")) > KnownDepth {
			return
		}
		c := int(cut) % (len(doc) + 1)
		for _, path := range paths {
			want := reference(doc, path)
			if got := scan(t, doc, path, []int{c}); !same(got, want) {
				t.Fatalf("path %q, doc %q, cut %d: got %v %q, want %v %q", path, doc, c, got.Kind, got.Text, want.Kind, want.Text)
			}
		}
	})
}

// BenchmarkScanner measures the scan of a large body off the path.
func BenchmarkScanner(b *testing.B) {
	var doc []byte
	doc = append(doc, `{"choices":[`...)
	for i := 0; len(doc) < 1<<20; i++ {
		if i > 0 {
			doc = append(doc, ',')
		}
		doc = append(doc, `{"index":0,"delta":{"content":"some words of an answer, escaped \" now and then"},"n":[1,2.5,true,null]}`...)
	}
	doc = append(doc, `],"usage":{"total_tokens":5000}}`...)
	p := NewPath("usage.total_tokens")
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	var s Scanner
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.Reset(p)
		s.Write(doc)
		if v := s.End(); v.Kind != Number {
			b.Fatal(v.Kind)
		}
	}
}

// TestPlainRun: the eight-byte test agrees with the byte-by-byte one for a
// stop byte of every value at every place among plain bytes of every
// value, and on random words.
func TestPlainRun(t *testing.T) {
	stops := func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }
	check := func(w [8]byte) {
		want := true
		for _, c := range w {
			want = want && !stops(c)
		}
		if got := plainRun(binary.LittleEndian.Uint64(w[:])); got != want {
			t.Fatalf("plainRun(% x) = %v, want %v", w, got, want)
		}
	}
	for fill := 0; fill < 256; fill++ {
		for at := 0; at < 8; at++ {
			for c := 0; c < 256; c++ {
				var w [8]byte
				for i := range w {
					w[i] = byte(fill)
				}
				w[at] = byte(c)
				check(w)
			}
		}
	}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 1_000_000; i++ {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		check(w)
	}
}

// TestScannerStringRuns: a string's end, escape or control byte found at
// every offset from the start of a piece and of an eight-byte word, with
// multi-byte UTF-8 in the run, cut anywhere: the reference's answer.
func TestScannerStringRuns(t *testing.T) {
	for _, stop := range []string{`"`, `\"`, `\u0041`, "\x01", "\x1f"} {
		for k := 0; k < 40; k++ {
			doc := []byte(`{"pad":"` + strings.Repeat("x", k) + stop + "é€" + strings.Repeat("y", 40-k) + `","usage":{"total_tokens":3}}`)
			want := reference(doc, "usage.total_tokens")
			for cut := 0; cut <= len(doc); cut++ {
				if got := scan(t, doc, "usage.total_tokens", []int{cut}); !same(got, want) {
					t.Fatalf("doc %q cut at %d: got %v %q, want %v %q", doc, cut, got.Kind, got.Text, want.Kind, want.Text)
				}
			}
		}
	}
}
