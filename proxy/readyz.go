package proxy

import (
	"encoding/json"
	"net/http"
)

// ReadyzBody answers GET /readyz while the gateway takes and bills calls.
const ReadyzBody = `{"status":"ready"}`

var readyzBody = []byte(ReadyzBody) // Readiness's, never written to

// The phases of a server, for /readyz: before Serve its listener is
// bound (serve binds it first) but nothing answers on it, and from
// Shutdown on it takes no new connection.
const (
	phaseStarting int32 = iota
	phaseServing
	phaseDraining
)

// billingRefusal is what a Recorder that can refuse events says of it
// (meter.Publisher: its outbox full, or unable to write).
type billingRefusal interface {
	Refusal() string
}

// Readiness answers GET /readyz, on the public listener and on
// server.metrics_listen: 200 ReadyzBody while the gateway can take and
// bill calls, else 503 with the reasons, each short and fixed. It reads
// atomics only, so a probe costs nothing and waits on nothing. body is
// not to be written to.
//
// Left out on purpose: the upstreams' health, since every gateway of a
// deployment sees the same upstreams, and all of them would leave their
// load balancer's rotation at once, their clients getting connection
// errors in place of the gateway's 503 that says which upstream failed;
// and NATS, since the outbox holds the usage events while it is down,
// which is what the outbox is for. Only the outbox refusing them is a
// reason.
func (s *Server) Readiness() (status int, body []byte) {
	var reasons []string
	switch s.phase.Load() {
	case phaseStarting:
		reasons = append(reasons, "starting: not serving calls yet")
	case phaseDraining:
		reasons = append(reasons, "draining: shutting down")
	}
	if s.billing != nil {
		if why := s.billing.Refusal(); why != "" {
			reasons = append(reasons, "billing outbox refuses events: "+why)
		}
	}
	if len(reasons) == 0 {
		return http.StatusOK, readyzBody
	}
	body, _ = json.Marshal(struct {
		Status  string   `json:"status"`
		Reasons []string `json:"reasons"`
	}{"not_ready", reasons})
	return http.StatusServiceUnavailable, body
}
