package engine

import (
	"encoding/binary"
	"strconv"
)

// SlotLinesWaiting counts the keys whose line for a slot, in shared data,
// still has a ticket in it (concurrency_line.go): none once nobody waits.
func (p *Plugin) SlotLinesWaiting() int {
	sd := p.host.SharedData()
	groups := p.lines.t.Groups()
	n := 0
	for g := range groups {
		v, _, err := sd.Get(p.lines.prefix + strconv.Itoa(groups) + ":" + strconv.Itoa(g))
		if err != nil {
			continue
		}
		const size = 8 + lineLen
		for i := 0; i+size <= len(v); i += size {
			r := decodeLine(v[i+8 : i+size])
			if binary.LittleEndian.Uint64(v[i:]) != 0 && r.serving < r.next {
				n++
			}
		}
	}
	return n
}

// LineLease is lineLease, for tests.
const LineLease = lineLease
