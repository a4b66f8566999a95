// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Command installmodule is the entrypoint of the native module's image (`make
// oci-native`): run as an init container, it copies the module the image
// holds (/libtokenbucket.so) into a folder shared with the proxy, an
// emptyDir that the proxy mounts. That is the way to load the module where
// the container runtime mounts image volumes noexec, from which the C
// library cannot map a shared object's code (docs/compatibility.md,
// "Loading it from an image").
//
//	installmodule [-src /libtokenbucket.so] /module
//
// The copy is written to a temporary file in the folder, synced, made
// readable and executable (0755) and renamed into place, so the proxy never
// sees a partial file; then it is read back and compared with the source
// by sha256. It prints the file written and its sha256.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// maxModule bounds the module read into memory (it is about 4 MB).
const maxModule = 256 << 20

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "installmodule:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("installmodule", flag.ContinueOnError)
	src := fs.String("src", "/libtokenbucket.so", "the module to copy")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("want one argument: the folder to copy the module into")
	}
	dir := fs.Arg(0)
	b, err := readBounded(*src)
	if err != nil {
		return err
	}
	dst := filepath.Join(dir, filepath.Base(*src))
	tmp, err := os.CreateTemp(dir, ".installmodule-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(b)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr, os.Chmod(tmp.Name(), 0o755)); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	back, err := readBounded(dst)
	if err != nil {
		return err
	}
	want, got := sha256.Sum256(b), sha256.Sum256(back)
	if !bytes.Equal(want[:], got[:]) {
		return fmt.Errorf("%s: sha256 %x after the copy, %x in %s", dst, got, want, *src)
	}
	fmt.Fprintf(stdout, "installed %s (%d bytes, sha256:%s)\n", dst, len(b), hex.EncodeToString(want[:]))
	return nil
}

// readBounded reads the file at path, refusing one above maxModule bytes.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxModule+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxModule {
		return nil, fmt.Errorf("%s: more than %d bytes", path, maxModule)
	}
	return b, nil
}
