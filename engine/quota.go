package engine

// leasePeriod is the period of ru's lease at now (Unix ns): for a quota,
// the end of the calendar period that holds now in Unix ms, as its lease
// calls carry it (periodOf); 0 for a token bucket. A lease's tokens belong
// to the period its grant was answered for (lease.Record.Period), and a
// request spends only the tokens of its own period.
func leasePeriod(ru *rule, now int64) int64 {
	return periodOf(ru, now).PeriodEndMs
}
