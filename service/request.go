package service

import "time"

// DefaultLedgerWindow is the default ledger window of the stores: what a
// lease grants or a decision reserves can be given back (by a lease's return,
// or a charge's refund) for at least one window and at most two.
const DefaultLedgerWindow = time.Minute
