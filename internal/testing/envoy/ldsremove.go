package envoy

import (
	"os"
	"path/filepath"
	"strconv"
)

// WriteLDSEmpty replaces the listener file (Options.LDS) with version and
// no listener: Envoy removes its listeners, draining their connections
// (--drain-time-s). WriteLDS with a later version brings them back.
func (p *Process) WriteLDSEmpty(version string) error {
	text := "version_info: " + strconv.Quote(version) + "\nresources: []\n"
	tmp := filepath.Join(p.dir, "lds.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(p.data.LDSDir, "lds.yaml"))
}
