package calendar

import (
	"strings"
	"testing"
	"time"
)

// FuzzWindow checks the properties at any instant from 1900 to 2200 in any of
// a set of zones (among them ones that skipped a whole day or change by half
// an hour), any period and any anchor: start <= now < end, one window from
// its start and its last nanosecond, neighbours meeting it with no gap or
// overlap.
func FuzzWindow(f *testing.F) {
	fuzzZones := append([]string{"UTC", "Pacific/Apia", "Australia/Lord_Howe", "Antarctica/Troll", "America/Santiago",
		"Asia/Tehran", "Africa/Casablanca", "Europe/Dublin"}, zones...)
	f.Add(int64(1772953200), uint8(1), uint8(2), int64(0), uint8(0))
	f.Add(int64(1793512800), uint8(0), uint8(3), int64(1800), uint8(1))
	f.Add(int64(1325239200), uint8(1), uint8(3), int64(0), uint8(1)) // Apia skips 2011-12-30
	f.Add(int64(1838419200), uint8(4), uint8(5), int64(86399), uint8(12))
	f.Add(int64(-2208988800), uint8(6), uint8(11), int64(30*86400+3600), uint8(5))
	f.Fuzz(func(t *testing.T, sec int64, period, zone uint8, phase int64, weekStart uint8) {
		lo, hi := time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
		if sec < lo || sec > hi {
			sec = lo + (sec%(hi-lo)+(hi-lo))%(hi-lo)
		}
		s, err := Parse(periodNames[Minute+Period(period%7)], fuzzZones[int(zone)%len(fuzzZones)], strings.ToLower(time.Weekday(weekStart%7).String()), "")
		if err != nil {
			t.Fatal(err)
		}
		if phase != 0 {
			// An anchor anywhere in 2026..2029, its weekday the week start.
			a := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration((phase%(4*365*86400)+4*365*86400)%(4*365*86400)) * time.Second)
			s.Anchor = DateTime{Year: a.Year(), Month: a.Month(), Day: a.Day(), Hour: a.Hour(), Minute: a.Minute(), Second: a.Second()}
			if s.Period == Week {
				s.WeekStart = a.Weekday()
			}
		}
		checkWindow(t, s, time.Unix(sec, int64(weekStart)*3_000_000).UTC())
	})
}
