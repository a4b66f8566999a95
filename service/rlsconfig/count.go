package rlsconfig

// Count is how many descriptors c has (every level of every domain's tree)
// and how many of them have a limit (unlimited ones included).
func (c *Config) Count() (descriptors, limits int) {
	var walk func(n *node)
	walk = func(n *node) {
		for _, ch := range n.children {
			descriptors++
			if ch.limit != nil {
				limits++
			}
			walk(ch)
		}
	}
	for _, root := range c.domains {
		walk(root)
	}
	return descriptors, limits
}
