package redistest

import (
	"strings"
	"testing"
)

func TestStartKillRestart(t *testing.T) {
	s := Start(t)
	if got, err := Do(s.Addr(), "SET", "k", "v"); err != nil || got != "OK" {
		t.Fatalf("SET = %q, %v; want OK", got, err)
	}
	s.Kill()
	if _, err := Do(s.Addr(), "PING"); err == nil {
		t.Fatal("PING after Kill: want an error")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got, err := Do(s.Addr(), "EXISTS", "k"); err != nil || got != "0" {
		t.Fatalf("EXISTS k after restart = %q, %v; want 0 (no persistence)", got, err)
	}
}

func TestCluster(t *testing.T) {
	c := StartCluster(t)
	if len(c.Addrs()) != 3 {
		t.Fatalf("Addrs() = %v, want 3", c.Addrs())
	}
	info, err := Do(c.Addrs()[0], "CLUSTER", "INFO")
	if err != nil || !strings.Contains(info, "cluster_slots_assigned:16384") {
		t.Fatalf("CLUSTER INFO = %q, %v; want all slots assigned", info, err)
	}
	s := c.Servers[1]
	s.Kill()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitOK(); err != nil {
		t.Fatal(err)
	}
}
