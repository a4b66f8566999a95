package store

// Groups is the number of shared-data keys the table may create (a test-only
// view).
func (t *Table) Groups() int { return int(t.groups) }
