package rlsconfig

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/calendar"
)

// TestCalendar: a rate_limit with calendar counts its unit in calendar
// windows of the zone (a fixed window), quarter included; the spec reads
// back as configured.
func TestCalendar(t *testing.T) {
	c := mustParse(t, `domain: d
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 100
      calendar:
        time_zone: Asia/Kathmandu
  - key: plan
    rate_limit:
      unit: quarter
      requests_per_unit: 5
      calendar: {time_zone: America/New_York, anchor: "2026-02-15T00:00:00"}
  - key: week
    rate_limit:
      unit: Week
      requests_per_unit: 5
      calendar: {week_start: sunday}
`)
	m, _ := c.Lookup("d", []Entry{{Key: "tenant", Value: "a"}})
	if m.Limit == nil || m.Limit.Calendar == nil || m.Limit.Unit != Hour || m.Limit.Algorithm != FixedWindow {
		t.Fatalf("tenant = %+v, want an hour counted in calendar windows", m.Limit)
	}
	kathmandu := time.FixedZone("+0545", 5*3600+45*60)
	start, end := m.Limit.Calendar.Window(time.Date(2026, 7, 1, 10, 20, 0, 0, kathmandu))
	if !start.Equal(time.Date(2026, 7, 1, 10, 0, 0, 0, kathmandu)) || !end.Equal(start.Add(time.Hour)) {
		t.Fatalf("window = %v to %v, want 10:00 to 11:00 Kathmandu time", start, end)
	}
	m, _ = c.Lookup("d", []Entry{{Key: "plan"}})
	if m.Limit == nil || m.Limit.Unit != Quarter || m.Limit.Calendar.Period != calendar.Quarter || m.Limit.Unit.String() != "quarter" {
		t.Fatalf("plan = %+v, want a quarter", m.Limit)
	}
	m, _ = c.Lookup("d", []Entry{{Key: "week"}})
	if m.Limit == nil || m.Limit.Calendar.WeekStart != time.Sunday || m.Limit.Calendar.Location != time.UTC {
		t.Fatalf("week = %+v, want weeks from Sunday in UTC", m.Limit)
	}
}

// TestCalendarRefusals: what a calendar cannot count is refused with the
// file, the line and the field.
func TestCalendarRefusals(t *testing.T) {
	rl := "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
	for _, tc := range []struct{ name, yaml, want string }{
		{"zone", rl + "      unit: day\n      requests_per_unit: 5\n      calendar:\n        time_zone: Mars/Olympus\n",
			`c.yaml:8: descriptors[0].rate_limit.calendar.time_zone: "Mars/Olympus" is not an IANA time zone name in Go's zone database`},
		{"local zone", rl + "      unit: day\n      requests_per_unit: 5\n      calendar: {time_zone: Local}\n",
			`c.yaml:7: descriptors[0].rate_limit.calendar.time_zone: "Local" depends on the host`},
		{"anchor", rl + "      unit: month\n      requests_per_unit: 5\n      calendar:\n        anchor: 2026-02-30\n",
			`c.yaml:8: descriptors[0].rate_limit.calendar.anchor: must be a local date-time`},
		{"week start", rl + "      unit: week\n      requests_per_unit: 5\n      calendar: {week_start: someday}\n",
			`c.yaml:7: descriptors[0].rate_limit.calendar.week_start: must be a weekday's name`},
		{"unknown field", rl + "      unit: week\n      requests_per_unit: 5\n      calendar: {zone: UTC}\n",
			`c.yaml:7: descriptors[0].rate_limit.calendar.zone: config error, unknown key 'zone'`},
		{"not a mapping", rl + "      unit: week\n      requests_per_unit: 5\n      calendar: UTC\n",
			`c.yaml:7: descriptors[0].rate_limit.calendar: want a mapping, got "UTC"`},
		{"second", rl + "      unit: second\n      requests_per_unit: 5\n      calendar: {}\n",
			`c.yaml:5: descriptors[0].rate_limit.unit: a calendar counts minute, hour, day, week, month, quarter or year, not 'second'`},
		{"quarter without a calendar", rl + "      unit: quarter\n      requests_per_unit: 5\n",
			`c.yaml:5: descriptors[0].rate_limit.unit: invalid rate limit unit 'quarter' (a quarter is counted only with calendar)`},
		{"unlimited", rl + "      unlimited: true\n      calendar: {}\n",
			`c.yaml:6: descriptors[0].rate_limit.calendar: an unlimited descriptor has no calendar`},
		{"token bucket", rl + "      unit: day\n      requests_per_unit: 5\n      algorithm: token_bucket\n      calendar: {}\n",
			`c.yaml:7: descriptors[0].rate_limit.algorithm: a calendar limit counts in fixed windows, not token_bucket`},
		{"burst", rl + "      unit: day\n      requests_per_unit: 5\n      burst: 9\n      calendar: {}\n",
			`c.yaml:7: descriptors[0].rate_limit.burst: a fixed window has no burst apart from requests_per_unit`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseOne(t, tc.yaml)
			var cerr *Error
			if err == nil || !errors.As(err, &cerr) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want %q", err, tc.want)
			}
		})
	}
}
