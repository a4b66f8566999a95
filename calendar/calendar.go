// Package calendar is the arithmetic of calendar periods in a time zone: the
// minute, hour, day, week, month, quarter or year that contains an instant,
// with its boundaries on local wall time. It is pure: time is always a
// parameter, and nothing here reads a clock.
//
// # Model
//
// A Spec names a period, a time zone, the day weeks start on and an optional
// anchor: a local date-time at which a period starts. Without an anchor,
// periods start at the natural boundary (second 0 of a minute, minute 0 of
// an hour, midnight, midnight on WeekStart, the 1st of a month, of January,
// April, July and October, and of January). With one, every period starts at
// the anchor's phase within it: the anchor's second (minute), minute and
// second (hour), time of day (day), weekday and time of day (week), day of
// the month and time of day (month), month within the quarter, day and time
// (quarter), month, day and time (year). The anchor's year, and for periods
// shorter than a year its further fields, only set that phase: periods tile
// all time, before the anchor as after it. A day of the month the month does
// not have (an anchor on the 29th to 31st) is the month's last day.
//
// Each period's boundaries are a sequence of local wall times (readings of
// the zone's clock). A daylight-saving change moves none of them off its
// local time; it makes the period that contains it shorter or longer in real
// time. A boundary whose wall time the zone skips or repeats is resolved so:
//
//   - Minute and hour: the boundaries are the instants at which the zone's
//     clock reads a boundary time. A reading the clock skips is no boundary
//     (in America/New_York on a spring-forward day the hour period that starts
//     at 01:00 EST ends at 03:00 EDT, one hour of real time later); a reading
//     it repeats is two boundaries (01:00 EDT and 01:00 EST on a fall-back day
//     both start an hour period, each one hour of real time). With the
//     whole-hour changes of nearly every zone, every hour period is one hour
//     of real time.
//   - Day, week, month, quarter and year: each boundary time is one instant.
//     A wall time the zone repeats resolves to its first occurrence (before
//     the clock goes back); a wall time the zone skips resolves to the
//     instant the clock would have read it had it not changed, that is, read
//     with the offset in force before the change (02:30 on a spring-forward
//     day in America/New_York is 03:30 EDT). So a day with a change is 23 or
//     25 hours long (or as long as the change makes it), and no boundary moves
//     to another day.
//
// Guarantees, for instants between the years 1 and 9999 (outside them the
// functions do not panic, but the results are unspecified): every instant
// lies in exactly one period; Window(now) returns start <= now < end, and
// Window(end) starts at end, so periods tile time with no gap or overlap; the
// end is the next boundary after now (the reset). Boundaries fall on whole
// seconds.
//
// # Zones
//
// Zones are Go's time.Location, loaded by IANA name (time.LoadLocation): from
// the host's zone files where it has them, else from the copy of the zone
// database compiled in (time/tzdata), so Parse works on hosts with no zone
// files (the Wasm build among them).
//
// # Concurrency
//
// A Spec is a plain value; its methods share no state and are safe to call
// from any number of goroutines.
package calendar

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // the zone database compiled in: zones work with no zone files on the host
)

// Period is the length of a calendar period.
type Period int

// The periods. The zero Period is none: a Spec with it is not valid (see
// Window).
const (
	Minute Period = iota + 1
	Hour
	Day
	Week
	Month
	Quarter
	Year
)

var periodNames = [...]string{Minute: "minute", Hour: "hour", Day: "day", Week: "week", Month: "month",
	Quarter: "quarter", Year: "year"}

// String is the period's name as configured ("month").
func (p Period) String() string {
	if p >= Minute && p <= Year {
		return periodNames[p]
	}
	return "Period(" + strconv.Itoa(int(p)) + ")"
}

// DateTime is a local date-time: a reading of a zone's clock, no offset. The
// zero DateTime is none (no anchor).
type DateTime struct {
	Year                      int
	Month                     time.Month
	Day, Hour, Minute, Second int
}

// IsZero reports whether d is the zero DateTime (no anchor).
func (d DateTime) IsZero() bool { return d == DateTime{} }

// String is d as Parse reads it: 2006-01-02T15:04:05.
func (d DateTime) String() string {
	b := make([]byte, 0, 19)
	b = pad(b, d.Year, 4)
	b = pad(append(b, '-'), int(d.Month), 2)
	b = pad(append(b, '-'), d.Day, 2)
	b = pad(append(b, 'T'), d.Hour, 2)
	b = pad(append(b, ':'), d.Minute, 2)
	b = pad(append(b, ':'), d.Second, 2)
	return string(b)
}

// pad appends n in decimal, zero-padded to width digits.
func pad(b []byte, n, width int) []byte {
	if n < 0 {
		b, n = append(b, '-'), -n
	}
	for w := len(strconv.Itoa(n)); w < width; w++ {
		b = append(b, '0')
	}
	return strconv.AppendInt(b, int64(n), 10)
}

// Spec is a calendar period in a time zone: what Parse returns. A Location of
// nil is UTC.
type Spec struct {
	Period    Period
	Location  *time.Location
	WeekStart time.Weekday // the day weeks start on (periods of a week without an anchor)
	Anchor    DateTime     // a local date-time at which a period starts; zero for the natural boundaries
}

// Parse reads a period as configured: period is one of minute, hour, day,
// week, month, quarter and year; timeZone an IANA name ("" is UTC; "Local",
// which depends on the host, is refused); weekStart a weekday's English name
// in lower case ("" is monday); anchor a local date-time, 2006-01-02T15:04:05 or 2006-01-02
// (midnight), or "" for none. For weeks an anchor sets the day weeks start
// on, so a weekStart given with it must name the anchor's weekday. Each error
// names the field and says why.
func Parse(period, timeZone, weekStart, anchor string) (Spec, error) {
	var s Spec
	for p := Minute; p <= Year; p++ {
		if period == periodNames[p] {
			s.Period = p
		}
	}
	if s.Period == 0 {
		return Spec{}, errors.New("calendar: period: must be one of minute, hour, day, week, month, quarter, year, got " + quote(period))
	}
	switch timeZone {
	case "", "UTC":
		s.Location = time.UTC
	case "Local":
		return Spec{}, errors.New(`calendar: time_zone: "Local" depends on the host; name an IANA zone such as "Europe/Paris"`)
	default:
		loc, err := time.LoadLocation(timeZone)
		if err != nil {
			return Spec{}, errors.New("calendar: time_zone: " + quote(timeZone) + " is not an IANA time zone name in Go's zone database")
		}
		s.Location = loc
	}
	s.WeekStart = time.Monday
	if weekStart != "" {
		found := false
		for d := time.Sunday; d <= time.Saturday; d++ {
			if weekStart == strings.ToLower(d.String()) {
				s.WeekStart, found = d, true
			}
		}
		if !found {
			return Spec{}, errors.New("calendar: week_start: must be a weekday's name in lower case (monday to sunday), got " + quote(weekStart))
		}
	}
	if anchor != "" {
		t, err := time.Parse("2006-01-02T15:04:05", anchor)
		if err != nil {
			t, err = time.Parse("2006-01-02", anchor)
		}
		if err != nil || t.Year() < 1 {
			return Spec{}, errors.New("calendar: anchor: must be a local date-time 2006-01-02T15:04:05 (or a date 2006-01-02) with no offset, a year from 1, got " + quote(anchor))
		}
		s.Anchor = DateTime{Year: t.Year(), Month: t.Month(), Day: t.Day(), Hour: t.Hour(), Minute: t.Minute(), Second: t.Second()}
		if s.Period == Week {
			wd := t.Weekday()
			if weekStart != "" && wd != s.WeekStart {
				return Spec{}, errors.New("calendar: week_start: " + strings.ToLower(s.WeekStart.String()) + " disagrees with the anchor " + anchor +
					", a " + strings.ToLower(wd.String()) + " (an anchor sets the day weeks start on)")
			}
			s.WeekStart = wd
		}
	}
	return s, nil
}

// quote is a value quoted in an error, at most 64 bytes of it.
func quote(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "…"
	}
	return strconv.Quote(s)
}

const (
	secPerMinute = 60
	secPerHour   = 3600
	secPerDay    = 86400
	// maxSteps bounds every search over zone segments and boundaries; a
	// real zone needs at most a few.
	maxSteps = 64
	// maxOffset is beyond any UTC offset in the zone database (the largest
	// are under 16 hours).
	maxOffset = 26 * secPerHour
)

// Window returns the period that contains now: start <= now < end, both in
// the Spec's Location. end is the next boundary (the reset); end − start is
// the period's length in real time, which varies (months, and days with a
// daylight-saving change). A Spec with an unknown Period (not from Parse)
// reads as a Day.
func (s Spec) Window(now time.Time) (start, end time.Time) {
	loc := s.location()
	n := now.Unix() // floor: boundaries are whole seconds, so comparing with it is exact
	var a, b int64
	switch s.Period {
	case Minute, Hour:
		a, b = s.readingWindow(loc, n)
	default:
		a, b = s.wallWindow(loc, n)
	}
	return time.Unix(a, 0).In(loc), time.Unix(b, 0).In(loc)
}

func (s Spec) location() *time.Location {
	if s.Location == nil {
		return time.UTC
	}
	return s.Location
}

// segment is the zone's span of one offset that holds the instant sec (Unix
// seconds): [start, end), math.MinInt64 and math.MaxInt64 for no bound.
func segment(loc *time.Location, sec int64) (start, end int64, offset int64) {
	t := time.Unix(sec, 0).In(loc)
	_, off := t.Zone()
	zs, ze := t.ZoneBounds()
	start, end = math.MinInt64, math.MaxInt64
	if !zs.IsZero() {
		start = zs.Unix()
	}
	if !ze.IsZero() {
		end = ze.Unix()
	}
	return start, end, int64(off)
}

// readingWindow is Window for minutes and hours: the boundaries are the
// instants at which the zone's clock reads phase modulo the period.
func (s Spec) readingWindow(loc *time.Location, n int64) (start, end int64) {
	length, phase := int64(secPerMinute), int64(s.Anchor.Second)
	if s.Period == Hour {
		length, phase = secPerHour, int64(s.Anchor.Minute*secPerMinute+s.Anchor.Second)
	}
	floor := func(r int64) int64 { return floorDiv(r-phase, length)*length + phase }
	// start: the last boundary at or before n, in n's segment or an earlier one.
	zs, ze, off := segment(loc, n)
	start = floor(n+off) - off
	for i := 0; i < maxSteps && start < zs; i++ {
		t := zs - 1
		zs, _, off = segment(loc, t)
		start = floor(t+off) - off
	}
	// end: the first boundary after n, in n's segment or a later one.
	zs, ze, off = segment(loc, n)
	end = floor(n+off) + length - off
	for i := 0; i < maxSteps && end >= ze; i++ {
		zs, ze, off = segment(loc, ze)
		end = floor(zs+off-1) + length - off // the first reading >= the segment's first
	}
	return start, end
}

// wallWindow is Window for days and longer: each boundary is one wall time,
// resolved to one instant (see resolve); the instants never decrease.
func (s Spec) wallWindow(loc *time.Location, n int64) (start, end int64) {
	_, _, off := segment(loc, n)
	k := s.index(n + off)
	start = s.resolve(loc, s.wall(k))
	for i := 0; i < maxSteps && start > n; i++ {
		k--
		start = s.resolve(loc, s.wall(k))
	}
	end = s.resolve(loc, s.wall(k+1))
	for i := 0; i < maxSteps && end <= n; i++ {
		k++
		start, end = end, s.resolve(loc, s.wall(k+1))
	}
	return start, end
}

// resolve maps a wall time (Unix seconds of the reading as if it were UTC) to
// an instant: its first occurrence, or for a skipped reading the instant with
// the offset in force before the gap.
func (s Spec) resolve(loc *time.Location, w int64) int64 {
	// Every occurrence w − offset lies at or after w − maxOffset; walk the
	// segments from there in time order.
	t := w - maxOffset
	prev := int64(0)
	for i := 0; i < maxSteps; i++ {
		zs, ze, off := segment(loc, t)
		at := w - off
		switch {
		case at >= zs && at < ze:
			return at
		case at < zs && i > 0:
			// Past the previous segment's readings, before this one's: a gap.
			return w - prev
		case ze == math.MaxInt64:
			return at
		}
		t, prev = ze, off
	}
	return w - prev
}

// tod is the anchor's time of day in seconds.
func (s Spec) tod() int64 {
	return int64(s.Anchor.Hour*secPerHour + s.Anchor.Minute*secPerMinute + s.Anchor.Second)
}

// wall is the k-th boundary's wall time (Unix seconds of the reading as if
// UTC), for days and longer: days since 1970-01-01, weeks, months since year
// 0, quarters, years.
func (s Spec) wall(k int64) int64 {
	switch s.Period {
	case Week:
		return (k*7+s.weekShift())*secPerDay + s.tod()
	case Month:
		return s.monthWall(k)
	case Quarter:
		return s.monthWall(3*k + s.quarterPhase())
	case Year:
		return s.monthWall(12*k + s.yearMonth())
	}
	return k*secPerDay + s.tod()
}

// index is the k whose wall time is the last at or before the reading r.
func (s Spec) index(r int64) int64 {
	switch s.Period {
	case Week:
		return floorDiv(r-s.tod()-s.weekShift()*secPerDay, 7*secPerDay)
	case Month, Quarter, Year:
		y, m, _ := time.Unix(r, 0).UTC().Date()
		mi := int64(y)*12 + int64(m) - 1
		var k int64
		switch s.Period {
		case Month:
			k = mi
		case Quarter:
			k = floorDiv(mi-s.quarterPhase(), 3)
		default:
			k = int64(y)
		}
		if s.wall(k) > r {
			k--
		}
		return k
	}
	return floorDiv(r-s.tod(), secPerDay)
}

// weekShift is the day, counted from 1970-01-01 (a Thursday), of the first
// week's start.
func (s Spec) weekShift() int64 {
	return int64((s.WeekStart - time.Thursday + 7) % 7)
}

func (s Spec) anchorMonth() int64 {
	if s.Anchor.IsZero() {
		return 0
	}
	return int64(s.Anchor.Month) - 1
}

func (s Spec) quarterPhase() int64 { return s.anchorMonth() % 3 }
func (s Spec) yearMonth() int64    { return s.anchorMonth() }

// monthWall is the wall time of the anchor's day (clamped to the month's
// last) and time of day in month mi (months since year 0).
func (s Spec) monthWall(mi int64) int64 {
	y, m := floorDiv(mi, 12), time.Month(mi-floorDiv(mi, 12)*12+1)
	day := 1
	if !s.Anchor.IsZero() {
		day = min(s.Anchor.Day, daysIn(y, m))
	}
	return time.Date(int(y), m, day, 0, 0, 0, 0, time.UTC).Unix() + s.tod()
}

// daysIn is the number of days of month m in year y.
func daysIn(y int64, m time.Month) int {
	return time.Date(int(y), m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
