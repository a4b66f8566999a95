package engine

import (
	"errors"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

// checkClusterQuota refuses a quota with scope cluster and "sync":
// "lease", which config accepts: a cluster quota's calls carry its period
// (periodOf), but this engine's leases do not follow a period's boundary
// yet (a lease taken before it would be spent after it).
func checkClusterQuota(cfg *config.Config) error {
	for i := range cfg.Rules {
		if r := &cfg.Rules[i]; r.Limit.Quota() && r.Scope == config.ScopeCluster && r.Sync == config.SyncLease {
			return &config.Error{Path: "rules[" + strconv.Itoa(i) + "].sync",
				Err: errors.New(`a cluster quota is decided per request in this build: "lease" does not follow its period's boundary yet`)}
		}
	}
	return nil
}
