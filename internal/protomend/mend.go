// Package protomend makes a protobuf message whose only fault is strings
// that are not valid UTF-8 decodable by Go's protobuf, which refuses such a
// proto3 string while Envoy's C++ serializer sends one (a request header's
// bytes, as they are, in a rate limit descriptor or a quota bucket_id).
//
// Mend copies a message's wire form field by field and replaces each string
// field named in its Fields, at any depth, that is not valid UTF-8 by what
// the caller's replace function makes of its bytes (the services use
// rlsconfig.InvalidUTF8: a stated form, valid UTF-8, distinct for distinct
// bytes). Every other field is copied byte for byte, so a message whose
// strings are all valid comes out as it went in; the result is then decoded
// strictly. One mechanism for every gRPC door: a value a client sends is
// never a reason to fail a call.
package protomend

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Fields are the string fields of one message type, and the fields holding
// messages whose strings are mended too, by field number (a map's entries
// are messages of key 1 and value 2).
type Fields struct {
	Strings  []protowire.Number
	Messages map[protowire.Number]*Fields
}

// Mend appends to out the message b of type f with every string of f, at
// any depth, that is not valid UTF-8 replaced by replace of its bytes, and
// reports whether any was. It fails on bytes that are not a well-formed
// message.
func Mend(out, b []byte, f *Fields, replace func([]byte) string) ([]byte, bool, error) {
	mended := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, protowire.ParseError(n)
		}
		sub := f.Messages[num]
		isString := false
		for _, s := range f.Strings {
			isString = isString || s == num
		}
		if typ != protowire.BytesType || (sub == nil && !isString) {
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return nil, false, protowire.ParseError(m)
			}
			out = append(out, b[:n+m]...)
			b = b[n+m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return nil, false, protowire.ParseError(m)
		}
		switch {
		case sub != nil:
			inner, any, err := Mend(nil, v, sub, replace)
			if err != nil {
				return nil, false, err
			}
			if !any {
				out = append(out, b[:n+m]...)
				break
			}
			mended = true
			out = protowire.AppendBytes(append(out, b[:n]...), inner)
		case utf8.Valid(v):
			out = append(out, b[:n+m]...)
		default:
			mended = true
			out = protowire.AppendString(append(out, b[:n]...), replace(v))
		}
		b = b[n+m:]
	}
	return out, mended, nil
}
