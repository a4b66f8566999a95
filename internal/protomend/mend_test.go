package protomend

import (
	"bytes"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// A message of strings at two depths: field 1 a string, field 2 a message
// whose field 1 is a string, field 3 a string not named (copied as it is).
var testFields = &Fields{Strings: []protowire.Number{1}, Messages: map[protowire.Number]*Fields{2: {Strings: []protowire.Number{1}}}}

func replace(b []byte) string { return "\uFFFD" + string(rune('0'+len(b)%10)) }

// Properties: a message whose named strings are valid comes out byte for
// byte and unmended; otherwise every named string is valid UTF-8 after, the
// fields not named are kept, and mending twice changes nothing more.
func FuzzMend(f *testing.F) {
	var inner, msg []byte
	inner = protowire.AppendTag(inner, 1, protowire.BytesType)
	inner = protowire.AppendString(inner, "v\xff")
	msg = protowire.AppendTag(msg, 1, protowire.BytesType)
	msg = protowire.AppendString(msg, "ok")
	msg = protowire.AppendTag(msg, 2, protowire.BytesType)
	msg = protowire.AppendBytes(msg, inner)
	msg = protowire.AppendTag(msg, 3, protowire.BytesType)
	msg = protowire.AppendString(msg, "\xfe")
	msg = protowire.AppendTag(msg, 4, protowire.VarintType)
	msg = protowire.AppendVarint(msg, 300)
	f.Add(msg)
	f.Add([]byte{0x0a, 0x01, 0xc3})
	f.Add(protowire.AppendTag(nil, 1, protowire.VarintType))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, mended, err := Mend(nil, b, testFields, replace)
		if err != nil {
			return
		}
		if !mended && !bytes.Equal(out, b) {
			t.Fatalf("nothing mended, yet %x became %x", b, out)
		}
		if !valid(t, out, testFields) {
			t.Fatalf("%x mended to %x: a named string is still not UTF-8", b, out)
		}
		again, more, err := Mend(nil, out, testFields, replace)
		if err != nil || more || !bytes.Equal(again, out) {
			t.Fatalf("mending %x twice: %x, %v, %v", out, again, more, err)
		}
	})
}

// valid reports whether every string of f in b is valid UTF-8.
func valid(t *testing.T, b []byte, f *Fields) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if n < 0 || m < 0 {
			t.Fatalf("mended bytes are not a message: %x", b)
		}
		if typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n:])
			if sub := f.Messages[num]; sub != nil && !valid(t, v, sub) {
				return false
			}
			for _, s := range f.Strings {
				if s == num && !utf8.Valid(v) {
					return false
				}
			}
		}
		b = b[n+m:]
	}
	return true
}
