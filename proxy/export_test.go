package proxy

// UpstreamsRetired reports whether every upstream of w is retired, for
// the tests of package proxy_test.
func UpstreamsRetired(w *World) bool {
	for _, up := range w.upstreams {
		if !up.retired.Load() {
			return false
		}
	}
	return len(w.upstreams) > 0
}
