// Package logtext picks lines out of what a process printed, for test
// failure messages: the last lines of a log, the lines naming a metric.
package logtext

import "strings"

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Grep returns the lines of text that contain substr, leaving out comment
// lines (starting with #, as Prometheus's HELP and TYPE lines do).
func Grep(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
