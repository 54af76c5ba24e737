package proxy

import (
	"context"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

// Module is a part of the gateway that proxy does not name: the plugins,
// the web console. The caller of New lists the modules of a server in
// Options.Modules (cmd/tollgate builds the list), so no module is global and
// two servers in one process share nothing.
//
// The lifecycle follows Caddy's provision and cleanup. Start, when set,
// runs once, when the server is built, for what must outlive
// configuration reloads (a batch worker in the middle of a job); its stop
// runs in Server.Close. New provisions the module for one configuration:
// proxy.New calls it after every Start, and Server.Apply calls it again
// with the new World on each reload, swaps the new routes in and then
// cleans up the old ones. When any module fails to provision, the reload
// is refused and the old routes keep serving.
type Module struct {
	// ID names the module in errors, such as a route two modules claim.
	ID    string
	Start func(h Host) (stop func(), err error)
	// New must not keep w beyond the call: requests carry their own World
	// (Call.World), and h.World() is the configuration in force.
	New func(h Host, w *World) (Provisioned, error)
}

// Provisioned is what a module contributes to one configuration.
type Provisioned struct {
	Routes []Route
	// AdminRoutes are served under /admin/v1/ behind the admin token, by
	// the Options.Admin handler (package admin).
	AdminRoutes []AdminRoute
	// Cleanup, when set, runs once the routes no longer serve new calls:
	// after a reload swapped in the next set, or in Server.Close.
	Cleanup func()
}

// Host is what a module gets from the server it belongs to. The server
// outlives reloads, so a module may keep its Host.
type Host interface {
	// Context ends when Server.Close is called.
	Context() context.Context
	// World is the configuration in force when called.
	World() *World
	// Record hands a usage event to the meter; it never blocks.
	Record(ev *meter.Event)
	// CanPay says whether account can spend cost and stay within the
	// grace buffer, with its balance as this gateway last saw it.
	CanPay(account string, cost money.Nanos) (balance money.Nanos, ok bool)
	// Debited is the sum of account's debits as this gateway last saw it.
	Debited(account string) (money.Nanos, bool)
	// NoteCharge counts a cost billed through another meter than Record's
	// (a batch job's) against the balance CanPay and admission read,
	// until the account's debits show it.
	NoteCharge(account string, cost money.Nanos)
	Logf(format string, args ...any)
}

// AdminRoute is one admin API call a module adds. Path is relative to
// /admin/v1/, segments split by "/"; a segment "{}" matches any one
// segment. A route that shadows one of the admin API's own is never
// reached.
type AdminRoute struct {
	Method string
	Path   string
	// Query names the query parameters Handle reads, each taken once:
	// any other, or one given twice, is a 400 naming it before Handle
	// runs (a typo such as "limt=5" is not answered as if it were read).
	Query []string
	// Handle answers a call: body is written as JSON with status, an
	// error as the error envelope.
	Handle func(call *AdminCall) (status int, body any, err error)
}

// AdminCall is one admin call being served.
type AdminCall struct {
	// Ctx bounds the call's store operations.
	Ctx  context.Context
	HTTP *fasthttp.RequestCtx
	// World is the configuration the call runs under.
	World *World
	// Args are the path segments the route's "{}" matched, in order.
	Args []string
}

// moduleSet is the routes of one provisioning of every module.
type moduleSet struct {
	routes   map[routeKey]Route
	admin    []AdminRoute
	cleanups []func()
}

// provision runs every module's New for w. On error the modules
// provisioned so far are cleaned up and nothing else changes.
func (s *Server) provision(w *World) (*moduleSet, error) {
	set := &moduleSet{routes: map[routeKey]Route{}}
	owner := map[routeKey]string{}
	adminOwner := map[routeKey]string{}
	for _, m := range s.modules {
		if m.New == nil {
			continue
		}
		p, err := m.New(s, w)
		if p.Cleanup != nil {
			set.cleanups = append(set.cleanups, p.Cleanup)
		}
		if err == nil {
			err = set.add(m.ID, p, owner, adminOwner)
		}
		if err != nil {
			set.cleanup()
			return nil, fmt.Errorf("module %s: %w", m.ID, err)
		}
	}
	return set, nil
}

// add takes p's routes into the set; a route another module (or this one)
// already serves is an error.
func (set *moduleSet) add(id string, p Provisioned, owner, adminOwner map[routeKey]string) error {
	for _, r := range p.Routes {
		k := routeKey{r.Method, r.Path}
		if prev, dup := owner[k]; dup {
			return fmt.Errorf("route %s %s is also module %s's", r.Method, r.Path, prev)
		}
		owner[k] = id
		set.routes[k] = r
	}
	for _, r := range p.AdminRoutes {
		k := routeKey{r.Method, r.Path}
		if prev, dup := adminOwner[k]; dup {
			return fmt.Errorf("admin route %s %s is also module %s's", r.Method, r.Path, prev)
		}
		adminOwner[k] = id
		set.admin = append(set.admin, r)
	}
	return nil
}

func (set *moduleSet) cleanup() {
	for i := len(set.cleanups) - 1; i >= 0; i-- {
		set.cleanups[i]()
	}
}

// start runs the modules' Start hooks; on error it stops those started.
func (s *Server) start() error {
	for _, m := range s.modules {
		if m.Start == nil {
			continue
		}
		stop, err := m.Start(s)
		if err != nil {
			s.stopModules()
			return fmt.Errorf("module %s: %w", m.ID, err)
		}
		if stop != nil {
			s.stops = append(s.stops, stop)
		}
	}
	return nil
}

// stopModules ends the server's context and runs the stops of Start, the
// last started first.
func (s *Server) stopModules() {
	s.cancel()
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
	s.stops = nil
}

// Close cleans up the modules' routes and stops what their Start began
// (a batch worker stops its jobs, which resume from their checkpoints
// elsewhere). Call it after Shutdown, before closing what the modules use
// (NATS, object storage, the recorder). The server serves no module's
// route afterwards, and Apply refuses every config. Calling it again does
// nothing.
func (s *Server) Close() {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	if set := s.mods.Swap(&moduleSet{}); set != nil {
		set.cleanup()
	}
	s.stopModules()
}

// Context ends when Close is called; modules use it for their work.
func (s *Server) Context() context.Context { return s.ctx }

// Logf writes to the server's log.
func (s *Server) Logf(format string, args ...any) { s.logf(format, args...) }
