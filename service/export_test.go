package service

// Test-only views of the stores.

// ScriptSHA returns the SHA1 of the decision script.
func (s *RedisStore) ScriptSHA() string { return s.script.Hash() }

// Len returns the number of buckets held.
func (m *MemoryStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.buckets)
}
