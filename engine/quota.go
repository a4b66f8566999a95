package engine

import (
	"errors"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

// checkClusterQuota refuses a quota with scope cluster, which config
// accepts: this engine does not carry a quota's period to the limit service
// yet, and a cluster bucket with no rate and no period would never refill.
func checkClusterQuota(cfg *config.Config) error {
	for i := range cfg.Rules {
		if r := &cfg.Rules[i]; r.Limit.Quota() && r.Scope == config.ScopeCluster {
			return &config.Error{Path: "rules[" + strconv.Itoa(i) + "].scope",
				Err: errors.New(`a quota is local only in this build: "cluster" needs the limit service's calendar windows`)}
		}
	}
	return nil
}
