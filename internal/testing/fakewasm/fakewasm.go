// Package fakewasm makes tiny valid WebAssembly modules for the tests of
// what packages the plugin (OCI images), where the bytes only need to be a
// module and differ.
package fakewasm

// Module is a valid, tiny WebAssembly module: the header and one custom
// section named "fake" carrying payload (at most 122 bytes).
func Module(payload string) []byte {
	body := append([]byte{4}, "fake"+payload...)
	return append([]byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00, 0x00, byte(len(body))}, body...)
}
