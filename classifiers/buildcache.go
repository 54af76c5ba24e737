package classifiers

import "sync"

// buildCache keeps values that are costly to build (compiled label sets,
// attribute poles, a name's neighbours) by key, and builds each once even
// when many calls ask for it at the same moment: 20 calls at once with a
// new set of 200 labels compiled it 20 times, seconds of CPU, where one
// compile serves them all. A cache holding limit values is emptied before
// it takes another, which bounds its memory without bookkeeping.
type buildCache[V any] struct {
	mu       sync.Mutex
	done     map[string]V
	building map[string]*pendingBuild[V]
	limit    int
}

// pendingBuild is a value being built; done is closed when it is, and
// built says whether v holds it (false when its build panicked).
type pendingBuild[V any] struct {
	done  chan struct{}
	v     V
	built bool
}

func newBuildCache[V any](limit int) *buildCache[V] {
	return &buildCache[V]{done: make(map[string]V), building: make(map[string]*pendingBuild[V]), limit: limit}
}

// get returns the value of key, made by build (without c's lock held, so
// build may use other caches) when c has none; a call that finds key
// being built waits for that build instead of starting its own.
func (c *buildCache[V]) get(key string, build func() V) V {
	c.mu.Lock()
	if v, ok := c.done[key]; ok {
		c.mu.Unlock()
		return v
	}
	if p, ok := c.building[key]; ok {
		c.mu.Unlock()
		<-p.done
		if p.built {
			return p.v
		}
		return c.get(key, build) // its build panicked: build it here
	}
	p := &pendingBuild[V]{done: make(chan struct{})}
	c.building[key] = p
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.building, key)
		if p.built {
			if len(c.done) >= c.limit {
				clear(c.done)
			}
			c.done[key] = p.v
		}
		c.mu.Unlock()
		close(p.done)
	}()
	p.v = build()
	p.built = true
	return p.v
}

// len is how many values c holds, built.
func (c *buildCache[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.done)
}
