package proxy_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/proxy"
)

// moduleYAML is a gateway whose upstream nobody calls; %s is the grace,
// so two configs differ.
const moduleYAML = `
server:
  listen: 127.0.0.1:0
  data_dir: /nonexistent
  demo_credit_usd: "0"
billing:
  grace_usd: "%s"
upstreams:
  - name: local
    base_url: http://127.0.0.1:1/v1
models:
  - id: small
    upstream: local
    upstream_model: proxytest-small
    context_length: 32768
    max_output_length: 4096
`

// lifecycle records what the server does with a module.
type lifecycle struct {
	mu     sync.Mutex
	events []string
	fail   bool // the next New fails
}

func (l *lifecycle) log(format string, args ...any) {
	l.mu.Lock()
	l.events = append(l.events, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *lifecycle) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.events, ", ")
}

// module serves GET /test/grace with the grace of the World it was
// provisioned for, so a test sees which provisioning answers.
func (l *lifecycle) module() proxy.Module {
	return proxy.Module{
		ID: "test",
		Start: func(h proxy.Host) (func(), error) {
			l.log("start")
			return func() { l.log("stop, context ended: %v", h.Context().Err() != nil) }, nil
		},
		New: func(_ proxy.Host, w *proxy.World) (proxy.Provisioned, error) {
			grace := w.Config.Billing.GraceUSD
			l.log("new %s", grace)
			if l.fail {
				return proxy.Provisioned{Cleanup: func() { l.log("cleanup %s", grace) }}, errors.New("refusing " + grace)
			}
			return proxy.Provisioned{
				Routes: []proxy.Route{{Method: "GET", Path: "/test/grace", Auth: proxy.AuthNone,
					Handler: func(ctx *fasthttp.RequestCtx, _ *proxy.Call) { ctx.SetBodyString(grace) }}},
				Cleanup: func() { l.log("cleanup %s", grace) },
			}, nil
		},
	}
}

// A reload provisions the modules for the new World and cleans up the old
// provisioning once the new one serves; a module that fails to provision
// refuses the reload, and the old routes keep serving. Close cleans up,
// then stops what Start began.
func TestModuleLifecycle(t *testing.T) {
	l := &lifecycle{}
	parse := func(grace string) *config.Config {
		t.Helper()
		cfg, err := config.Parse("gateway.yaml", []byte(fmt.Sprintf(moduleYAML, grace)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	gw, err := proxy.New(parse("0.50"), proxy.Options{Recorder: meter.NewMemory(nil), Modules: []proxy.Module{l.module()}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	url := gatewaytest.Serve(t, gw)
	get := func() string {
		t.Helper()
		resp, err := http.Get(url + "/test/grace")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	if got := get(); got != "200 0.50" {
		t.Fatalf("first provisioning answers %q", got)
	}
	if err := gw.Apply(parse("1.00")); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != "200 1.00" {
		t.Fatalf("after a reload: %q", got)
	}
	l.fail = true
	if err := gw.Apply(parse("2.00")); err == nil || !strings.Contains(err.Error(), "module test: refusing 2.00") {
		t.Fatalf("a failing module's reload: %v", err)
	}
	if got := get(); got != "200 1.00" || gw.World().Config.Billing.GraceUSD != "1.00" {
		t.Fatalf("after a refused reload: %q, grace %s in force", got, gw.World().Config.Billing.GraceUSD)
	}
	gw.Close()
	if got := get(); !strings.HasPrefix(got, "404 ") {
		t.Fatalf("after Close: %q", got)
	}
	want := "start, new 0.50, new 1.00, cleanup 0.50, new 2.00, cleanup 2.00, cleanup 1.00, stop, context ended: true"
	if got := l.String(); got != want {
		t.Fatalf("lifecycle:\n got %s\nwant %s", got, want)
	}
}

// Two modules cannot serve one route: the server refuses to start.
func TestModuleRouteClaimedTwice(t *testing.T) {
	cfg, err := config.Parse("gateway.yaml", []byte(fmt.Sprintf(moduleYAML, "0")))
	if err != nil {
		t.Fatal(err)
	}
	a, b := (&lifecycle{}).module(), (&lifecycle{}).module()
	b.ID = "other"
	_, err = proxy.New(cfg, proxy.Options{Recorder: meter.NewMemory(nil), Modules: []proxy.Module{a, b}})
	if err == nil || !strings.Contains(err.Error(), "module other: route GET /test/grace is also module test's") {
		t.Fatalf("two modules, one route: %v", err)
	}
}

// A server that fails to start leaves no upstream pool behind: its World
// is never served, so its pools are retired (no new calls, no idle
// connections kept) rather than leaked with the server never returned.
func TestNewRetiresPoolsWhenAModuleFails(t *testing.T) {
	cfg, err := config.Parse("gateway.yaml", []byte(fmt.Sprintf(moduleYAML, "0")))
	if err != nil {
		t.Fatal(err)
	}
	for _, stage := range []string{"start", "provision"} {
		var seen *proxy.World
		m := proxy.Module{ID: "failing"}
		if stage == "start" {
			m.Start = func(h proxy.Host) (func(), error) {
				seen = h.World()
				return nil, errors.New("refusing to start")
			}
		} else {
			m.New = func(_ proxy.Host, w *proxy.World) (proxy.Provisioned, error) {
				seen = w
				return proxy.Provisioned{}, errors.New("refusing to provision")
			}
		}
		if _, err := proxy.New(cfg, proxy.Options{Recorder: meter.NewMemory(nil), Modules: []proxy.Module{m}}); err == nil {
			t.Fatalf("%s: New succeeded with a failing module", stage)
		}
		if seen == nil || !proxy.UpstreamsRetired(seen) {
			t.Errorf("%s: the upstreams of the failed server are not retired", stage)
		}
	}
}

// A method no route of a path serves is a 405 whose Allow names each
// method once: an exact route and a "/*" one over the same path made it
// "GET, GET, POST, POST". A module that sets MethodNotAllowed answers it
// in its own form (the console's HTML); the others get the API's JSON.
func TestModuleRouteRefusesOtherMethodsWithEachAllowedOnce(t *testing.T) {
	cfg, err := config.Parse("gateway.yaml", []byte(fmt.Sprintf(moduleYAML, "0")))
	if err != nil {
		t.Fatal(err)
	}
	ok := func(ctx *fasthttp.RequestCtx, _ *proxy.Call) { ctx.SetBodyString("ok") }
	page := func(ctx *fasthttp.RequestCtx, allow string) {
		ctx.SetStatusCode(405)
		ctx.SetContentType("text/html; charset=utf-8")
		ctx.SetBodyString("<p>use " + allow + "</p>")
	}
	var routes []proxy.Route
	for _, method := range []string{"GET", "POST"} {
		for _, path := range []string{"/api/thing", "/api/*"} {
			routes = append(routes, proxy.Route{Method: method, Path: path, Auth: proxy.AuthNone, Handler: ok})
		}
		for _, path := range []string{"/pages/thing", "/pages/*"} {
			routes = append(routes, proxy.Route{Method: method, Path: path, Auth: proxy.AuthNone, Handler: ok, MethodNotAllowed: page})
		}
	}
	m := proxy.Module{ID: "test", New: func(proxy.Host, *proxy.World) (proxy.Provisioned, error) {
		return proxy.Provisioned{Routes: routes}, nil
	}}
	gw, err := proxy.New(cfg, proxy.Options{Recorder: meter.NewMemory(nil), Modules: []proxy.Module{m}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	url := gatewaytest.Serve(t, gw)
	for _, tc := range []struct {
		method, path, contentType, body string
	}{
		{"PUT", "/api/thing", "application/json", `"code":"method_not_allowed"`},
		{"DELETE", "/api/other", "application/json", `"code":"method_not_allowed"`},
		{"PUT", "/pages/thing", "text/html; charset=utf-8", "<p>use GET, HEAD, POST</p>"},
		{"DELETE", "/pages/other", "text/html; charset=utf-8", "<p>use GET, HEAD, POST</p>"},
	} {
		req, _ := http.NewRequest(tc.method, url+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD, POST" ||
			resp.Header.Get("Content-Type") != tc.contentType || !strings.Contains(string(body), tc.body) {
			t.Errorf("%s %s: %d, Allow %q, %s %s; want 405, Allow \"GET, HEAD, POST\", %s with %s",
				tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), resp.Header.Get("Content-Type"), body, tc.contentType, tc.body)
		}
	}
}
