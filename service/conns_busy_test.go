package service

import (
	"testing"
	"time"
)

// TestConnGuardBusy: with UnauthenticatedBusy (the gRPC door's), a sweep
// also closes a connection that never authenticated and has been busy (a
// stream open) that long; an authenticated one, busy or not, never.
func TestConnGuardBusy(t *testing.T) {
	const ms = time.Millisecond
	runGuard(t, ConnOptions{MaxConns: 4, Grace: time.Second, UnauthenticatedIdle: 5 * time.Second, UnauthenticatedBusy: 10 * time.Second}, []guardStep{
		{0, "admit", "a", "", ""},
		{0, "admit", "b", "", ""},
		{0, "admit", "c", "", ""},
		{0, "active", "a", "", "a opens a stream"},
		{0, "request", "a", "", "without a token"},
		{0, "auth", "b", "", "b authenticated"},
		{0, "active", "b", "", "b opens a stream"},
		{4999 * ms, "sweep", "", "", "c idle 4.999 s, a busy 4.999 s"},
		{5000 * ms, "sweep", "", "c", "c idle since accepted, 5 s"},
		{9999 * ms, "sweep", "", "", "a busy 9.999 s"},
		{10000 * ms, "sweep", "", "a", "a busy 10 s"},
		{time.Hour, "sweep", "", "", "b authenticated: never"},
	})
}

// Mark marks a connection the guard accepted, as MarkRequest does a
// request's, and leaves any other alone.
func TestConnGuardMark(t *testing.T) {
	g, err := NewConnGuard(ConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewConnGuard(ConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := g.admit(pipeConn(t))
	if g.Mark(c, ConnRequest) {
		t.Error("a connection that carried no authenticated call reported authenticated")
	}
	if other.Mark(c, ConnAuthenticated) || g.Mark(pipeConn(t), ConnAuthenticated) {
		t.Error("a connection another guard accepted, or none did, was marked")
	}
	if g.Mark(c, ConnRequest) {
		t.Error("another guard's mark reached the connection")
	}
	if !g.Mark(c, ConnAuthenticated) || !g.Mark(c, ConnRequest) {
		t.Error("an authenticated connection reported not authenticated")
	}
}

// TestConnGuardRefusedThenAuthenticated: a connection that carried an
// authenticated call is a gateway's and never closed by the guard, even
// when a call on it was refused before (the gRPC door closed such a
// connection at the next sweep, cutting the calls in flight on it: a loaded
// CI run saw its authorized call end in EOF).
func TestConnGuardRefusedThenAuthenticated(t *testing.T) {
	const ms = time.Millisecond
	runGuard(t, ConnOptions{MaxConns: 2, Grace: time.Second, UnauthenticatedIdle: 5 * time.Second, UnauthenticatedBusy: 10 * time.Second}, []guardStep{
		{0, "admit", "a", "", ""},
		{0, "admit", "b", "", ""},
		{0, "request", "a", "", "a without a token"},
		{0, "refuse", "a", "", "a refused"},
		{0, "request", "b", "", "b without a token"},
		{0, "refuse", "b", "", "b refused"},
		{100 * ms, "auth", "a", "", "then a authenticated"},
		{time.Second, "sweep", "", "b", "b refused and never authenticated: closed"},
		{time.Hour, "sweep", "", "", "a authenticated: never"},
		{time.Hour, "admit", "c", "", ""},
		{time.Hour, "admit", "d", "cap", "at the cap, a (a gateway's) and c (fresh) stay: d is closed"},
	})
}
