// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package elftest makes tiny ELF files for tests of code that inspects
// executables and shared objects (oci.BuildExecutable, oci.BuildModule):
// valid for debug/elf, never run. It also reads what a built native module
// needs from the C library (HighestGlibc) and the floor the docs state
// (DocumentedGlibcFloor), for the tests that compare the two.
package elftest

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
)

// Fake returns a minimal ELF64 executable for machine: a header and one
// PT_LOAD segment, plus a PT_INTERP segment (a dynamically linked program)
// when interp is set. Enough for debug/elf; it does not need to run.
func Fake(machine elf.Machine, interp bool, payload string) []byte {
	return fake(elf.ET_EXEC, machine, interp, payload)
}

// FakeShared is Fake for a shared object (ELF type ET_DYN, no interpreter),
// the shape of a native module.
func FakeShared(machine elf.Machine, payload string) []byte {
	return fake(elf.ET_DYN, machine, false, payload)
}

func fake(typ elf.Type, machine elf.Machine, interp bool, payload string) []byte {
	type phdr struct {
		Type, Flags                             uint32
		Off, Vaddr, Paddr, Filesz, Memsz, Align uint64
	}
	progs := []phdr{{Type: uint32(elf.PT_LOAD), Flags: 5, Vaddr: 0x400000, Paddr: 0x400000, Align: 0x1000}}
	interpPath := "/lib64/ld-linux-x86-64.so.2\x00"
	if interp {
		progs = append(progs, phdr{Type: uint32(elf.PT_INTERP), Flags: 4, Filesz: uint64(len(interpPath)), Memsz: uint64(len(interpPath)), Align: 1})
	}
	dataOff := uint64(64 + 56*len(progs))
	for i := range progs {
		progs[i].Off = dataOff
		if progs[i].Type == uint32(elf.PT_LOAD) {
			progs[i].Off, progs[i].Filesz, progs[i].Memsz = 0, dataOff+uint64(len(payload)), dataOff+uint64(len(payload))
		}
	}
	var b bytes.Buffer
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	le := binary.LittleEndian
	_ = binary.Write(&b, le, struct {
		Type, Machine                                        uint16
		Version                                              uint32
		Entry, Phoff, Shoff                                  uint64
		Flags                                                uint32
		Ehsize, Phentsize, Phnum, Shentsize, Shnum, Shstrndx uint16
	}{Type: uint16(typ), Machine: uint16(machine), Version: 1, Entry: 0x400000 + dataOff, Phoff: 64,
		Ehsize: 64, Phentsize: 56, Phnum: uint16(len(progs)), Shentsize: 64})
	for _, p := range progs {
		_ = binary.Write(&b, le, p)
	}
	if interp {
		b.WriteString(interpPath)
	} else {
		b.WriteString(payload)
	}
	return b.Bytes()
}
