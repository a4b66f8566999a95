package wire

import (
	"strings"
	"testing"
)

func TestDecodeAcquireRequest(t *testing.T) {
	tests := []decoderCase{
		{"ok", `{"id":"a1","ttl_ms":30000,"keys":[{"key":"k","max_in_flight":4},{"key":"j","max_in_flight":1}]}`, ""},
		{"id missing", `{"ttl_ms":30000,"keys":[{"key":"k","max_in_flight":4}]}`, "id: required"},
		{"ttl missing", `{"id":"a","keys":[{"key":"k","max_in_flight":4}]}`, "ttl_ms: required"},
		{"keys missing", `{"id":"a","ttl_ms":1000}`, "keys: required"},
		{"max missing", `{"id":"a","ttl_ms":1000,"keys":[{"key":"k"}]}`, "keys[0].max_in_flight: required"},
		{"max huge", `{"id":"a","ttl_ms":1000,"keys":[{"key":"k","max_in_flight":1e18}]}`, "keys[0].max_in_flight: must be a whole number >= 1 and <= 10000, got 1e18"},
		{"max zero", `{"id":"a","ttl_ms":1000,"keys":[{"key":"k","max_in_flight":0}]}`, "keys[0].max_in_flight: must be a whole number >= 1 and <= 10000, got 0"},
		{"max fraction", `{"id":"a","ttl_ms":1000,"keys":[{"key":"k","max_in_flight":1.5}]}`, "keys[0].max_in_flight: must be a whole number >= 1 and <= 10000, got 1.5"},
		{"ttl negative", `{"id":"a","ttl_ms":-1,"keys":[{"key":"k","max_in_flight":4}]}`, "ttl_ms: must be a whole number >= 1000 and <= 600000, got -1"},
		{"ttl huge", `{"id":"a","ttl_ms":1e300,"keys":[{"key":"k","max_in_flight":4}]}`, "ttl_ms: must be a whole number >= 1000 and <= 600000, got 1e300"},
		{"id with space", `{"id":"a b","ttl_ms":1000,"keys":[{"key":"k","max_in_flight":4}]}`, "id: only printable ASCII without spaces"},
		{"id long", `{"id":"` + strings.Repeat("x", 65) + `","ttl_ms":1000,"keys":[{"key":"k","max_in_flight":4}]}`, "id: must be 1 to 64 bytes, got 65"},
		{"duplicate key", `{"id":"a","ttl_ms":1000,"keys":[{"key":"k","max_in_flight":4},{"key":"k","max_in_flight":2}]}`, "keys[1].key: duplicate of keys[0].key"},
		{"too many keys", `{"id":"a","ttl_ms":1000,"keys":[` + strings.Repeat(`{"key":"k","max_in_flight":4},`, 16) + `{"key":"k","max_in_flight":4}]}`, "keys: must hold 1 to 16 keys, got 17"},
		{"no keys", `{"id":"a","ttl_ms":1000,"keys":[]}`, "keys: must hold 1 to 16 keys, got 0"},
		{"unknown field", `{"id":"a","ttl_ms":1000,"keys":[{"key":"k","max_in_flight":4,"burst":1}]}`, "keys[0].burst: unknown field"},
		{"key empty", `{"id":"a","ttl_ms":1000,"keys":[{"key":"","max_in_flight":4}]}`, "keys[0].key: must not be empty"},
		{"not an object", `[]`, "body: must be an object, got array"},
	}
	checkDecoder(t, tests, DecodeAcquireRequest, AppendAcquireRequest)
}

func TestDecodeSlotsRequest(t *testing.T) {
	renew := func(b []byte, l Limits) (*SlotsRequest, error) { return DecodeSlotsRequest(b, l, true) }
	release := func(b []byte, l Limits) (*SlotsRequest, error) { return DecodeSlotsRequest(b, l, false) }
	checkDecoder(t, []decoderCase{
		{"ok", `{"ttl_ms":3000,"slots":[{"key":"k","max_in_flight":4,"id":"a"},{"key":"k","max_in_flight":4,"id":"b"}]}`, ""},
		{"ttl missing", `{"slots":[{"key":"k","max_in_flight":4,"id":"a"}]}`, "ttl_ms: required"},
		{"id missing", `{"ttl_ms":3000,"slots":[{"key":"k","max_in_flight":4}]}`, "slots[0].id: required"},
		{"too many", `{"ttl_ms":3000,"slots":[` + strings.Repeat(`{"key":"k","max_in_flight":4,"id":"a"},`, 256) + `{"key":"k","max_in_flight":4,"id":"a"}]}`, "slots: must hold 1 to 256 slots, got 257"},
	}, renew, AppendSlotsRequest)
	checkDecoder(t, []decoderCase{
		{"ok", `{"slots":[{"key":"k","max_in_flight":4,"id":"a"}]}`, ""},
		{"ttl is not a release field", `{"ttl_ms":3000,"slots":[{"key":"k","max_in_flight":4,"id":"a"}]}`, "ttl_ms: unknown field"},
	}, release, AppendSlotsRequest)
}

func TestDecodeAcquireAnswer(t *testing.T) {
	req := &AcquireRequest{ID: "a", TTLMs: 1000, Keys: []SlotKey{{Key: "k", MaxInFlight: 4}, {Key: "j", MaxInFlight: 2}}}
	for _, tt := range []struct{ name, body, wantErr string }{
		{"acquired", `{"acquired":true,"in_flight":[4,1]}`, ""},
		{"refused", `{"acquired":false,"in_flight":[4,0]}`, ""},
		{"acquired with none out", `{"acquired":true,"in_flight":[0,1]}`, "in_flight[0]: must be a whole number >= 1 and <= 4, got 0"},
		{"above max", `{"acquired":false,"in_flight":[5,0]}`, "in_flight[0]: must be a whole number >= 0 and <= 4, got 5"},
		{"short", `{"acquired":true,"in_flight":[1]}`, "in_flight: must hold 2 counts, got 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := DecodeAcquireAnswer([]byte(tt.body), req)
			if tt.wantErr == "" {
				if err != nil || string(AppendAcquireAnswer(nil, a)) != tt.body+"\n" {
					t.Fatalf("%+v, %v", a, err)
				}
				return
			}
			if fe, ok := err.(*FieldError); !ok || fe.Detail() != tt.wantErr {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestDecodeSlotsAnswer(t *testing.T) {
	req := &SlotsRequest{Slots: []Slot{{Key: "k", MaxInFlight: 1, ID: "a"}, {Key: "k", MaxInFlight: 1, ID: "b"}}}
	for _, tt := range []struct {
		name, body string
		renew      bool
		wantErr    string
	}{
		{"renew", `{"slots":["held","restored"]}`, true, ""},
		{"release", `{"slots":["held","lost"]}`, false, ""},
		{"restored by a release", `{"slots":["held","restored"]}`, false, `slots[1]: unknown state "restored"`},
		{"unknown", `{"slots":["held","mine"]}`, true, `slots[1]: unknown state "mine"`},
		{"short", `{"slots":["held"]}`, true, "slots: must hold 2 states, got 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := DecodeSlotsAnswer([]byte(tt.body), req, tt.renew)
			if tt.wantErr == "" {
				if err != nil || string(AppendSlotsAnswer(nil, a)) != tt.body+"\n" {
					t.Fatalf("%+v, %v", a, err)
				}
				return
			}
			if fe, ok := err.(*FieldError); !ok || fe.Detail() != tt.wantErr {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func FuzzDecodeAcquireRequest(f *testing.F) {
	f.Add([]byte(`{"id":"a1","ttl_ms":30000,"keys":[{"key":"k","max_in_flight":4}]}`))
	f.Add([]byte(`{"ttl_ms":3000,"slots":[{"key":"k","max_in_flight":4,"id":"a"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if r, err := DecodeAcquireRequest(body, Limits{}); err == nil {
			if again, err := DecodeAcquireRequest(AppendAcquireRequest(nil, r), Limits{}); err != nil || len(again.Keys) != len(r.Keys) {
				t.Fatalf("round trip: %v", err)
			}
		}
		for _, renew := range []bool{false, true} {
			if r, err := DecodeSlotsRequest(body, Limits{}, renew); err == nil {
				if _, err := DecodeSlotsRequest(AppendSlotsRequest(nil, r), Limits{}, renew); err != nil {
					t.Fatalf("round trip: %v", err)
				}
			}
		}
	})
}

// FuzzDecodeSlotAnswers feeds the answer decoders untrusted bodies: what
// they accept holds one entry per key or slot, counts within [0, max] (at
// least 1 when acquired), and "restored" only from a renewal.
func FuzzDecodeSlotAnswers(f *testing.F) {
	f.Add([]byte(`{"acquired":true,"in_flight":[3,1]}`))
	f.Add([]byte(`{"slots":["held","restored"]}`))
	acq := &AcquireRequest{ID: "a", TTLMs: 1000, Keys: []SlotKey{{Key: "k", MaxInFlight: 4}, {Key: "j", MaxInFlight: 1}}}
	sl := &SlotsRequest{Slots: []Slot{{Key: "k", MaxInFlight: 1, ID: "a"}, {Key: "k", MaxInFlight: 1, ID: "b"}}}
	f.Fuzz(func(t *testing.T, body []byte) {
		if a, err := DecodeAcquireAnswer(body, acq); err == nil {
			for i, n := range a.InFlight {
				if n < 0 || n > acq.Keys[i].MaxInFlight || a.Acquired && n < 1 {
					t.Fatalf("accepted %s: in flight %d", body, n)
				}
			}
		}
		for _, renew := range []bool{false, true} {
			if a, err := DecodeSlotsAnswer(body, sl, renew); err == nil {
				for _, s := range a.Slots {
					if s > SlotLost || s == SlotRestored && !renew {
						t.Fatalf("accepted %s: %v (renew %v)", body, s, renew)
					}
				}
			}
		}
	})
}
