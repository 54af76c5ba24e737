package proxy

import (
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// worldServing is a World whose models are served by the upstreams named
// in pools (model -> members), enough for forgetRetired.
func worldServing(pools map[string][]string) *World {
	w := &World{pools: map[string]*pool{}}
	for model, members := range pools {
		p := &pool{}
		for _, name := range members {
			p.members = append(p.members, poolMember{up: &upstream{cfg: config.Upstream{Name: name}}, weight: 1})
		}
		w.pools[model] = p
	}
	return w
}

func (m *callMetrics) keys() []seriesKey {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var keys []seriesKey
	for k := range m.series {
		keys = append(keys, k)
	}
	return keys
}

// A call that was running on the config a reload replaced may count
// after the reload dropped its series, and make it again: the next reload
// drops it, and no reload drops the series of a plugin's engine, which is
// no catalog model.
func TestMetricsForgetSeriesACallInFlightMadeAgainAtTheNextReload(t *testing.T) {
	const chat = "/v1/chat/completions"
	m := newCallMetrics()
	first := worldServing(map[string][]string{"small": {"gpu-1-a", "gpu-1-b"}})
	m.observe("small", "gpu-1-a", chat, 200, time.Millisecond)
	m.observe("small", "", chat, 503, time.Millisecond)
	m.observe("semantic", "", "/v1/classify", 200, time.Millisecond)
	m.observe("", "", "/v1/custom", 500, time.Millisecond)

	second := worldServing(map[string][]string{"small": {"gpu-2-a", "gpu-2-b"}})
	m.forgetRetired(first, second)
	m.observe("small", "gpu-1-b", chat, 200, time.Millisecond) // in flight on first
	m.observe("large", "", chat, 503, time.Millisecond)        // a model first had not either

	third := worldServing(map[string][]string{"small": {"gpu-3-a"}})
	m.forgetRetired(second, third)
	want := []seriesKey{{"", "", "/v1/custom", 500}, {"semantic", "", "/v1/classify", 200}, {"small", "", chat, 503}}
	got := m.keys()
	slices.SortFunc(got, cmpSeriesKeys)
	if !slices.Equal(got, want) {
		t.Fatalf("series after two reloads: %v, want %v", got, want)
	}
}
