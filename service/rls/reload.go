package rls

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"strings"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// DefaultPoll is how often a Watcher reads the configuration again.
const DefaultPoll = 2 * time.Second

// Watcher keeps a Server's configuration in step with its files: Check reads
// them, and when their names or contents changed and then read the same on
// the next poll, parses them and applies the result, or, when they are
// refused, logs the error, counts it (limitd_rls_config_loads_total{result=
// "error"}) and keeps the previous configuration serving. A refused
// configuration is not tried again until the files change once more.
//
// A change is applied only once it has stopped: files that differ from
// those of the previous poll are read again at the next, so a file written
// slowly in place is not loaded half-written (unless its writer pauses for
// a whole poll). A file renamed into place is whole when it appears and is
// loaded by the poll after the one that first sees it. Only the first
// load, at start, applies what one read finds.
//
// Only regular files are read (rlsconfig.ReadFiles): another entry of the
// folder named like a configuration file (a FIFO, a socket) is skipped, and
// logged each time the set of such entries changes.
//
// The files are polled, not watched through inotify: a poll sees every way a
// file can change (edited in place, replaced by a rename, a Kubernetes
// ConfigMap's symbolic links swapped, a folder's files added or removed)
// with one mechanism and no event to miss, and the tests call Check instead
// of waiting for an event. Reading a few small files every DefaultPoll costs
// nothing next to the service's calls.
type Watcher struct {
	path    string
	server  *Server
	log     *slog.Logger
	sum     [sha256.Size]byte // of the files last applied or refused
	loaded  bool
	seen    [sha256.Size]byte // of the files the previous poll read
	seenOK  bool              // the previous poll read the files
	skipped string            // the entries skipped, as last logged
}

// NewWatcher loads the configuration at path into s: an error when it is
// refused (the service does not start on a bad file).
func NewWatcher(path string, s *Server, log *slog.Logger) (*Watcher, error) {
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{path: path, server: s, log: log}
	if _, err := w.Check(); err != nil {
		return nil, err
	}
	return w, nil
}

// Check reads the configuration files and applies them when they changed
// and read the same on the previous poll. It reports whether a new
// configuration was applied, and the error of one that was refused.
func (w *Watcher) Check() (bool, error) {
	files, skipped, err := rlsconfig.ReadFiles(w.path)
	if err != nil {
		w.seenOK = false
		return false, w.refuse(err)
	}
	if s := strings.Join(skipped, ","); s != w.skipped {
		w.skipped = s
		if s != "" {
			w.log.Warn("rate limit service: configuration entries skipped: not regular files", "path", w.path, "skipped", skipped)
		}
	}
	sum := rlsconfig.Digest(files)
	settled := w.seenOK && sum == w.seen
	w.seen, w.seenOK = sum, true
	if w.loaded && (sum == w.sum || !settled) {
		return false, nil
	}
	w.sum, w.loaded = sum, true
	c, err := rlsconfig.Parse(files)
	if err != nil {
		return false, w.refuse(err)
	}
	w.server.SetConfig(c)
	w.server.metrics.ConfigLoaded(true)
	w.log.Info("rate limit service: configuration loaded", "path", w.path, "files", len(files), "domains", c.Domains())
	return true, nil
}

func (w *Watcher) refuse(err error) error {
	w.server.metrics.ConfigLoaded(false)
	if w.server.Config() != nil {
		w.log.Error("rate limit service: configuration refused; the previous one keeps serving", "path", w.path, "err", err)
	}
	return err
}

// Run checks the files every period until ctx ends.
func (w *Watcher) Run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = w.Check()
		}
	}
}
