package calendar

import (
	"strings"
	"testing"
	"time"
)

// The zones of the checks: whole-hour changes in both hemispheres, a
// zone at +5:45 with no change, and one at +12:45/+13:45.
var zones = []string{"America/New_York", "Europe/London", "Australia/Sydney", "Asia/Kathmandu", "Pacific/Chatham"}

// anchors: none, and the 29th to 31st at times that fall in the hours the
// zones above skip or repeat (01:30, 02:30, 02:45, 03:15) and at midnight.
var anchors = []string{"", "2026-01-29T02:30:00", "2026-01-30T01:30:00", "2026-01-31T00:00:00",
	"2024-03-31T03:15:00", "2028-02-29T02:45:00"}

var (
	from = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	to   = time.Date(2033, 1, 1, 0, 0, 0, 0, time.UTC)
)

func mustParse(t testing.TB, period, zone, weekStart, anchor string) Spec {
	t.Helper()
	s, err := Parse(period, zone, weekStart, anchor)
	if err != nil {
		t.Fatalf("Parse(%q, %q, %q, %q): %v", period, zone, weekStart, anchor, err)
	}
	return s
}

// checkWindow checks the properties at one instant: start <= now < end, the
// same window from its start and from its last nanosecond, and the periods on
// either side meet it with no gap or overlap.
func checkWindow(t testing.TB, s Spec, now time.Time) (start, end time.Time) {
	t.Helper()
	start, end = s.Window(now)
	if now.Before(start) || !now.Before(end) {
		t.Fatalf("%v %v: Window(%v) = [%v, %v): does not hold now", s.Period, s.Location, now, start, end)
	}
	for _, at := range []time.Time{start, end.Add(-time.Nanosecond)} {
		if a, b := s.Window(at); !a.Equal(start) || !b.Equal(end) {
			t.Fatalf("%v %v: Window(%v) = [%v, %v), Window(%v) = [%v, %v): one period, two windows", s.Period, s.Location, now, start, end, at, a, b)
		}
	}
	if a, _ := s.Window(end); !a.Equal(end) {
		t.Fatalf("%v %v: Window(%v) ends at %v, but Window(end) starts at %v: a gap or an overlap", s.Period, s.Location, now, end, a)
	}
	if _, b := s.Window(start.Add(-time.Nanosecond)); !b.Equal(start) {
		t.Fatalf("%v %v: Window(%v) starts at %v, but the period before ends at %v", s.Period, s.Location, now, start, b)
	}
	return start, end
}

// walk visits every period from..to in order, checking each: Window at its
// start, its middle and its last nanosecond is the same period, which starts
// where the one before ended (so no gap or overlap: the checks of
// checkWindow, each made once). It returns the number of periods.
func walk(t *testing.T, s Spec, from, to time.Time, each func(start, end time.Time)) int {
	t.Helper()
	start, _ := checkWindow(t, s, from)
	n := 0
	for start.Before(to) {
		a, b := s.Window(start)
		if !a.Equal(start) || !b.After(a) {
			t.Fatalf("%v %v: Window(%v) = [%v, %v): the period after one ending at %v", s.Period, s.Location, start, a, b, start)
		}
		for _, at := range []time.Time{a.Add(b.Sub(a) / 2), b.Add(-time.Nanosecond)} {
			if c, d := s.Window(at); !c.Equal(a) || !d.Equal(b) {
				t.Fatalf("%v %v: Window(%v) = [%v, %v), Window(%v) = [%v, %v): one period, two windows", s.Period, s.Location, start, a, b, at, c, d)
			}
		}
		if each != nil {
			each(a, b)
		}
		start = b
		n++
	}
	return n
}

// TestWindowTilesDaysAndLonger walks every day, week, month, quarter and year
// period from 2026 to 2032 in each zone with each anchor: every instant in
// exactly one period, periods tiling time, each boundary on its local wall
// time (or, when the zone skips that time, read with the offset before the
// change), the reset the next boundary.
func TestWindowTilesDaysAndLonger(t *testing.T) {
	for _, zone := range zones {
		for _, period := range []string{"day", "week", "month", "quarter", "year"} {
			for _, anchor := range anchors {
				s := mustParse(t, period, zone, "", anchor)
				n := walk(t, s, from, to, func(start, end time.Time) {
					checkWall(t, s, start)
					checkLength(t, s, start, end)
				})
				if n == 0 {
					t.Fatalf("%s %s %q: no period", period, zone, anchor)
				}
			}
		}
	}
}

// checkWall checks that a boundary reads the wall time its Spec sets, or that
// the zone skipped that reading and the boundary is it read with the offset
// before the change.
func checkWall(t testing.TB, s Spec, start time.Time) {
	t.Helper()
	want := s.Anchor
	if want.IsZero() {
		want = DateTime{Month: time.January, Day: 1}
	}
	r := start.In(s.location())
	y, m, d := r.Date()
	hh, mm, ss := r.Clock()
	ok := hh == want.Hour && mm == want.Minute && ss == want.Second
	switch s.Period {
	case Week:
		ok = ok && r.Weekday() == s.WeekStart
	case Month, Quarter, Year:
		ok = ok && d == min(want.Day, daysIn(int64(y), m))
		if s.Period == Quarter {
			ok = ok && (int(m)-1)%3 == (int(want.Month)-1)%3
		}
		if s.Period == Year {
			ok = ok && m == want.Month
		}
	}
	if ok {
		return
	}
	// Skipped: the offset changed within the two hours before the boundary
	// (the zones change by an hour at most), and the boundary read with the
	// offset before the change is the wanted wall time.
	before := start.Add(-2 * time.Hour)
	_, offBefore := before.Zone()
	_, offAt := r.Zone()
	if offAt <= offBefore {
		t.Fatalf("%v %v: boundary %v is off its wall time and no clock was skipped", s.Period, s.Location, r)
	}
	back := r.UTC().Add(time.Duration(offBefore) * time.Second) // the wall time, as read with the offset before the change
	hh, mm, ss = back.Clock()
	if hh != want.Hour || mm != want.Minute || ss != want.Second {
		t.Fatalf("%v %v: boundary %v: a skipped wall time %02d:%02d:%02d is not the anchor's", s.Period, s.Location, r, hh, mm, ss)
	}
}

// checkLength checks a period's real length against its calendar length,
// within the zone's offset changes during it.
func checkLength(t testing.TB, s Spec, start, end time.Time) {
	t.Helper()
	_, o1 := start.Zone()
	_, o2 := end.Zone()
	d := end.Sub(start) + time.Duration(o2-o1)*time.Second // the wall-clock length
	var lo, hi time.Duration
	const day = 24 * time.Hour
	switch s.Period {
	case Day:
		lo, hi = day, day
	case Week:
		lo, hi = 7*day, 7*day
	case Month:
		lo, hi = 28*day, 31*day
	case Quarter:
		lo, hi = 89*day, 92*day
	case Year:
		lo, hi = 365*day, 366*day
	}
	// A boundary read with the offset before a change moves by that change.
	lo, hi = lo-2*time.Hour, hi+2*time.Hour
	if d < lo || d > hi {
		t.Fatalf("%v %v: [%v, %v) lasts %v on the wall clock", s.Period, s.Location, start, end, d)
	}
}

// transitions returns the instants at which loc changes its offset in
// [from, to).
func transitions(loc *time.Location, from, to time.Time) []time.Time {
	var out []time.Time
	at := from
	for i := 0; i < 1000; i++ {
		_, end := at.In(loc).ZoneBounds()
		if end.IsZero() || !end.Before(to) {
			break
		}
		out = append(out, end)
		at = end
	}
	return out
}

// TestWindowTilesHours walks every hour period from 2026 to 2032 in each
// zone: every period is one hour of real time (the zones change by whole
// hours), each boundary is an instant whose local clock reads the anchor's
// minute and second.
func TestWindowTilesHours(t *testing.T) {
	for _, zone := range zones {
		for _, anchor := range []string{"", "2026-01-31T02:30:15"} {
			s := mustParse(t, "hour", zone, "", anchor)
			walk(t, s, from, to, func(start, end time.Time) {
				if end.Sub(start) != time.Hour {
					t.Fatalf("hour %s: [%v, %v) is not one hour of real time", zone, start, end)
				}
				if _, mm, ss := start.Clock(); mm != s.Anchor.Minute || ss != s.Anchor.Second {
					t.Fatalf("hour %s: boundary %v does not read :%02d:%02d", zone, start, s.Anchor.Minute, s.Anchor.Second)
				}
			})
		}
	}
}

// TestWindowMinutesAroundChanges walks minute periods through three hours
// either side of every offset change from 2026 to 2032 in each zone, and
// compares the boundaries with the instants, found second by second, at
// which the local clock reads the anchor's second.
func TestWindowMinutesAroundChanges(t *testing.T) {
	for _, zone := range zones {
		loc, _ := time.LoadLocation(zone)
		s := mustParse(t, "minute", zone, "", "2026-01-31T02:30:15")
		changes := transitions(loc, from, to)
		if zone != "Asia/Kathmandu" && len(changes) != 14 {
			t.Fatalf("%s: %d changes from 2026 to 2032, want 14", zone, len(changes))
		}
		for _, c := range changes {
			lo, hi := c.Add(-3*time.Hour), c.Add(3*time.Hour)
			var got []time.Time
			walk(t, s, lo, hi, func(start, end time.Time) {
				if end.Sub(start) != time.Minute {
					t.Fatalf("minute %s: [%v, %v) is not one minute of real time", zone, start, end)
				}
				got = append(got, start)
			})
			var want []time.Time
			first, _ := s.Window(lo)
			for at := first; at.Before(hi); at = at.Add(time.Second) {
				if at.In(loc).Second() == 15 {
					want = append(want, at)
				}
			}
			if len(got) != len(want) {
				t.Fatalf("minute %s around %v: %d boundaries, the clock reads :15 %d times", zone, c, len(got), len(want))
			}
			for i := range got {
				if !got[i].Equal(want[i]) {
					t.Fatalf("minute %s around %v: boundary %d at %v, the clock reads :15 at %v", zone, c, i, got[i], want[i])
				}
			}
		}
	}
}

// TestWindowDaysAroundChanges compares the day boundary of each change day
// from 2026 to 2032, in each zone and with anchors in the hours changes skip
// or repeat, with one found by reading the clock minute by minute: the first
// instant that reads the anchor's time, or, when none does, the anchor's time
// read with the offset before the change.
func TestWindowDaysAroundChanges(t *testing.T) {
	for _, zone := range zones {
		loc, _ := time.LoadLocation(zone)
		for _, anchor := range anchors {
			s := mustParse(t, "day", zone, "", anchor)
			for _, c := range transitions(loc, from, to) {
				y, m, d := c.In(loc).Date()
				wall := time.Date(y, m, d, s.Anchor.Hour, s.Anchor.Minute, s.Anchor.Second, 0, time.UTC)
				var want time.Time
				for at := wall.Add(-15 * time.Hour); at.Before(wall.Add(15 * time.Hour)); at = at.Add(time.Minute) {
					_, off := at.In(loc).Zone()
					if at.Add(time.Duration(off) * time.Second).Equal(wall) {
						want = at
						break
					}
				}
				if want.IsZero() { // skipped: read with the offset one second before the change
					_, off := c.Add(-time.Second).In(loc).Zone()
					want = wall.Add(-time.Duration(off) * time.Second)
				}
				if got, _ := s.Window(want); !got.Equal(want) {
					t.Fatalf("day %s %q: the boundary of %v is %v, want %v", zone, anchor, wall, got, want)
				}
			}
		}
	}
}

// TestWindowTimeline pins the cases the issue names, as a table.
func TestWindowTimeline(t *testing.T) {
	utc := func(s string) time.Time {
		at, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	for i, c := range []struct {
		period, zone, weekStart, anchor string
		now                             string
		start, end                      string
	}{
		// Kathmandu (UTC+5:45): hours turn at hh:15 UTC.
		{"hour", "Asia/Kathmandu", "", "", "2026-06-01T10:20:00Z", "2026-06-01T10:15:00Z", "2026-06-01T11:15:00Z"},
		{"hour", "Asia/Kathmandu", "", "", "2026-06-01T10:14:59Z", "2026-06-01T09:15:00Z", "2026-06-01T10:15:00Z"},
		{"minute", "Asia/Kathmandu", "", "", "2026-06-01T10:14:59.5Z", "2026-06-01T10:14:00Z", "2026-06-01T10:15:00Z"},
		// New York, spring forward 2026-03-08 02:00 EST -> 03:00 EDT (07:00 UTC).
		{"hour", "America/New_York", "", "", "2026-03-08T06:59:59Z", "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z"},
		{"day", "America/New_York", "", "", "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"day", "America/New_York", "", "2026-01-01T02:30:00", "2026-03-08T07:29:59Z", "2026-03-07T07:30:00Z", "2026-03-08T07:30:00Z"},
		// ... fall back 2026-11-01 02:00 EDT -> 01:00 EST (06:00 UTC): the repeated hour is two periods.
		{"hour", "America/New_York", "", "", "2026-11-01T05:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z"},
		{"hour", "America/New_York", "", "", "2026-11-01T06:30:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"},
		{"day", "America/New_York", "", "", "2026-11-01T12:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"day", "America/New_York", "", "2026-01-01T01:30:00", "2026-11-01T06:45:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"},
		// Months anchored on the 31st: the last day of shorter months; 2028 is a leap year.
		{"month", "Europe/London", "", "2026-01-31", "2028-02-15T00:00:00Z", "2028-01-31T00:00:00Z", "2028-02-29T00:00:00Z"},
		{"month", "Europe/London", "", "2026-01-31", "2028-03-30T22:59:59Z", "2028-02-29T00:00:00Z", "2028-03-30T23:00:00Z"},
		{"year", "UTC", "", "2028-02-29T00:00:00", "2029-03-01T00:00:00Z", "2029-02-28T00:00:00Z", "2030-02-28T00:00:00Z"},
		{"quarter", "UTC", "", "2026-02-15T00:00:00", "2026-04-01T00:00:00Z", "2026-02-15T00:00:00Z", "2026-05-15T00:00:00Z"},
		// Weeks: monday by default, or the anchor's weekday (2026-01-01 is a Thursday).
		{"week", "UTC", "", "", "2026-01-01T00:00:00Z", "2025-12-29T00:00:00Z", "2026-01-05T00:00:00Z"},
		{"week", "UTC", "sunday", "", "2026-01-01T00:00:00Z", "2025-12-28T00:00:00Z", "2026-01-04T00:00:00Z"},
		{"week", "UTC", "", "2026-01-01T06:00:00", "2026-01-08T05:59:59Z", "2026-01-01T06:00:00Z", "2026-01-08T06:00:00Z"},
	} {
		s := mustParse(t, c.period, c.zone, c.weekStart, c.anchor)
		now := utc(c.now)
		start, end := s.Window(now)
		if !start.Equal(utc(c.start)) || !end.Equal(utc(c.end)) {
			t.Errorf("step %d: %s %s %q: Window(%v) = [%v, %v), want [%v, %v)", i, c.period, c.zone, c.anchor, now,
				start.UTC(), end.UTC(), c.start, c.end)
		}
	}
}

// TestParseErrors: each refusal names its field and says why.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ period, zone, weekStart, anchor, want string }{
		{"fortnight", "", "", "", "period: must be one of"},
		{"", "", "", "", "period: must be one of"},
		{"Month", "", "", "", "period: must be one of"},
		{"day", "Mars/Olympus", "", "", "time_zone: \"Mars/Olympus\" is not an IANA time zone"},
		{"day", "Local", "", "", "time_zone: \"Local\" depends on the host"},
		{"day", "../../etc/passwd", "", "", "time_zone:"},
		{"week", "", "someday", "", "week_start: must be a weekday's name"},
		{"week", "", "Monday", "", "week_start: must be a weekday's name in lower case"},
		{"day", "", "", "2026-02-30T00:00:00", "anchor: must be a local date-time"},
		{"day", "", "", "2026-01-31T00:00:00Z", "anchor: must be a local date-time"},
		{"day", "", "", "2026-01-31T24:00:00", "anchor: must be a local date-time"},
		{"day", "", "", "0000-01-01T00:00:00", "anchor: must be a local date-time"},
		{"week", "", "monday", "2026-01-01T00:00:00", "week_start: monday disagrees with the anchor 2026-01-01T00:00:00, a thursday"},
	} {
		_, err := Parse(c.period, c.zone, c.weekStart, c.anchor)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "calendar: ") {
			t.Errorf("Parse(%q, %q, %q, %q) = %v, want an error with %q", c.period, c.zone, c.weekStart, c.anchor, err, c.want)
		}
	}
	s, err := Parse("week", "Europe/Berlin", "sunday", "")
	if err != nil || s.WeekStart != time.Sunday || s.Location.String() != "Europe/Berlin" || !s.Anchor.IsZero() {
		t.Fatalf("Parse(week, Europe/Berlin, sunday) = %+v, %v", s, err)
	}
	if s, err := Parse("day", "", "", ""); err != nil || s.Location != time.UTC || s.WeekStart != time.Monday {
		t.Fatalf("Parse(day) = %+v, %v: want UTC and monday", s, err)
	}
}

// TestZeroSpec: a Spec not from Parse (nil Location, no Period) is a UTC day
// and does not panic.
func TestZeroSpec(t *testing.T) {
	now := time.Date(2026, 5, 5, 13, 0, 0, 0, time.UTC)
	start, end := Spec{}.Window(now)
	if !start.Equal(time.Date(2026, 5, 5, 0, 0, 0, 0, time.UTC)) || end.Sub(start) != 24*time.Hour {
		t.Fatalf("Spec{}.Window(%v) = [%v, %v)", now, start, end)
	}
}
