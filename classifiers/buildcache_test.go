package classifiers

import "testing"

// A build that panics leaves nothing behind: the next call for its key
// builds again rather than waiting for ever or getting a zero value.
func TestBuildCacheForgetsAPanickedBuild(t *testing.T) {
	c := newBuildCache[int](4)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the build's panic was swallowed")
			}
		}()
		c.get("k", func() int { panic("build failed") })
	}()
	if v := c.get("k", func() int { return 7 }); v != 7 {
		t.Fatalf("after a panicked build: %d, want 7", v)
	}
	if v := c.get("k", func() int { return 8 }); v != 7 {
		t.Fatalf("built again: %d, want the kept 7", v)
	}
	if c.len() != 1 || len(c.building) != 0 {
		t.Fatalf("%d kept, %d building", c.len(), len(c.building))
	}
}
