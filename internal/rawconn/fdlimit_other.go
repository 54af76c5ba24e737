//go:build !unix

package rawconn

// DescriptorLimit is unknown off Unix.
func DescriptorLimit() (uint64, bool) { return 0, false }
